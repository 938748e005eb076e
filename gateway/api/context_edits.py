"""Anthropic's context editing (``context_management.edits``), applied to the history the engine
gets (sans-I/O).

``parse_edits(config)`` validates a request's ``context_management`` as the beta reference
types it (anthropic-sdk-python 2.15, ``types/beta/beta_context_management_config_param.py``);
``apply_edits(edits, messages, measure)`` edits the chat messages the request became, in the
order the edits are given, and says what each edit cleared (``AppliedEdit``; ``report`` is the
response's ``context_management`` object, ``{"applied_edits": [...]}``, whole and in the
streamed ``message_delta``).

Rules (Anthropic's context-editing guide where it has one):

- ``clear_thinking_20251015``: the reasoning of every assistant message but the ``keep`` most
  recent ones that carry reasoning is removed. ``keep`` is ``{"type": "thinking_turns",
  "value": N}`` (default 1), or ``"all"`` / ``{"type": "all"}``, which clears nothing. A
  thinking turn here is one assistant message with reasoning: the gateway's history has no
  other unit, and a tool loop's earlier calls are the turns a small ``keep`` means to drop.
- ``clear_tool_uses_20250919``: once ``trigger`` is passed (``{"type": "input_tokens" |
  "tool_uses", "value": N}``, default 100,000 input tokens; passed means more than N), every
  tool use but the ``keep`` most recent (``{"type": "tool_uses", "value": N}``, default 3) has
  its result replaced by ``PLACEHOLDER``, oldest first, except uses of a tool in
  ``exclude_tools``. ``clear_tool_inputs``: ``true`` also empties the call's arguments to
  ``{}``, a list of names does so for those tools only (default: results only). With
  ``clear_at_least`` (``{"type": "input_tokens", "value": N}``) the edit is applied only if it
  clears at least N tokens, else not at all.
- ``compact_*`` edits are accepted without effect (the engine writes no summary block here);
  any other type is refused naming it.
- An edit appears in ``applied_edits`` only when it cleared something: ``cleared_thinking_turns``
  or ``cleared_tool_uses``, and ``cleared_input_tokens``, the difference of the prompt's
  estimate before and after the edit (``measure``: the gateway's estimate everywhere, the
  bytes of the chat body sent divided by 4, not a tokenizer's count).
- Only counts leave this module, never a cleared text: a key that may not see reasoning learns
  nothing from a report but numbers (the length of its sealed reasoning is no secret to it).
- The client keeps its full history: nothing here is stored, every request is edited afresh,
  as Anthropic does server-side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import InvalidRequest

CLEAR_THINKING = "clear_thinking_20251015"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
PLACEHOLDER = "[This tool result was cleared from the context to save room.]"
_PARAM = "context_management"

Messages = list[dict[str, Any]]
Measure = Callable[[Messages], int]  # the estimated input tokens of a prompt of these messages
TriggerKind = Literal["input_tokens", "tool_uses"]


@dataclass(frozen=True, slots=True)
class AppliedEdit:
    """What one edit cleared."""

    type: str
    cleared: int  # thinking turns or tool uses
    cleared_input_tokens: int

    def report(self) -> dict[str, Any]:
        what = "cleared_thinking_turns" if self.type == CLEAR_THINKING else "cleared_tool_uses"
        return {"type": self.type, what: self.cleared,
                "cleared_input_tokens": self.cleared_input_tokens}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClearThinking:
    keep: int | None = 1  # the most recent thinking turns kept; None: all of them

    def apply(self, messages: Messages, measure: Measure) -> tuple[Messages, AppliedEdit | None]:
        if self.keep is None:
            return messages, None
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"
                 and m.get("reasoning")]  # fmt: skip
        cleared = turns[: max(0, len(turns) - self.keep)]
        if not cleared:
            return messages, None
        out = list(messages)
        for index in cleared:
            out[index] = {k: v for k, v in out[index].items() if k != "reasoning"}
        return out, AppliedEdit(CLEAR_THINKING, len(cleared), measure(messages) - measure(out))


@dataclass(frozen=True, slots=True)
class _Use:
    """One tool call of the history: where it is, and its tool."""

    message: int
    call: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    trigger: tuple[TriggerKind, int] = ("input_tokens", 100_000)
    keep: int = 3
    clear_at_least: int = 0
    exclude: frozenset[str] = frozenset()
    inputs: bool | frozenset[str] = False  # clear_tool_inputs

    def apply(self, messages: Messages, measure: Measure) -> tuple[Messages, AppliedEdit | None]:
        uses = _uses(messages)
        kind, limit = self.trigger
        if (len(uses) if kind == "tool_uses" else measure(messages)) <= limit:
            return messages, None
        older = uses[: max(0, len(uses) - self.keep)]
        cleared = [use for use in older if use.name not in self.exclude]
        if not cleared:
            return messages, None
        out = _cleared(messages, cleared, self.inputs)
        gained = measure(messages) - measure(out)
        if gained < self.clear_at_least:
            return messages, None
        return out, AppliedEdit(CLEAR_TOOL_USES, len(cleared), gained)


Edit = ClearThinking | ClearToolUses


def apply_edits(
    edits: tuple[Edit, ...], messages: Messages, measure: Measure
) -> tuple[Messages, tuple[AppliedEdit, ...]]:
    """The messages with each edit applied in turn, and the edits that cleared something."""
    applied: list[AppliedEdit] = []
    for edit in edits:
        messages, done = edit.apply(messages, measure)
        if done is not None:
            applied.append(done)
    return messages, tuple(applied)


def report(applied: tuple[AppliedEdit, ...]) -> dict[str, Any]:
    """The response's ``context_management`` object."""
    return {"applied_edits": [edit.report() for edit in applied]}


def _uses(messages: Messages) -> list[_Use]:
    """Every tool call of the assistant messages, oldest first."""
    uses: list[_Use] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        for j, call in enumerate(message.get("tool_calls") or ()):
            uses.append(_Use(index, j, call["id"], call["function"]["name"]))
    return uses


def _cleared(messages: Messages, uses: list[_Use], inputs: bool | frozenset[str]) -> Messages:
    """The messages with these uses' results replaced, and their arguments where asked."""
    ids = {use.id for use in uses}
    out = [{**m, "content": PLACEHOLDER} if m.get("role") == "tool" and m.get("tool_call_id")
           in ids else m for m in messages]  # fmt: skip
    for use in uses:
        if inputs is True or (isinstance(inputs, frozenset) and use.name in inputs):
            message = out[use.message]
            calls = [dict(c) for c in message["tool_calls"]]
            calls[use.call] = {
                **calls[use.call],
                "function": {**calls[use.call]["function"], "arguments": "{}"},
            }
            out[use.message] = {**message, "tool_calls": calls}  # fmt: skip
    return out


# -- the request's context_management ------------------------------------------------------


def parse_edits(config: Any) -> tuple[Edit, ...]:
    """The edits a request's ``context_management`` asks for; ``InvalidRequest`` naming the
    field that is not as the reference types it."""
    if config is None:
        return ()
    if not isinstance(config, dict):
        raise _bad(_PARAM, "an object with 'edits'")
    edits = config.get("edits")
    if edits is None:
        return ()
    if not isinstance(edits, list):
        raise _bad(f"{_PARAM}.edits", "a list of edits")
    parsed = [_edit(edit, f"{_PARAM}.edits[{i}]") for i, edit in enumerate(edits)]
    return tuple(edit for edit in parsed if edit is not None)


def _edit(raw: Any, param: str) -> Edit | None:
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == CLEAR_THINKING:
        return ClearThinking(_thinking_keep(raw.get("keep"), f"{param}.keep"))
    if kind == CLEAR_TOOL_USES:
        return _clear_tool_uses(raw, param)
    if isinstance(kind, str) and kind.startswith("compact_"):
        return None  # accepted without effect: no summary is written here
    raise _bad(f"{param}.type", f"one of {CLEAR_THINKING}, {CLEAR_TOOL_USES}, compact_20260112")


def _thinking_keep(raw: Any, param: str) -> int | None:
    if raw is None:
        return 1
    if raw == "all" or (isinstance(raw, dict) and raw.get("type") == "all"):
        return None
    return _amount(raw, ("thinking_turns",), param)[1]


def _clear_tool_uses(raw: dict[str, Any], param: str) -> ClearToolUses:
    defaults = ClearToolUses()
    kind, limit = _amount(raw.get("trigger"), ("input_tokens", "tool_uses"),
                          f"{param}.trigger", defaults.trigger)  # fmt: skip
    keep = _amount(raw.get("keep"), ("tool_uses",), f"{param}.keep", ("", defaults.keep))
    least = _amount(raw.get("clear_at_least"), ("input_tokens",), f"{param}.clear_at_least",
                    ("", defaults.clear_at_least))  # fmt: skip
    return ClearToolUses(
        trigger=("tool_uses" if kind == "tool_uses" else "input_tokens", limit),
        keep=keep[1],
        clear_at_least=least[1],
        exclude=frozenset(_names(raw.get("exclude_tools"), f"{param}.exclude_tools")),
        inputs=_inputs(raw.get("clear_tool_inputs"), f"{param}.clear_tool_inputs"),
    )


def _amount(
    raw: Any, kinds: tuple[str, ...], param: str, default: tuple[str, int] | None = None
) -> tuple[str, int]:
    """A ``{"type": kind, "value": N}`` object's kind and N (a non-negative integer); the
    default when it is absent or null (and there is one)."""
    if raw is None and default is not None:
        return default
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in kinds:
        raise _bad(f"{param}.type", f"one of {', '.join(kinds)}")
    value = raw.get("value")
    if type(value) is not int or value < 0:
        raise _bad(f"{param}.value", "a non-negative integer")
    return kind, value


def _names(raw: Any, param: str) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise _bad(param, "a list of tool names")
    return raw


def _inputs(raw: Any, param: str) -> bool | frozenset[str]:
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    return frozenset(_names(raw, param))


def _bad(param: str, expected: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: expected {expected}.", param=param)
