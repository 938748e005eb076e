"""The Responses API's state through the real ``openai`` SDK against the simulator: function
tools and their results, reasoning handed back sealed (``store: false``) or kept by the gateway
(``store: true``, ``previous_response_id``), retrieve / delete / input_items, and what the
engine was sent on the next turn."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.side.sim.app import SimApp
from tests.e2e.conftest import RecordingSink, Stack
from tests.e2e.test_responses import sdk
from tests.scrape import sample

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}


@pytest.fixture
async def state(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    return stack, sink


def sent(stack: Stack) -> dict[str, Any]:
    """The last body the engine received."""
    assert isinstance(stack.sim, SimApp)
    return stack.sim.sim.received[-1]


def replayed(output: list[Any]) -> list[dict[str, Any]]:
    """Output items as a client sends them back."""
    return [item.model_dump(exclude_none=True) for item in output]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_function_call_and_its_result_make_an_agent_turn(
    state: tuple[Stack, RecordingSink], stream: bool
) -> None:
    stack, sink = state
    question = [{"role": "user", "content": "Weather in Paris?"}]
    async with sdk(stack, "visible") as client:
        if stream:
            async with client.responses.stream(
                model="deepseek-r1",
                input=question,
                tools=[WEATHER],
                store=False,  # type: ignore[arg-type]
            ) as events:
                kinds = [event.type async for event in events]
                first = await events.get_final_response()
            assert "response.function_call_arguments.delta" in kinds
            assert kinds.index("response.function_call_arguments.done") < kinds.index(
                "response.completed"
            )
        else:
            first = await client.responses.create(
                model="deepseek-r1",
                input=question,
                tools=[WEATHER],
                store=False,  # type: ignore[arg-type]
            )
        assert sent(stack)["tools"] == [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city.",
            "parameters": WEATHER["parameters"], "strict": False}}]  # fmt: skip
        assert [item.type for item in first.output] == ["reasoning", "function_call"]
        call = first.output[1]
        assert call.type == "function_call" and call.name == "get_weather"
        assert orjson.loads(call.arguments) == {"city": "sim"}
        assert call.call_id.startswith("chatcmpl-tool-")
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        second = await client.responses.create(
            model="deepseek-r1", input=[*question, *replayed(first.output), result],
            tools=[WEATHER], store=False,  # type: ignore[arg-type, list-item]
        )  # fmt: skip
    assert second.output_text and [i.type for i in second.output] == ["reasoning", "message"]
    reasoning = first.output[0].content[0].text  # type: ignore[union-attr, index]
    assert sent(stack)["messages"][1:] == [
        {"role": "assistant", "content": None, "reasoning": reasoning, "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
    ]  # fmt: skip
    records = await sink.wait_for(2)
    assert records[0].tool_calls == (
        ({"id": call.call_id, "name": "get_weather", "arguments": call.arguments},),
    )
    assert records[0].finish_reasons == ("tool_calls",) and records[1].tool_calls is None


@pytest.mark.parametrize("stream", [False, True])
async def test_a_hidden_key_carries_its_reasoning_sealed_and_never_reads_it(
    state: tuple[Stack, RecordingSink], stream: bool
) -> None:
    stack, sink = state
    question = [{"role": "user", "content": "Weather in Oslo?"}]
    asked = {"model": "deepseek-r1", "tools": [WEATHER], "store": False,
             "include": ["reasoning.encrypted_content"]}  # fmt: skip
    async with sdk(stack, "hidden") as client:
        if stream:
            events = [e async for e in await client.responses.create(
                input=question, stream=True, **asked)]  # type: ignore[call-overload]  # fmt: skip
            assert not [e for e in events if "reasoning_text" in e.type]
            first = events[-1].response
            wire = b"".join(e.model_dump_json().encode() for e in events)
        else:
            first = await client.responses.create(input=question, **asked)  # type: ignore[call-overload]
            wire = first.model_dump_json().encode()
        (record,) = await sink.wait_for(1)
        trace = record.reasoning[0]
        assert len(trace) > 40 and trace[:30].encode() not in wire
        item = first.output[0]
        assert item.type == "reasoning" and item.content is None and item.encrypted_content
        assert trace[:30].encode() not in base64.urlsafe_b64decode(item.encrypted_content + "==")
        call = first.output[1]
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "cold"}
        await client.responses.create(
            input=[*question, *replayed(first.output), result], **asked)  # type: ignore[call-overload]  # fmt: skip
    assert sent(stack)["messages"][1]["reasoning"] == trace


async def test_a_token_that_is_not_this_tenants_or_was_altered_is_refused(
    state: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = state
    asked = {"model": "deepseek-r1", "store": False, "include": ["reasoning.encrypted_content"]}
    async with sdk(stack, "hidden") as client:
        first = await client.responses.create(input="Why?", **asked)  # type: ignore[call-overload]
    token = first.output[0].encrypted_content
    assert token
    flipped = token[:40] + ("A" if token[40] != "A" else "B") + token[41:]
    item = {"type": "reasoning", "summary": [], "encrypted_content": None}
    for key, bad in (("other", token), ("hidden", flipped), ("hidden", "tgr1garbage")):
        async with sdk(stack, key) as client:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.responses.create(input=[
                    {"role": "user", "content": "Why?"}, {**item, "encrypted_content": bad},
                    {"role": "user", "content": "And?"}], **asked)  # type: ignore[call-overload]  # fmt: skip
        error = refused.value.body
        assert isinstance(error, dict)
        assert error["code"] == "invalid_encrypted_content"
        assert error["param"] == "input[1].encrypted_content"
        assert token not in str(error)


async def test_a_stored_response_is_retrieved_listed_continued_and_deleted(
    state: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = state
    async with sdk(stack, "visible") as client:
        first = await client.responses.create(
            model="deepseek-r1", input="Why is the sky blue?", instructions="Be brief."
        )
        again = await client.responses.retrieve(first.id)
        assert again.model_dump() == first.model_dump()
        items = await client.responses.input_items.list(first.id, order="asc")
        assert [(i.type, i.role) for i in items.data] == [("message", "user")]  # type: ignore[union-attr]
        assert items.data[0].content[0].text == "Why is the sky blue?"  # type: ignore[union-attr]
        follow = await client.responses.create(
            model="deepseek-r1", input="Shorter.", previous_response_id=first.id
        )
        assert follow.previous_response_id == first.id
        (record, _) = await sink.wait_for(2)
        assert sent(stack)["messages"] == [
            {"role": "user", "content": "Why is the sky blue?"},
            {"role": "assistant", "content": record.content[0],
             "reasoning": record.reasoning[0]},
            {"role": "user", "content": "Shorter."},
        ]  # instructions are not carried over (the reference's rule)  # fmt: skip
        deleted = await client.responses.delete(first.id)
        assert deleted is None or getattr(deleted, "deleted", True)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError) as dangling:
            await client.responses.create(
                model="deepseek-r1", input="x", previous_response_id=first.id
            )
    body = dangling.value.body
    assert isinstance(body, dict) and body["param"] == "previous_response_id"


async def test_a_stored_response_is_the_tenants_own_and_hides_reasoning_from_hidden_keys(
    state: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = state
    async with sdk(stack, "visible") as client:
        made = await client.responses.create(model="deepseek-r1", input="Why?")
    (record,) = await sink.wait_for(1)
    async with sdk(stack, "hidden") as client:
        seen = await client.responses.retrieve(made.id)
        assert [i.type for i in seen.output] == ["message"]
        assert record.reasoning[0][:30] not in seen.model_dump_json()
        follow = await client.responses.create(
            model="deepseek-r1", input="More?", previous_response_id=made.id
        )  # the engine still gets the reasoning back; the hidden client never sees it
        assert sent(stack)["messages"][1]["reasoning"] == record.reasoning[0]
        assert record.reasoning[0][:30] not in follow.model_dump_json()
    async with sdk(stack, "other") as client:
        for ask in (client.responses.retrieve(made.id), client.responses.delete(made.id)):
            with pytest.raises(openai.NotFoundError):
                await ask
    async with sdk(stack, "visible") as client:
        assert (await client.responses.retrieve(made.id)).id == made.id  # still there


async def test_store_false_keeps_nothing_but_the_ledger_record(
    state: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = state
    async with sdk(stack, "visible") as client:
        made = await client.responses.create(model="deepseek-r1", input="Why?", store=False)
        assert made.store is False
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(made.id)
    assert len(await sink.wait_for(1)) == 1


async def test_requests_are_counted_by_endpoint(state: tuple[Stack, RecordingSink]) -> None:
    stack, sink = state
    async with sdk(stack, "visible") as client:
        await client.responses.create(model="deepseek-r1", input="Why?", store=False)
        await client.chat.completions.create(
            model="deepseek-r1", messages=[{"role": "user", "content": "Why?"}]
        )
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model="deepseek-r1", input=[])
    await sink.wait_for(2)
    async with httpx.AsyncClient() as http:
        for endpoint, status, model in (("responses", "ok", "deepseek-r1"),
                                        ("chat.completions", "ok", "deepseek-r1"),
                                        ("responses", "invalid", "unknown")):  # fmt: skip
            assert await sample(http, f"{stack.root}/metrics", "thinkgate_requests_total",
                                endpoint=endpoint, status=status, model=model, tenant="acme",
                                stream="false") == 1  # fmt: skip
