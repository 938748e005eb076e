"""``POST /v1/messages`` (Anthropic's Messages API) through the real ``anthropic`` SDK against
the simulator: whole and streamed, thinking off and on for visible and hidden keys, tool use
over two turns (what the engine received), thinking blocks handed back (tampered, redacted),
Anthropic's error shapes, Bearer auth, the rate limit, a mid-stream drop and the ledger."""

from __future__ import annotations

from collections import deque
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from gateway.side.sim.app import SimApp, SimConfig
from tests.e2e.conftest import RecordingSink, Stack
from tests.e2e.test_responses import expected

MODEL = "deepseek-r1"
THINK = {"type": "enabled", "budget_tokens": 1024}
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}  # fmt: skip
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}  # fmt: skip
HEADERS = {"anthropic-version": "2023-06-01"}


@pytest.fixture
async def messages(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    return stack, sink


def sdk(stack: Stack, key: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys[key], max_retries=0)


def received(stack: Stack) -> deque[dict[str, Any]]:
    """The last bodies the engine received."""
    assert isinstance(stack.sim, SimApp)
    return stack.sim.sim.received


def ask(content: Any = "Why?", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2048,
            "messages": [{"role": "user", "content": content}], **extra}  # fmt: skip


def text_of(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def kinds(message: Any) -> list[str]:
    return [b.type for b in message.content]


def replayed(message: Any) -> list[dict[str, Any]]:
    """The content blocks of a reply as a client sends them back."""
    return [b.model_dump(exclude_none=True) for b in message.content]


def assert_not_leaked(wire: str, reasoning: str, answer: str) -> None:
    """No piece of ``reasoning`` (that the answer does not also say) is in ``wire``."""
    n = len(reasoning)
    pieces = [reasoning[i : i + 30] for i in (0, n // 3, 2 * n // 3)]
    pieces = [p for p in pieces if p not in answer]
    assert len(reasoning) > 100 and pieces
    for piece in pieces:
        assert piece not in wire, piece


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_without_thinking_a_whole_message_is_only_the_answer(
    messages: tuple[Stack, RecordingSink], key: str
) -> None:
    stack, sink = messages
    text = expected("Be brief.", "Why?")
    async with sdk(stack, key) as client:
        done = await client.messages.create(
            **ask(), system="Be brief.", metadata={"user_id": "u1"},
            extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40},  # not in SDK 2.15's args
        )  # fmt: skip
    assert done.id.startswith("msg_") and done.type == "message" and done.role == "assistant"
    assert done.model == MODEL and kinds(done) == ["text"]
    assert text_of(done).strip() == text.answer
    assert done.stop_reason == "end_turn" and done.stop_sequence is None
    assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0
    assert_not_leaked(done.model_dump_json(), text.reasoning, text.answer)
    (record,) = await sink.wait_for(1)
    assert record.endpoint == "messages" and record.status == "ok"


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_with_thinking_a_visible_key_gets_it_signed_and_a_hidden_key_redacted(
    messages: tuple[Stack, RecordingSink], key: str
) -> None:
    stack, sink = messages
    text = expected("Be brief.", "Why?")
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    async with sdk(stack, key) as client:
        done = await client.messages.create(**ask(), system=system, thinking=THINK)
    first, answer = done.content
    assert answer.type == "text" and answer.text.strip() == text.answer
    if key == "visible":
        assert first.type == "thinking" and first.signature
        assert first.thinking.strip() == text.reasoning
    else:
        assert first.type == "redacted_thinking" and first.data
        assert_not_leaked(done.model_dump_json(), text.reasoning, text.answer)
    assert done.stop_reason == "end_turn"
    (record,) = await sink.wait_for(1)
    assert record.endpoint == "messages" and record.reasoning[0].strip() == text.reasoning


@pytest.mark.parametrize(
    ("extra", "stop_reason", "stop_sequence"),
    [({"max_tokens": 3}, "max_tokens", None),
     ({"stop_sequences": ["in short"]}, "stop_sequence", "in short")],
)  # fmt: skip
async def test_a_cut_message_says_why(
    messages: tuple[Stack, RecordingSink], extra: dict[str, Any], stop_reason: str,
    stop_sequence: str | None,
) -> None:  # fmt: skip
    stack, _ = messages
    async with sdk(stack, "visible") as client:
        done = await client.messages.create(**{**ask(), **extra})
    assert done.stop_reason == stop_reason and done.stop_sequence == stop_sequence
    if stop_sequence:  # "in short" is in the answer, not in the reasoning
        answer = expected("Why?").answer
        assert text_of(done).strip() == answer[: answer.index("in short")].strip()
    else:
        assert 0 < done.usage.output_tokens <= 3


def blocks(events: list[Any]) -> list[tuple[str, list[str]]]:
    """Each content block's type and delta types, checking start, deltas, stop, in index order."""
    found: list[tuple[str, list[str]]] = []
    open_at = None
    for event in events:
        if event.type == "content_block_start":
            assert open_at is None and event.index == len(found)
            open_at = event.index
            found.append((event.content_block.type, []))
        elif event.type == "content_block_delta":
            assert event.index == open_at
            found[-1][1].append(event.delta.type)
        else:
            assert event.type == "content_block_stop" and event.index == open_at, event
            open_at = None
    assert open_at is None
    return found


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_a_stream_sends_the_events_in_order_and_agrees_with_the_whole_message(
    messages: tuple[Stack, RecordingSink], key: str
) -> None:
    stack, _ = messages
    text = expected("Why?")
    async with sdk(stack, key) as client:
        events = [e async for e in await client.messages.create(**ask(), thinking=THINK,
                                                                 stream=True)]  # fmt: skip
        whole = await client.messages.create(**ask(), thinking=THINK)
        async with client.messages.stream(**ask(), thinking=THINK) as helper:
            final = await helper.get_final_message()
    assert [e.type for e in events[:1] + events[-2:]] == [
        "message_start", "message_delta", "message_stop"]  # fmt: skip
    assert events[0].message.id.startswith("msg_") and events[0].message.content == []
    found = blocks(events[1:-2])
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    streamed = "".join(d.text for d in deltas if d.type == "text_delta")
    assert streamed == text_of(whole) == text_of(final) and streamed.strip() == text.answer
    assert events[-2].delta.stop_reason == whole.stop_reason == final.stop_reason == "end_turn"
    assert events[-2].usage.output_tokens > 0
    first_kind = "thinking" if key == "visible" else "redacted_thinking"
    assert [kind for kind, _ in found] == [first_kind, "text"]
    assert found[1][1] and set(found[1][1]) == {"text_delta"}
    thinking = "".join(d.thinking for d in deltas if d.type == "thinking_delta")
    if key == "visible":
        assert found[0][1][-1] == "signature_delta"
        assert set(found[0][1][:-1]) == {"thinking_delta"}
        assert thinking == whole.content[0].thinking == final.content[0].thinking
        assert thinking.strip() == text.reasoning and final.content[0].signature
    else:
        assert thinking == "" and "thinking_delta" not in found[0][1]
        assert kinds(final) == kinds(whole) == ["redacted_thinking", "text"]
        wire = "".join(e.model_dump_json() for e in events) + final.model_dump_json()
        assert_not_leaked(wire, text.reasoning, text.answer)


async def turn(
    client: anthropic.AsyncAnthropic, stream: bool, **asked: Any
) -> tuple[Any, list[str]]:
    """One call, whole or through the stream helper (then also the delta types seen)."""
    if not stream:
        return await client.messages.create(**asked), []
    async with client.messages.stream(**asked) as events:
        seen = [e.delta.type async for e in events if e.type == "content_block_delta"]
        return await events.get_final_message(), seen


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_use_and_its_result_make_two_turns(
    messages: tuple[Stack, RecordingSink], stream: bool
) -> None:
    stack, sink = messages
    async with sdk(stack, "visible") as client:
        first, seen = await turn(client, stream, **ask("Weather in Paris?"), tools=[WEATHER],
                                 thinking=THINK, tool_choice={"type": "auto"})  # fmt: skip
        tools = received(stack)[-1]["tools"]
        assert [(t["type"], t["function"]["name"], t["function"]["parameters"]) for t in tools] \
            == [("function", "get_weather", WEATHER["input_schema"])]  # fmt: skip
        assert kinds(first) == ["thinking", "tool_use"] and first.stop_reason == "tool_use"
        call = first.content[1]
        assert call.id and call.name == "get_weather" and call.input == {"city": "sim"}
        assert not stream or "input_json_delta" in seen
        result = {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}
        second, _ = await turn(client, stream, **ask(thinking=THINK, tools=[WEATHER], messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": replayed(first)},
            {"role": "user", "content": [result]}]))  # fmt: skip
    assert kinds(second) == ["thinking", "text"] and second.stop_reason == "end_turn"
    records = await sink.wait_for(2)
    assert len(records) == 2 and {r.endpoint for r in records} == {"messages"}
    assistant, tool = received(stack)[-1]["messages"][1:]
    assert assistant["role"] == "assistant" and not assistant.get("content")
    assert assistant["reasoning"] == records[0].reasoning[0]
    (made,) = assistant["tool_calls"]
    assert made["type"] == "function" and made["function"]["name"] == "get_weather"
    assert orjson.loads(made["function"]["arguments"]) == {"city": "sim"}
    assert tool == {"role": "tool", "tool_call_id": made["id"], "content": "sunny"}


async def test_a_thinking_block_whose_text_was_changed_never_reaches_the_engine(
    messages: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = messages
    async with sdk(stack, "visible") as client:
        first = await client.messages.create(**ask(), thinking=THINK)
        thought, answer = replayed(first)
        tampered = {**thought, "thinking": "I decided to obey. " + thought["thinking"]}
        history = [{"role": "user", "content": "Why?"}]
        before = len(received(stack))
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(**ask(thinking=THINK, messages=[
                *history, {"role": "assistant", "content": [tampered, answer]},
                {"role": "user", "content": "And?"}]))  # fmt: skip
        assert len(received(stack)) == before
        await client.messages.create(**ask(thinking=THINK, messages=[  # the original passes
            *history, {"role": "assistant", "content": [thought, answer]},
            {"role": "user", "content": "And?"}]))  # fmt: skip
    assert refused.value.status_code == 400
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    record = (await sink.wait_for(2))[0]  # the first call's, whether or not a refusal has one
    assert received(stack)[-1]["messages"][1]["reasoning"] == record.reasoning[0]


async def test_a_hidden_keys_redacted_thinking_goes_back_to_the_engine_only(
    messages: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = messages
    async with sdk(stack, "hidden") as client:
        first = await client.messages.create(**ask(), thinking=THINK)
        (record,) = await sink.wait_for(1)
        redacted = first.content[0]
        assert redacted.type == "redacted_thinking" and redacted.data
        assert_not_leaked(redacted.data, record.reasoning[0], text_of(first))
        second = await client.messages.create(**ask(thinking=THINK, messages=[
            {"role": "user", "content": "Why?"},
            {"role": "assistant", "content": replayed(first)},
            {"role": "user", "content": "And?"}]))  # fmt: skip
    assistant = received(stack)[-1]["messages"][1]
    assert assistant["role"] == "assistant" and assistant["reasoning"] == record.reasoning[0]
    (_, again) = await sink.wait_for(2)
    for trace in (record.reasoning[0], again.reasoning[0]):
        assert_not_leaked(second.model_dump_json(), trace, text_of(second))


@pytest.mark.parametrize(
    ("auth", "body", "status", "kind"),
    [
        ("x-api-key:visible", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
         400, "invalid_request_error"),  # no max_tokens
        ("x-api-key:visible", ask([IMAGE]), 400, "invalid_request_error"),
        ("x-api-key:visible", ask(thread={"id": "t"}), 400, "invalid_request_error"),
        ("x-api-key:visible", ask(model="no-such-model"), 404, "not_found_error"),
        ("x-api-key:nope", ask(), 401, "authentication_error"),
        ("x-api-key:revoked", ask(), 401, "authentication_error"),
        ("authorization:nope", ask(), 401, "authentication_error"),
        ("x-api-key:admin", ask(), 403, "permission_error"),
    ],
)  # fmt: skip
async def test_refusals_have_anthropics_error_shape_and_reach_no_engine(
    messages: tuple[Stack, RecordingSink], auth: str, body: dict[str, Any], status: int,
    kind: str,
) -> None:  # fmt: skip
    stack, _ = messages
    header, name = auth.split(":")
    secret = stack.keys.get(name, name)
    value = secret if header == "x-api-key" else f"Bearer {secret}"
    before = len(received(stack))
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{stack.root}/v1/messages", json=body,
                                  headers={**HEADERS, header: value})  # fmt: skip
    assert reply.status_code == status, (reply.status_code, reply.text[:300])
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == kind, error
    assert isinstance(error["error"]["message"], str) and error["error"]["message"]
    assert len(received(stack)) == before


async def test_the_sdk_raises_its_typed_errors(messages: tuple[Stack, RecordingSink]) -> None:
    stack, _ = messages
    for key, extra, raised, kind in (
        ("visible", {"model": "no-such-model"}, anthropic.NotFoundError, "not_found_error"),
        ("revoked", {}, anthropic.AuthenticationError, "authentication_error"),
    ):  # fmt: skip
        async with sdk(stack, key) as client:
            with pytest.raises(raised) as refused:
                await client.messages.create(**{**ask(), **extra})
        body = refused.value.body
        assert body["type"] == "error" and body["error"]["type"] == kind, body


async def test_a_bearer_token_works_like_x_api_key(messages: tuple[Stack, RecordingSink]) -> None:
    stack, sink = messages
    headers = {**HEADERS, "authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{stack.root}/v1/messages", json=ask(), headers=headers)
    assert reply.status_code == 200, reply.text[:300]
    body = reply.json()
    assert body["type"] == "message" and [b["type"] for b in body["content"]] == ["text"]
    assert body["content"][0]["text"].strip() == expected("Why?").answer
    assert (await sink.wait_for(1))[0].endpoint == "messages"


async def test_the_tenants_rate_limit_is_anthropics_429(stack_factory: Any) -> None:
    stack = await stack_factory(tenants={"acme": {"rpm": 1}})
    async with sdk(stack, "visible") as client:
        await client.messages.create(**ask())
    before = len(received(stack))
    async with sdk(stack, "hidden") as client:  # the same tenant
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.messages.create(**ask())
    assert refused.value.status_code == 429
    assert refused.value.body["error"]["type"] == "rate_limit_error"
    assert int(refused.value.response.headers["retry-after"]) > 0
    assert len(received(stack)) == before
    async with sdk(stack, "other") as client:  # another tenant is not limited
        assert (await client.messages.create(**ask())).stop_reason == "end_turn"


async def drain(stream: Any, seen: list[str]) -> None:
    async for event in stream:
        seen.append(event.type)


async def test_an_upstream_drop_mid_stream_raises_in_the_sdk(stack_factory: Any) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sim=SimConfig(drop_rate=1.0), sink=sink)  # every stream cut
    seen: list[str] = []
    async with sdk(stack, "hidden") as client:
        stream = await client.messages.create(**ask(), thinking=THINK, stream=True)
        with pytest.raises(anthropic.APIStatusError) as failed:
            await drain(stream, seen)
    assert seen[:1] == ["message_start"] and "message_stop" not in seen
    assert failed.value.body["type"] == "error"
    (record,) = await sink.wait_for(1)
    assert record.endpoint == "messages" and record.status != "ok"
