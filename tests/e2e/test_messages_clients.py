"""What Claude-Code-style clients send to ``/v1/messages``, through the real ``anthropic`` SDK
against the simulator: the request shapes written from the SDK's own types (system blocks with
``cache_control``, many tools, ``anthropic-beta`` headers, a streamed tool use with thinking),
``count_tokens``, another tenant's thinking block, a client that leaves mid-stream."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam, TextBlockParam, ToolParam

from gateway.side.sim.app import SimApp, SimConfig
from tests.e2e.conftest import RecordingSink, Stack

BETAS = "interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
SYSTEM: list[TextBlockParam] = [
    {"type": "text", "text": "You are a coding agent.",
     "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Work in the repository the user names.",
     "cache_control": {"type": "ephemeral"}},
]  # fmt: skip
TOOLS: list[ToolParam] = [
    {"name": name, "description": f"The {name} tool.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                      "required": ["path"]}}
    for name in ("Read", "Write", "Edit", "Glob", "Grep", "Bash", "LS", "MultiEdit",
                 "NotebookRead", "NotebookEdit", "WebFetch", "TodoWrite")
]  # fmt: skip
TOOLS[-1]["cache_control"] = {"type": "ephemeral"}
MESSAGES: list[MessageParam] = [
    {"role": "user", "content": [{"type": "text", "text": "Read the README.",
                                  "cache_control": {"type": "ephemeral"}}]},
]  # fmt: skip


def client(stack: Stack) -> anthropic.AsyncAnthropic:
    headers = {"anthropic-beta": BETAS}
    return anthropic.AsyncAnthropic(
        base_url=stack.root, api_key=stack.keys["visible"], max_retries=0, default_headers=headers
    )


async def test_a_coding_agents_streamed_turn_calls_a_tool_after_thinking(
    stack_factory: Any,
) -> None:
    stack = await stack_factory()
    async with client(stack) as sdk, sdk.messages.stream(
        model="deepseek-r1", max_tokens=4096, system=SYSTEM, tools=TOOLS, messages=MESSAGES,
        thinking={"type": "enabled", "budget_tokens": 2048}, tool_choice={"type": "auto"},
        metadata={"user_id": "user_0123"},
    ) as stream:  # fmt: skip
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    call = final.content[1]
    assert call.type == "tool_use" and call.name == "Read" and call.input == {"path": "sim"}
    assert final.stop_reason == "tool_use"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "input_json" in kinds and "signature" in kinds
    assert isinstance(stack.sim, SimApp)
    sent = stack.sim.sim.received[-1]
    system = "You are a coding agent.\nWork in the repository the user names."
    assert sent["messages"][0] == {"role": "system", "content": system}
    assert [t["function"]["name"] for t in sent["tools"]] == [t["name"] for t in TOOLS]
    assert "user" not in sent and "metadata" not in sent  # MESSAGES: metadata is ignored
    # R1 behind a text-splitting gateway: the gateway keeps the 2,048-token budget itself
    assert "thinking_token_budget" not in sent
    assert sent["stream_options"]["continuous_usage_stats"] is True


async def test_count_tokens_answers_with_the_gateways_estimate_without_a_tokenizer(
    stack_factory: Any,
) -> None:
    stack = await stack_factory()
    async with client(stack) as sdk:
        counted = await sdk.messages.count_tokens(
            model="deepseek-r1", system=SYSTEM, tools=TOOLS, messages=MESSAGES
        )
    assert counted.input_tokens > 10
    async with httpx.AsyncClient() as raw:
        response = await raw.post(
            f"{stack.root}/v1/messages/count_tokens",
            headers={"x-api-key": stack.keys["visible"], "anthropic-version": "2023-06-01"},
            json={"model": "deepseek-r1", "messages": [{"role": "user", "content": "hi"}]},
        )
        unknown = await raw.post(
            f"{stack.root}/v1/messages/count_tokens",
            headers={"x-api-key": stack.keys["visible"]},
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.headers["x-thinkgate-token-count"] == "estimate"
    assert response.json()["input_tokens"] > 0
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "not_found_error"


async def test_another_tenants_thinking_block_is_refused(stack_factory: Any) -> None:
    """A block signed for one tenant opens for no other: the sealed text is never decrypted
    under another tenant's key, and the engine is not asked."""
    stack = await stack_factory()
    question: list[MessageParam] = [{"role": "user", "content": "Hi"}]
    async with client(stack) as sdk:
        first = await sdk.messages.create(
            model="deepseek-r1", max_tokens=2048, messages=question,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )  # fmt: skip
    assert isinstance(stack.sim, SimApp)
    asked = len(stack.sim.sim.received)
    turns: Any = [*question, {"role": "assistant",
                              "content": [b.model_dump() for b in first.content]},
                  {"role": "user", "content": "More."}]  # fmt: skip
    async with anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["other"],
                                        max_retries=0) as other:  # fmt: skip
        with pytest.raises(anthropic.BadRequestError) as caught:
            await other.messages.create(model="deepseek-r1", max_tokens=64, messages=turns)
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert len(stack.sim.sim.received) == asked


async def test_a_client_that_leaves_a_stream_cancels_the_engine_and_is_recorded(
    stack_factory: Any,
) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sim=SimConfig(itl_ms=20), sink=sink)
    assert isinstance(stack.sim, SimApp)
    body = {"model": "deepseek-r1", "max_tokens": 2000, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    headers = {"x-api-key": stack.keys["visible"], "anthropic-version": "2023-06-01"}
    async with (
        httpx.AsyncClient(timeout=10) as raw,
        raw.stream("POST", f"{stack.root}/v1/messages", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        await anext(response.aiter_bytes())  # message_start
        await stack.sim.sim.wait_for(lambda s: s.running == 1, timeout=5)
    await stack.sim.sim.wait_for(lambda s: s.cancelled == 1, timeout=5)
    [record] = await sink.wait_for(1)
    assert (record.endpoint, record.status) == ("messages", "client_disconnected")
