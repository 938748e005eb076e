"""Messages as Claude Code 2.1 speaks it, through the real ``anthropic`` SDK (its beta client, as
Claude Code uses it) against a gateway in front of the simulator: the request shaped as Claude
Code sends it (system blocks with ``cache_control``, ``output_config.effort``,
``context_management`` clearing thinking, a ``role: "system"`` message inside ``messages``,
``metadata.user_id``, tools with ``cache_control``, adaptive thinking, a stream, the
``anthropic-beta`` header) over a tool loop of three turns; ``message_start``'s input tokens;
``thinking.display: "omitted"`` blocks handed back; ``count_tokens`` with edits; the field
policy's notices; and a hidden key, which gets no byte of reasoning through any of it."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from gateway.side.sim.app import SimApp
from tests.e2e.conftest import RecordingSink, Stack
from tests.e2e.test_messages import assert_not_leaked

MODEL = "deepseek-r1"
BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14",
         "context-management-2025-06-27", "fine-grained-tool-streaming-2025-05-14"]  # fmt: skip
SYSTEM = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
     "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Work in the repository the user names.",
     "cache_control": {"type": "ephemeral"}},
]  # fmt: skip
TOOLS = [
    {"name": name, "description": f"The {name} tool.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                      "required": ["path"]}}
    for name in ("Read", "Grep", "Bash", "Agent")
]  # fmt: skip
TOOLS[-1]["cache_control"] = {"type": "ephemeral"}
AGENT_NOTE = {"role": "system", "content": "The Agent tool launches a sub-agent."}
KEEP_ONE = {"edits": [{"type": "clear_thinking_20251015",
                       "keep": {"type": "thinking_turns", "value": 1}}]}  # fmt: skip
HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": ",".join(BETAS)}


def claude_code(stack: Stack, key: str = "visible") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys[key], max_retries=0)


def asked(messages: list[Any], **extra: Any) -> dict[str, Any]:
    """Claude Code's request, as its beta client builds it."""
    return {"model": MODEL, "max_tokens": 16000, "system": SYSTEM, "tools": TOOLS,
            "messages": messages, "metadata": {"user_id": "user_5f2e_account_9a1c_session_77"},
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
            "context_management": KEEP_ONE, "betas": BETAS, **extra}  # fmt: skip


def received(stack: Stack) -> dict[str, Any]:
    assert isinstance(stack.sim, SimApp)
    return stack.sim.sim.received[-1]


async def streamed(client: anthropic.AsyncAnthropic, request: dict[str, Any]) -> tuple[Any, Any]:
    """The final message and the ``message_start`` event of a streamed turn."""
    async with client.beta.messages.stream(**request) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    return final, events[0]


def replayed(message: Any) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True) for b in message.content]


def result_of(message: Any, text: str = "README: thinkgate " * 30) -> dict[str, Any]:
    call = next(b for b in message.content if b.type == "tool_use")
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call.id, "content": text}],
    }


async def three_turns(
    client: anthropic.AsyncAnthropic, stack: Stack, **extra: Any
) -> tuple[list[Any], list[Any], list[dict[str, Any]]]:
    """Claude Code's loop: a tool call, its result answered, a new question (a tool call
    again). The finals, the message_start events, and what the engine received each time."""
    history: list[Any] = [AGENT_NOTE, {"role": "user", "content": "Read the README."}]
    finals, starts, bodies = [], [], []
    for _ in range(3):
        final, start = await streamed(client, asked(history, **extra))
        finals.append(final)
        starts.append(start)
        bodies.append(received(stack))
        history.append({"role": "assistant", "content": replayed(final)})
        follow = result_of(final) if final.stop_reason == "tool_use" else {
            "role": "user", "content": "Now grep for TODO."}  # fmt: skip
        history.append(follow)
    return finals, starts, bodies


async def test_claude_codes_tool_loop_is_served_as_it_sends_it(stack_factory: Any) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    async with claude_code(stack) as client:
        finals, starts, bodies = await three_turns(client, stack)
    assert [f.stop_reason for f in finals] == ["tool_use", "end_turn", "tool_use"]
    assert [[b.type for b in f.content][:1] for f in finals] == [["thinking"]] * 3
    first = bodies[0]
    assert first["messages"][0] == {"role": "system", "content": (
        "You are Claude Code, Anthropic's official CLI for Claude.\nWork in the repository the "
        "user names.\n\nThe Agent tool launches a sub-agent.")}  # fmt: skip
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["reasoning_effort"] == "high"
    assert not {"metadata", "user", "output_config", "context_management", "thinking"} & set(first)
    # the third turn: two earlier thinking turns, the older one cleared (keep 1)
    records = await sink.wait_for(3)
    assistants = [m for m in bodies[2]["messages"] if m["role"] == "assistant"]
    assert [m.get("reasoning") for m in assistants] == [None, records[1].reasoning[0]]
    applied = finals[2].context_management.applied_edits
    assert [(e.type, e.cleared_thinking_turns) for e in applied] == [
        ("clear_thinking_20251015", 1)]  # fmt: skip
    assert applied[0].cleared_input_tokens >= len(records[0].reasoning[0]) // 4 - 1
    assert finals[0].context_management.applied_edits == []  # asked, nothing to clear yet
    for start, final in zip(starts, finals, strict=True):  # an estimate first, then the count
        assert start.message.usage.input_tokens >= final.usage.input_tokens > 0


async def test_message_start_carries_what_count_tokens_estimates(stack_factory: Any) -> None:
    stack = await stack_factory()
    messages = [AGENT_NOTE, {"role": "user", "content": "Read the README."}]
    async with claude_code(stack) as client:
        counted = await client.beta.messages.count_tokens(
            model=MODEL, system=SYSTEM, tools=TOOLS, messages=messages,  # type: ignore[arg-type]
            context_management=KEEP_ONE, thinking={"type": "adaptive"}, betas=BETAS,
        )  # fmt: skip
        _, start = await streamed(client, asked(messages))
    assert counted.input_tokens == start.message.usage.input_tokens > 100
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == counted.input_tokens


async def test_thinking_displayed_as_omitted_goes_back_to_the_engine_whole(
    stack_factory: Any,
) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    omitted = {"type": "adaptive", "display": "omitted"}
    async with claude_code(stack) as client:
        first, _ = await streamed(client, asked([{"role": "user", "content": "Read the README."}],
                                                thinking=omitted))  # fmt: skip
        thought = first.content[0]
        assert thought.type == "thinking" and thought.thinking == "" and thought.signature
        history = [{"role": "user", "content": "Read the README."},
                   {"role": "assistant", "content": replayed(first)}, result_of(first)]  # fmt: skip
        await streamed(client, asked(history, thinking=omitted))
    (record, _) = await sink.wait_for(2)
    assistant = received(stack)["messages"][2]
    assert assistant["role"] == "assistant" and assistant["reasoning"] == record.reasoning[0]


async def test_a_hidden_key_gets_no_byte_of_reasoning_on_any_new_path(stack_factory: Any) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    async with claude_code(stack, "hidden") as client:
        finals, starts, _ = await three_turns(client, stack)
        omitted, _ = await streamed(client, asked([{"role": "user", "content": "Read the README."}],
                                                  thinking={"type": "adaptive",
                                                            "display": "omitted"}))  # fmt: skip
    assert finals[0].content[0].type == "redacted_thinking"
    assert omitted.content[0].type == "thinking" and omitted.content[0].thinking == ""
    assert finals[2].context_management.applied_edits[0].cleared_thinking_turns == 1
    messages = [*finals, *(start.message for start in starts), omitted]
    wire = "".join(message.model_dump_json() for message in messages)
    answers = "".join(b.model_dump_json() for m in messages for b in m.content
                      if b.type in ("text", "tool_use"))  # fmt: skip
    for record in await sink.wait_for(4):
        assert_not_leaked(wire, record.reasoning[0], answers)


async def test_the_field_policy_notices_and_strict_mode(stack_factory: Any) -> None:
    stack = await stack_factory()
    body = {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": "Hi"}],
            "cache_control": {"type": "ephemeral"}, "diagnostics": {"cache_miss": True},
            "inference_geo": "us", "speed": "fast", "service_tier": "auto", "container": "c1",
            "billing_policy": {"type": "x"}, "fallbacks": [{"model": "other"}],
            "x_new_field": 1, "output_config": {"format": {
                "type": "json_schema", "schema": {"type": "object"}}},
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
                      TOOLS[0]]}  # fmt: skip
    headers = {**HEADERS, "x-api-key": stack.keys["visible"]}
    async with httpx.AsyncClient(timeout=10) as raw:
        reply = await raw.post(f"{stack.root}/v1/messages", json=body, headers=headers)
    assert reply.status_code == 200, reply.text[:300]
    assert reply.headers["x-thinkgate-ignored"] == "x_new_field"
    assert reply.headers["x-thinkgate-dropped-tools"] == "web_search_20250305"
    sent = received(stack)
    assert [t["function"]["name"] for t in sent["tools"]] == ["Read"]
    assert sent["response_format"]["type"] == "json_schema"
    assert not (set(body) - {"model", "max_tokens", "messages", "tools"}) & set(sent)
    strict = await stack_factory(unknown_fields="refuse")
    async with httpx.AsyncClient(timeout=10) as raw:
        refused = await raw.post(
            f"{strict.root}/v1/messages",
            json=body,
            headers={**HEADERS, "x-api-key": strict.keys["visible"]},
        )
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "x_new_field" in refused.json()["error"]["message"]


@pytest.mark.parametrize("field", ["compaction", "thread", "mcp_servers"])
async def test_fields_whose_loss_would_change_the_answer_are_refused(
    stack_factory: Any, field: str
) -> None:
    stack = await stack_factory()
    value = {"compaction": {"instructions": "x"}, "thread": {"id": "t"},
             "mcp_servers": [{"type": "url", "url": "https://m", "name": "m"}]}[field]  # fmt: skip
    async with claude_code(stack) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(model=MODEL, max_tokens=64, extra_body={field: value},
                                         messages=[{"role": "user", "content": "Hi"}])  # fmt: skip
    assert field in refused.value.body["error"]["message"]  # type: ignore[index]
