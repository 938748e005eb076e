"""Reasoning history on chat, through the real ``openai`` SDK against the simulator: an earlier
turn's reasoning, sent as ``reasoning_content`` or ``reasoning``, reaches the engine under the
field the model's history rule names, or not at all, and ``tool_turns`` keeps only the tool-call
loop in progress."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.side.sim.app import SimApp
from tests.e2e.conftest import Stack

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip


def conversation(field: str) -> list[dict[str, Any]]:
    """Two user turns; the first answered with reasoning, the second in a tool-call loop."""
    return [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", field: "greeting them"},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL], field: "need the tool"},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]


async def sent(stack: Stack, messages: list[dict[str, Any]], key: str = "visible") -> list[Any]:
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys[key],
                                  max_retries=0) as client:  # fmt: skip
        await client.chat.completions.create(model="deepseek-r1", messages=messages)  # type: ignore[arg-type]
    assert isinstance(stack.sim, SimApp)
    received: list[Any] = stack.sim.sim.received[-1]["messages"]
    return received


def reasoning_of(messages: list[Any]) -> list[tuple[Any, Any]]:
    return [(m.get("reasoning"), m.get("reasoning_content"))
            for m in messages if m["role"] == "assistant"]  # fmt: skip


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_either_field_reaches_vllm_under_reasoning(stack_factory: Any, field: str) -> None:
    stack = await stack_factory()
    received = await sent(stack, conversation(field))
    assert reasoning_of(received) == [("greeting them", None), ("need the tool", None)]
    assert received[3]["tool_calls"] == [CALL]  # the rest of the turn untouched


async def test_a_model_whose_engine_reads_reasoning_content_gets_it_there(
    stack_factory: Any,
) -> None:
    stack = await stack_factory(models={"deepseek-r1": {"reasoning_history": "reasoning_content"}})
    received = await sent(stack, conversation("reasoning"))
    assert reasoning_of(received) == [(None, "greeting them"), (None, "need the tool")]


async def test_drop_sends_no_reasoning(stack_factory: Any) -> None:
    stack = await stack_factory(reasoning_history="drop")
    received = await sent(stack, conversation("reasoning_content"))
    assert reasoning_of(received) == [(None, None), (None, None)]
    assert [m.get("content") for m in received if m["role"] == "assistant"] == ["Hello.", None]


async def test_tool_turns_keeps_only_the_loop_in_progress(stack_factory: Any) -> None:
    stack = await stack_factory(models={"deepseek-r1": {"reasoning_turns": "tool_turns"}})
    received = await sent(stack, conversation("reasoning_content"))
    assert reasoning_of(received) == [(None, None), ("need the tool", None)]


async def test_reasoning_that_is_not_text_is_the_clients_error(stack_factory: Any) -> None:
    stack = await stack_factory()
    messages = conversation("reasoning_content")
    messages[1]["reasoning_content"] = {"not": "text"}
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="deepseek-r1", messages=messages)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "messages[1].reasoning_content"  # type: ignore[index]
