"""``POST /v1/responses`` through the real ``openai`` SDK against the simulator: whole and
streamed (raw events and the ``responses.stream`` helper), visible and hidden keys, the limit
cut, bad input, and the ledger record's endpoint."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from gateway.side.sim.app import SimConfig
from gateway.side.sim.script import Composition, compose, derive_seed
from tests.e2e.conftest import RecordingSink, Stack
from tests.openai_errors import assert_openai_error


def expected(*texts: str) -> Composition:
    """What the simulator answers to these message texts (its seed is their hash; it talks
    about the last, the user's question)."""
    return compose(derive_seed("\n".join(texts)), texts[-1])


@pytest.fixture
async def responses(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    return stack, sink


def sdk(stack: Stack, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys[key], max_retries=0)


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_a_whole_response_has_reasoning_only_for_a_visible_key(
    responses: tuple[Stack, RecordingSink], key: str
) -> None:
    stack, sink = responses
    text = expected("Be brief.", "Why?")
    async with sdk(stack, key) as client:
        done = await client.responses.create(
            model="deepseek-r1", input="Why?", instructions="Be brief.", metadata={"trace": "t1"},
        )  # fmt: skip
    assert done.status == "completed" and done.object == "response"
    assert done.output_text == "\n\n" + text.answer
    kinds = [item.type for item in done.output]
    if key == "visible":
        assert kinds == ["reasoning", "message"]
        assert done.output[0].content is not None
        assert done.output[0].content[0].text == text.reasoning + "\n"
    else:
        assert kinds == ["message"]
        assert text.reasoning[:20] not in done.model_dump_json()
    assert done.usage is not None and done.usage.output_tokens_details.reasoning_tokens > 0
    assert done.metadata == {"trace": "t1"} and done.instructions == "Be brief."
    (record,) = await sink.wait_for(1)
    assert record.endpoint == "responses" and record.status == "ok"
    assert record.messages[0] == {"role": "system", "content": "Be brief."}
    assert record.reasoning == (text.reasoning + "\n",)


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_a_streamed_response_sends_the_reference_events_in_order(
    responses: tuple[Stack, RecordingSink], key: str
) -> None:
    stack, _ = responses
    text = expected("Why?")
    async with sdk(stack, key) as client:
        stream = await client.responses.create(
            model="deepseek-r1", input=[{"role": "user", "content": "Why?"}], stream=True,
        )  # fmt: skip
        events = [event async for event in stream]
    types = [event.type for event in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert answer == "\n\n" + text.answer
    final = events[-1].response
    assert final.output_text == answer
    if key == "visible":
        assert reasoning == text.reasoning + "\n"
        assert [i.type for i in final.output] == ["reasoning", "message"]
        opened = types.index("response.output_item.added")
        assert types[opened : opened + 2] == [
            "response.output_item.added", "response.content_part.added",
        ]  # fmt: skip
    else:
        assert reasoning == "" and [i.type for i in final.output] == ["message"]
        assert all("reasoning_text" not in t for t in types)


async def test_the_stream_helper_gives_typed_events_and_the_final_response(
    responses: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = responses
    async with (
        sdk(stack, "visible") as client,
        client.responses.stream(model="deepseek-r1", input="Why?") as stream,
    ):
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == "\n\n" + expected("Why?").answer


async def test_the_limit_makes_the_response_incomplete(
    responses: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = responses
    async with sdk(stack, "hidden") as client:
        done = await client.responses.create(model="deepseek-r1", input="Why?",
                                             max_output_tokens=3)  # fmt: skip
    assert done.status == "incomplete"
    assert done.incomplete_details is not None
    assert done.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "deepseek-r1"}, "input"),
        ({"model": "deepseek-r1", "input": "x", "tools": [{"type": "mcp"}]}, "tools[0].type"),
        ({"model": "deepseek-r1", "input": "x", "tools": [{"type": "function"}]},
         "tools[0].name"),
        ({"model": "deepseek-r1", "input": "x", "tool_choice": {"type": "function", "name": "f"}},
         "tool_choice.name"),
        ({"model": "deepseek-r1", "input": "x", "background": "yes"}, "background"),
        ({"model": "deepseek-r1", "input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"model": "deepseek-r1", "input": [{"type": "function_call_output"}]},
         "input[0].call_id"),
        ({"model": "deepseek-r1", "input": [{"type": "item_reference", "id": "x"}]},
         "input[0].id"),
        ({"model": "deepseek-r1", "input": [{"type": "function_call", "call_id": "c",
                                             "name": "f", "arguments": {}}]},
         "input[0].arguments"),
        ({"model": "deepseek-r1", "input": [{"type": "reasoning", "summary": [],
                                             "content": [{"type": "output_text", "text": "x"}]}]},
         "input[0].content[0]"),
        ({"model": "deepseek-r1", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": "deepseek-r1", "input": "x", "include": ["message.output_text.everything"]},
         "include"),
    ],
)  # fmt: skip
async def test_bad_or_unsupported_input_is_a_400_that_names_it(
    responses: tuple[Stack, RecordingSink], body: dict[str, Any], param: str
) -> None:
    stack, _ = responses
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{stack.url}/responses", json=body, headers=headers)
    error = assert_openai_error(reply, 400)
    assert error["param"] == param


async def test_without_a_key_nothing_is_read(responses: tuple[Stack, RecordingSink]) -> None:
    stack, _ = responses
    async with openai.AsyncOpenAI(base_url=stack.url, api_key="nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.responses.create(model="deepseek-r1", input="x")


async def test_an_upstream_drop_mid_stream_is_one_error_event_then_response_failed(
    stack_factory: Any,
) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sim=SimConfig(drop_rate=1.0), sink=sink)  # every stream cut
    body = {"model": "deepseek-r1", "input": "Why?", "stream": True}
    headers = {"authorization": f"Bearer {stack.keys['hidden']}"}
    async with httpx.AsyncClient(timeout=30) as client:
        reply = await client.post(f"{stack.url}/responses", json=body, headers=headers)
    assert reply.status_code == 200  # the stream had started
    names = [line[7:] for line in reply.text.splitlines() if line.startswith("event: ")]
    assert names.count("error") == 1 and names[-2:] == ["error", "response.failed"]
    assert names[:2] == ["response.created", "response.in_progress"]
    (record,) = await sink.wait_for(1)
    assert record.status == "upstream_error" and record.endpoint == "responses"


async def test_the_sdk_raises_the_failed_stream(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SimConfig(drop_rate=1.0))
    async with sdk(stack, "visible") as client:
        stream = await client.responses.create(model="deepseek-r1", input="Why?", stream=True)
        events = [event async for event in stream]
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None
    assert events[-1].response.error.code == "upstream_protocol_error"
