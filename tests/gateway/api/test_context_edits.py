"""Anthropic's context edits on a chat history: which reasoning and tool results are cleared, by
``keep``, ``trigger``, ``clear_at_least``, ``exclude_tools`` and ``clear_tool_inputs``, what
the report says, and the validation of each parameter."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.context_edits import (
    PLACEHOLDER,
    AppliedEdit,
    ClearThinking,
    ClearToolUses,
    apply_edits,
    parse_edits,
    report,
)
from gateway.errors import InvalidRequest

Messages = list[dict[str, Any]]


def measure(messages: Messages) -> int:
    return len(orjson.dumps(messages)) // 4


def call(call_id: str, name: str, arguments: str = '{"path":"README.md"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def loop(*names: str, reasoning: bool = True) -> Messages:
    """A user question, then per name an assistant turn (with reasoning) calling that tool and
    its result, then the answer."""
    out: Messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Go."}]
    for i, name in enumerate(names):
        turn: dict[str, Any] = {"role": "assistant", "content": None,
                                "tool_calls": [call(f"t{i}", name)]}  # fmt: skip
        if reasoning:
            turn["reasoning"] = f"thought {i} " * 20
        out += [turn, {"role": "tool", "tool_call_id": f"t{i}", "content": f"result {i} " * 50}]
    return out


def results(messages: Messages) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


def test_clear_thinking_keeps_the_most_recent_thinking_turns() -> None:
    history = loop("Read", "Grep", "Read")
    edited, (done,) = apply_edits((ClearThinking(keep=1),), history, measure)
    assert ["reasoning" in m for m in edited if m["role"] == "assistant"] == [False, False, True]
    assert done == AppliedEdit("clear_thinking_20251015", 2, measure(history) - measure(edited))
    assert done.cleared_input_tokens > 0
    assert "reasoning" in history[2]  # the client's history is not touched
    two, (kept_two,) = apply_edits((ClearThinking(keep=2),), history, measure)
    assert kept_two.cleared == 1 and "reasoning" in two[4]
    zero, (all_gone,) = apply_edits((ClearThinking(keep=0),), history, measure)
    assert all_gone.cleared == 3 and not any("reasoning" in m for m in zero)


@pytest.mark.parametrize("edit", [ClearThinking(keep=None), ClearThinking(keep=3)])
def test_clear_thinking_that_keeps_every_turn_is_not_applied(edit: ClearThinking) -> None:
    history = loop("Read", "Grep", "Read")
    assert apply_edits((edit,), history, measure) == (history, ())


def test_clear_tool_uses_replaces_all_but_the_most_recent_results() -> None:
    history = loop("Read", "Grep", "Read", "Bash", "Read")
    edit = ClearToolUses(trigger=("tool_uses", 4), keep=2)
    edited, (done,) = apply_edits((edit,), history, measure)
    assert results(edited) == [PLACEHOLDER] * 3 + results(history)[3:]
    assert done.type == "clear_tool_uses_20250919" and done.cleared == 3
    assert done.cleared_input_tokens == measure(history) - measure(edited) > 0
    # the calls themselves stay, with their arguments
    assert [m["tool_calls"] for m in edited if m.get("tool_calls")] == [
        m["tool_calls"] for m in history if m.get("tool_calls")]  # fmt: skip


@pytest.mark.parametrize(
    ("trigger", "applied"),
    [(("tool_uses", 5), False), (("tool_uses", 4), True), (("input_tokens", 10**6), False),
     (("input_tokens", 100), True)],
)  # fmt: skip
def test_clear_tool_uses_waits_for_its_trigger_to_be_passed(trigger: Any, applied: bool) -> None:
    history = loop("Read", "Grep", "Read", "Bash", "Read")
    edited, done = apply_edits((ClearToolUses(trigger=trigger, keep=1),), history, measure)
    assert bool(done) is applied and (edited != history) is applied


def test_excluded_tools_are_never_cleared_and_inputs_only_where_asked() -> None:
    history = loop("Read", "Grep", "Bash", "Read")
    edit = ClearToolUses(trigger=("tool_uses", 0), keep=1, exclude=frozenset({"Grep"}),
                         inputs=frozenset({"Bash"}))  # fmt: skip
    edited, (done,) = apply_edits((edit,), history, measure)
    assert results(edited) == [PLACEHOLDER, results(history)[1], PLACEHOLDER, results(history)[3]]
    arguments = [m["tool_calls"][0]["function"]["arguments"] for m in edited
                 if m.get("tool_calls")]  # fmt: skip
    assert arguments == ['{"path":"README.md"}', '{"path":"README.md"}', "{}",
                         '{"path":"README.md"}']  # fmt: skip
    assert done.cleared == 2
    every, _ = apply_edits((ClearToolUses(trigger=("tool_uses", 0), keep=0, inputs=True),),
                           history, measure)  # fmt: skip
    assert all(c["function"]["arguments"] == "{}" for m in every for c in m.get("tool_calls", []))


def test_clear_at_least_applies_the_edit_only_if_it_clears_that_much() -> None:
    history = loop("Read", "Grep", "Read")
    gain = apply_edits((ClearToolUses(trigger=("tool_uses", 0), keep=1),), history, measure)[1]
    enough = ClearToolUses(trigger=("tool_uses", 0), keep=1,
                           clear_at_least=gain[0].cleared_input_tokens)  # fmt: skip
    assert apply_edits((enough,), history, measure)[1]
    too_much = ClearToolUses(trigger=("tool_uses", 0), keep=1,
                             clear_at_least=gain[0].cleared_input_tokens + 1)  # fmt: skip
    assert apply_edits((too_much,), history, measure) == (history, ())


def test_edits_apply_in_order_and_report_as_anthropic_does() -> None:
    history = loop("Read", "Grep", "Read")
    edits = parse_edits({"edits": [
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
         "keep": {"type": "tool_uses", "value": 1}},
        {"type": "compact_20260112"},
    ]})  # fmt: skip
    edited, applied = apply_edits(edits, history, measure)
    shown = report(applied)
    assert [e["type"] for e in shown["applied_edits"]] == [
        "clear_thinking_20251015", "clear_tool_uses_20250919"]  # fmt: skip
    thinking, tools = shown["applied_edits"]
    assert thinking["cleared_thinking_turns"] == 2 and tools["cleared_tool_uses"] == 2
    total = thinking["cleared_input_tokens"] + tools["cleared_input_tokens"]
    assert total == measure(history) - measure(edited)
    assert set(thinking) == {"type", "cleared_thinking_turns", "cleared_input_tokens"}
    assert report(()) == {"applied_edits": []}


def test_defaults_are_the_references() -> None:
    thinking, tools = parse_edits({"edits": [{"type": "clear_thinking_20251015"},
                                             {"type": "clear_tool_uses_20250919"}]})  # fmt: skip
    assert thinking == ClearThinking(keep=1)
    assert tools == ClearToolUses(("input_tokens", 100_000), 3, 0, frozenset(), False)
    assert parse_edits({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}) == (
        ClearThinking(keep=None),)  # fmt: skip
    assert parse_edits({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "all"}}]}
                       ) == (ClearThinking(keep=None),)  # fmt: skip
    assert parse_edits(None) == parse_edits({}) == parse_edits({"edits": None}) == ()
    full = parse_edits({"edits": [{
        "type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 7},
        "keep": {"type": "tool_uses", "value": 2},
        "clear_at_least": {"type": "input_tokens", "value": 500},
        "exclude_tools": ["Grep"], "clear_tool_inputs": ["Bash"]}]})  # fmt: skip
    assert full == (ClearToolUses(("tool_uses", 7), 2, 500, frozenset({"Grep"}),
                                  frozenset({"Bash"})),)  # fmt: skip


@pytest.mark.parametrize(
    ("config", "param"),
    [
        ("clear", "context_management"),
        ({"edits": {}}, "context_management.edits"),
        ({"edits": [{"type": "clear_everything"}]}, "context_management.edits[0].type"),
        ({"edits": ["clear_thinking_20251015"]}, "context_management.edits[0].type"),
        ({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "tool_uses",
                                                                 "value": 1}}]},
         "context_management.edits[0].keep.type"),
        ({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns",
                                                                 "value": -1}}]},
         "context_management.edits[0].keep.value"),
        ({"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens",
                                                                     "value": "many"}}]},
         "context_management.edits[0].trigger.value"),
        ({"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "thinking_turns",
                                                                  "value": 1}}]},
         "context_management.edits[0].keep.type"),
        ({"edits": [{"type": "clear_tool_uses_20250919", "clear_at_least": {"type": "tool_uses",
                                                                            "value": 1}}]},
         "context_management.edits[0].clear_at_least.type"),
        ({"edits": [{"type": "clear_tool_uses_20250919", "exclude_tools": "Read"}]},
         "context_management.edits[0].exclude_tools"),
        ({"edits": [{"type": "clear_tool_uses_20250919", "clear_tool_inputs": [1]}]},
         "context_management.edits[0].clear_tool_inputs"),
    ],
)  # fmt: skip
def test_a_malformed_edit_is_refused_naming_its_field(config: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_edits(config)
    assert refused.value.param == param
