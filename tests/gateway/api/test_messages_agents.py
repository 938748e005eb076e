"""Messages as agent clients speak it (Claude Code 2.1): ``role: "system"`` messages folded into
the leading system prompt, ``output_config`` (effort, format), ``thinking`` between tools and
with its display omitted, context edits applied by ``build``, the prompt's estimate, and
``count_tokens`` under its own field policy."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest

from gateway.api.messages.request import (
    parse_count_tokens_request,
    parse_messages_request,
    prompt_estimate,
)
from gateway.errors import InvalidRequest
from tests.gateway.api.test_messages import HI, body, parsed, sent

TOOL = {"name": "Read", "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}  # fmt: skip


def refused(raw: bytes) -> str | None:
    with pytest.raises(InvalidRequest) as info:
        parse_messages_request(raw)
    return info.value.param


def use(call_id: str, thought: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if thought is not None:
        blocks.append({"type": "thinking", "thinking": thought, "signature": f"S-{call_id}"})
    blocks.append({"type": "tool_use", "id": call_id, "name": "Read", "input": {"path": "a"}})
    return {"role": "assistant", "content": blocks}


def result(call_id: str, text: str = "file text " * 40) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                         "content": text}]}  # fmt: skip


REMINDER = {"role": "system", "content": [
    {"type": "text", "text": "Agent tool: delegate when asked.",
     "cache_control": {"type": "ephemeral"}}]}  # fmt: skip


# -- role: system inside messages ----------------------------------------------------------


def test_system_messages_are_folded_into_the_leading_system_prompt_in_order() -> None:
    messages = [REMINDER, HI, use("t1"), {"role": "system", "content": "Skill: none."},
                result("t1"), {"role": "system", "content": ""}]  # fmt: skip
    system = [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be terse."},
    ]
    chat = sent(system=system, messages=messages, tools=[TOOL])
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][0]["content"] == (
        "You are Claude Code.\nBe terse.\n\nAgent tool: delegate when asked.\n\nSkill: none."
    )
    # a system message between a tool_use and its tool_result leaves them a pair
    assert chat["messages"][3]["tool_call_id"] == "t1"


def test_without_a_system_field_the_system_messages_alone_lead() -> None:
    chat = sent(messages=[HI, {"role": "system", "content": "Reminder."}])
    assert chat["messages"] == [{"role": "system", "content": "Reminder."}, HI]


def test_a_system_message_cleared_at_the_next_user_message_is_shown_only_until_then() -> None:
    once = {"role": "system", "content": "Only now.", "clear_at": "next_user_message"}
    kept = sent(messages=[HI, once])  # for the user turn it follows
    assert kept["messages"][0] == {"role": "system", "content": "Only now."}
    stays = {"role": "system", "content": "Stays.", "clear_at": "never"}
    gone = sent(messages=[HI, once, {"role": "assistant", "content": "ok"}, HI, stays])
    assert gone["messages"][0] == {"role": "system", "content": "Stays."}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "system", "content": "x", "clear_at": "later"}, "messages[1].clear_at"),
        ({"role": "system", "content": [{"type": "image", "source": {}}]},
         "messages[1].content[0]"),
        ({"role": "system", "content": [{"type": "tool_addition", "tool": {}}]},
         "messages[1].content[0].tool.type"),
        ({"role": "system", "content": [{"type": "tool_addition", "tool": {
            "type": "mcp_toolset_reference", "server_name": "s"}}]},
         "messages[1].content[0].tool.type"),
        ({"role": "system", "content": [{"type": "tool_removal", "tool": {
            "type": "tool_reference", "name": "Nope"}}]}, "messages[1].content[0].tool.name"),
        ({"role": "system", "content": 3}, "messages[1].content"),
    ],
)  # fmt: skip
def test_a_system_message_the_engine_cannot_be_given_is_refused(
    message: dict[str, Any], param: str
) -> None:
    assert refused(body(messages=[HI, message])) == param


def test_of_two_faults_the_first_in_the_messages_order_is_named() -> None:
    bad_system = {"role": "system", "content": "x", "clear_at": "later"}
    bad_user = {"role": "user", "content": [{"type": "text"}]}
    assert refused(body(messages=[HI, bad_user, bad_system])) == "messages[1].content[0].text"
    assert refused(body(messages=[HI, bad_system, bad_user])) == "messages[1].clear_at"
    assert refused(body(system=3, messages=[bad_user])) == "system"  # the field comes first


def change(kind: str, tool: dict[str, Any]) -> dict[str, Any]:
    return {"role": "system", "content": [{"type": "text", "text": "Tools changed."},
                                          {"type": kind, "tool": tool}]}  # fmt: skip


GREP = {"name": "Grep", "input_schema": {"type": "object"}}


def offered(*messages: Any, **fields: Any) -> list[str]:
    chat = sent(messages=[HI, *messages], tools=[TOOL, GREP], **fields)
    return [t["function"]["name"] for t in chat.get("tools", [])]


def test_system_messages_tool_changes_leave_the_engine_the_tools_in_force_at_the_end() -> None:
    read = {"type": "tool_reference", "name": "Read"}
    assert offered(change("tool_removal", read)) == ["Grep"]
    assert offered(change("tool_removal", read), change("tool_addition", read)) == [
        "Grep", "Read"]  # fmt: skip
    new = {
        "type": "tool_definition",
        "definition": {"name": "Edit", "input_schema": {"type": "object"}},
    }
    assert offered(change("tool_addition", new)) == ["Read", "Grep", "Edit"]
    server = {
        "type": "tool_definition",
        "definition": {"type": "web_search_20250305", "name": "web_search"},
    }
    call = parsed(messages=[HI, change("tool_addition", server)], tools=[TOOL])
    assert call.dropped == ("web_search_20250305",)
    assert orjson.loads(call.upstream_body)["messages"][0]["content"] == "Tools changed."
    assert (
        refused(
            body(
                messages=[HI, change("tool_removal", read)],
                tools=[TOOL],
                tool_choice={"type": "tool", "name": "Read"},
            )
        )
        == "tool_choice.name"
    )
    assert refused(body(tools=[TOOL, TOOL])) == "tools[1].name"


def test_count_tokens_folds_the_same_way_and_ignores_what_does_not_count() -> None:
    raw = orjson.dumps({"model": "m", "system": "S.", "messages": [HI, REMINDER], "tools": [TOOL],
                        "thinking": {"type": "adaptive"}, "output_config": {"effort": "max"},
                        "stream": True, "max_tokens": 32000, "metadata": {"user_id": "u"},
                        "tool_choice": {"type": "any"}, "x_new": 1})  # fmt: skip
    call = parse_count_tokens_request(raw)
    assert call.messages[0] == {"role": "system",
                                "content": "S.\n\nAgent tool: delegate when asked."}  # fmt: skip
    chat = orjson.loads(call.upstream_body)
    assert not {"reasoning_effort", "stream", "tool_choice", "user"} & set(chat)
    assert call.unknown == ("x_new",) and call.chat["tools"][0]["function"]["name"] == "Read"
    with pytest.raises(InvalidRequest) as strict:
        parse_count_tokens_request(raw, "refuse")
    assert strict.value.param == "x_new"
    mcp = orjson.dumps({"model": "m", "messages": [HI], "mcp_servers": [{"type": "url"}]})
    with pytest.raises(InvalidRequest) as refused_mcp:
        parse_count_tokens_request(mcp)
    assert refused_mcp.value.param == "mcp_servers"


# -- output_config, output_format, thinking ------------------------------------------------


@pytest.mark.parametrize("effort", ["low", "medium", "high", "xhigh", "max"])
def test_output_config_effort_is_the_reasoning_effort(effort: str) -> None:
    call = parsed(output_config={"effort": effort, "task_budget": {"type": "tokens",
                                                                   "total": 9}})  # fmt: skip
    assert orjson.loads(call.upstream_body)["reasoning_effort"] == effort
    assert call.params_for_thinking == {"reasoning_effort": effort}
    assert "output_config" not in orjson.loads(call.upstream_body)


def test_effort_with_thinking_settings() -> None:
    off = sent(thinking={"type": "disabled"}, output_config={"effort": "high"})
    assert off["reasoning_effort"] == "none"
    budget = sent(
        thinking={"type": "enabled", "budget_tokens": 32}, output_config={"effort": "low"}
    )
    assert (budget["thinking_token_budget"], budget["reasoning_effort"]) == (32, "low")
    assert "reasoning_effort" not in sent(output_config={"effort": None})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
        ({"output_config": "high"}, "output_config"),
        ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format.type"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
        ({"output_format": {"type": "json_schema", "schema": []}}, "output_format.schema"),
        ({"thinking": {"type": "adaptive", "display": "full"}}, "thinking.display"),
    ],
)
def test_a_bad_output_or_thinking_setting_is_refused(fields: dict[str, Any], param: str) -> None:
    assert refused(body(**fields)) == param


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}


def test_a_json_schema_format_is_the_engines_structured_output() -> None:
    expected = {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}}
    fmt = {"type": "json_schema", "schema": SCHEMA}
    assert sent(output_config={"format": fmt})["response_format"] == expected
    assert sent(output_format=fmt)["response_format"] == expected
    other = {"type": "json_schema", "schema": {"type": "string"}}
    assert sent(output_config={"format": fmt}, output_format=other)["response_format"] == expected


@pytest.mark.parametrize(
    ("setting", "show", "omit"),
    [
        ({"type": "between_tools"}, True, False),
        ({"type": "adaptive", "display": "omitted"}, True, True),
        ({"type": "enabled", "budget_tokens": 16, "display": "omitted"}, True, True),
        ({"type": "adaptive", "display": "summarized"}, True, False),
        ({"type": "disabled"}, False, False),
    ],
)
def test_thinking_between_tools_and_display(
    setting: dict[str, Any], show: bool, omit: bool
) -> None:
    call = parsed(thinking=setting)
    assert (call.show_thinking, call.omit_thinking) == (show, omit)
    assert "thinking_token_budget" not in call.chat or setting["type"] == "enabled"


# -- context edits and the prompt's estimate ------------------------------------------------

EDITS = {"edits": [
    {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
     "keep": {"type": "tool_uses", "value": 1}, "clear_tool_inputs": True},
]}  # fmt: skip
LOOP = [HI, use("t1", "first"), result("t1"), use("t2", "second"), result("t2"),
        use("t3", "third"), result("t3")]  # fmt: skip
OPENED = {"S-t1": "first", "S-t2": "second", "S-t3": "third"}


def test_context_edits_apply_to_the_history_the_engine_gets() -> None:
    call = parse_messages_request(body(messages=LOOP, context_management=EDITS))
    assert call.context_management == {"applied_edits": []}  # nothing opened, nothing built
    built = call.build(OPENED, "reasoning_content")
    assistants = [m for m in built.messages if m["role"] == "assistant"]
    assert [m.get("reasoning_content") for m in assistants] == [None, None, "third"]
    assert [m["tool_calls"][0]["function"]["arguments"] for m in assistants] == [
        "{}", "{}", '{"path":"a"}']  # fmt: skip
    tools = [m["content"] for m in built.messages if m["role"] == "tool"]
    assert tools[:2] == [tools[0]] * 2 and tools[0].startswith("[This tool result was cleared")
    assert tools[2] == "file text " * 40
    assert orjson.loads(built.upstream_body)["messages"] == built.messages
    report = built.context_management
    assert report is not None
    thinking, uses = report["applied_edits"]
    assert (thinking["cleared_thinking_turns"], uses["cleared_tool_uses"]) == (2, 2)
    unedited = call.build(OPENED, "reasoning_content", "all")
    assert unedited.applied == built.applied  # the same request, the same edits


def test_cleared_tokens_are_measured_on_the_prompt_as_the_engine_gets_it() -> None:
    """With the model's history rule dropping reasoning, clearing it clears no token."""
    edits = {"edits": [EDITS["edits"][0]]}
    dropped = parse_messages_request(body(messages=LOOP, context_management=edits)).build(
        OPENED, "drop")  # fmt: skip
    [edit] = dropped.applied
    assert (edit.cleared, edit.cleared_input_tokens) == (2, 0)


def test_no_context_management_no_report() -> None:
    assert parsed().context_management is None and parsed().applied == ()
    compact = parsed(context_management={"edits": [{"type": "compact_20260112"}]})
    assert compact.context_management == {"applied_edits": []}


def test_the_prompt_estimate_is_the_bytes_sent_over_four_rounded_up() -> None:
    call = parsed(system="S.", tools=[TOOL])
    size = len(orjson.dumps(call.messages)) + len(orjson.dumps(call.chat["tools"]))
    assert call.prompt_tokens == prompt_estimate(call.messages, call.chat["tools"])
    assert call.prompt_tokens == -(-size // 4) and call.prompt_tokens > 0
    assert prompt_estimate([{"role": "user", "content": ""}]) == 8  # 30 bytes
    turns = [use("t1", "Thought."), result("t1")]  # built by the route: reasoning was sealed
    for pad, tools, more in itertools.product(range(4), ([TOOL], None), ([], turns)):
        asked = {"role": "user", "content": "x" * pad}  # the total a byte to four bytes more
        call = parsed(messages=[asked, *more], **({"tools": tools} if tools else {}))
        built = call.build({"S-t1": "Thought."}, "reasoning_content", "tool_turns")
        assert built.prompt_tokens == prompt_estimate(built.messages, built.chat.get("tools"))
        assert bool(call.upstream_body) == (not more)


# -- Claude Code 2.1's first request -------------------------------------------------------

CLAUDE_CODE = {
    "model": "m", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"}}],
    "messages": [REMINDER, {"role": "user", "content": [
        {"type": "text", "text": "Read the README.", "cache_control": {"type": "ephemeral"}}]}],
    "tools": [{**TOOL, "cache_control": {"type": "ephemeral"}}],
    "metadata": {"user_id": "user_abc_account_def_session_ghi"},
    "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                      "keep": {"type": "thinking_turns", "value": 1}}]},
    "cache_control": {"type": "ephemeral"}, "diagnostics": {"cache_miss": True},
    "speed": "standard", "inference_geo": "us", "service_tier": "auto",
}  # fmt: skip


def test_claude_codes_first_request_is_accepted_and_translated() -> None:
    call = parse_messages_request(orjson.dumps(CLAUDE_CODE), "refuse")  # no field unknown
    chat = orjson.loads(call.upstream_body)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\n\nAgent tool: delegate when asked."},
        {"role": "user", "content": "Read the README."},
    ]
    assert chat["reasoning_effort"] == "high" and chat["stream"] is True
    assert not {
        "metadata",
        "user",
        "cache_control",
        "diagnostics",
        "speed",
        "inference_geo",
        "service_tier",
        "output_config",
        "context_management",
        "thinking",
    } & set(chat)
    assert call.show_thinking and call.context_management == {"applied_edits": []}
    assert call.unknown == () and call.dropped == ()
