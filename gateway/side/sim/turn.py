"""Where a conversation stands: what the user asked, and whether a tool result awaits an
answer (sans-I/O).

``read_turn(messages) -> NextTurn`` reads a chat request's messages (already checked to be
objects whose content is a string or a list of parts, ``gateway.side.sim.request``).

Rules:

- Agent clients wrap context into the user's turn: Claude Code's ``<system-reminder>`` blocks,
  Codex's ``<environment_context>``, ``<user_instructions>``, ``<permissions instructions>``.
  A *wrapper block* is a paired tag (``<name ...>`` … ``</name ...>``, same name, any content,
  across lines) that opens at the start of a line and closes at the end of one; it is removed
  before anything is read (``strip_wrappers``). A tag inside a sentence (``what does <b>x</b>
  do?``) is text, not a wrapper.
- A message's *text* is its content with wrapper blocks removed and whitespace trimmed; for a
  list of parts, the last part whose text is not empty (the question follows the context).
- The *decisive* message is the last one that is neither ``system`` / ``developer`` (Claude
  Code sends ``role: "system"`` inside ``messages``) nor a ``user`` message with no text (only
  wrappers: Claude Code sends a reminder next to each tool result). Then:
  ``user`` → the user asks (``NextTurn.asks``: a tool may be called); ``tool`` (or legacy
  ``function``) → a result awaits its answer (``NextTurn.result``: the last result, named after
  the assistant's call it answers); ``assistant`` → the model continues its own turn.
- ``NextTurn.question`` is the text of the last ``user`` message that has one (``""`` if none):
  what the model talks about, before and after its tool calls.
- A result's text is all its parts, wrapper blocks removed (Claude Code appends reminders to
  results); a result that is nothing but wrappers (``<tool_use_error>...</tool_use_error>``)
  keeps their text, its tags removed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["NextTurn", "ToolResult", "read_turn", "strip_wrappers"]

_WRAPPER = re.compile(
    r"^[ \t]*<(?P<tag>[A-Za-z][\w.:-]*)(?:\s[^<>]*)?>.*?</(?P=tag)(?:\s[^<>]*)?>[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_TAG = re.compile(r"</?[A-Za-z][\w.:-]*(?:\s[^<>]*)?>")
_SKIPPED_ROLES = frozenset({"system", "developer"})
_RESULT_ROLES = frozenset({"tool", "function"})


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's output the model answers: the function's name and the result's text."""

    name: str
    text: str


@dataclass(frozen=True, slots=True)
class NextTurn:
    """What the model is asked to do now."""

    question: str = ""
    asks: bool = False  # the conversation ends with the user's question
    result: ToolResult | None = None  # the tool result the model answers, if that is the turn


def strip_wrappers(text: str) -> str:
    """``text`` without its wrapper blocks, trimmed."""
    return _WRAPPER.sub("", text).strip()


def read_turn(messages: Sequence[Any]) -> NextTurn:
    """The turn ``messages`` end with (rules in the module docstring)."""
    question = _last_question(messages)
    for at in range(len(messages) - 1, -1, -1):
        message = messages[at]
        role = message.get("role") if isinstance(message, dict) else None
        if role in _SKIPPED_ROLES or (role == "user" and not message_text(message)):
            continue
        if role in _RESULT_ROLES:
            return NextTurn(question, asks=False, result=_result(messages, at))
        return NextTurn(question, asks=role == "user")
    return NextTurn(question)


def message_text(message: Any) -> str:
    """A message's text: its content without wrappers; of a list of parts, the last with text."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return strip_wrappers(content)
    if not isinstance(content, list):
        return ""
    for part in reversed(content):
        text = part.get("text") if isinstance(part, dict) else None
        stripped = strip_wrappers(text) if isinstance(text, str) else ""
        if stripped:
            return stripped
    return ""


def _last_question(messages: Sequence[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            text = message_text(message)
            if text:
                return text
    return ""


def _result(messages: Sequence[Any], at: int) -> ToolResult:
    """The result at ``at``, named after the call it answers (else its own ``name``)."""
    message = messages[at]
    name = _call_name(messages[:at], message.get("tool_call_id")) or message.get("name")
    text = _result_text(message.get("content"))
    return ToolResult(name if isinstance(name, str) and name else "tool", text)


def _call_name(messages: Sequence[Any], call_id: object) -> str | None:
    """The function of the latest assistant call with id ``call_id``."""
    for earlier in reversed(messages):
        for call in _calls(earlier):
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if call.get("id") == call_id and isinstance(name, str) and name:
                return name
    return None


def _calls(message: Any) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _result_text(content: object) -> str:
    """A tool result's whole text (every part), wrappers removed unless that leaves nothing."""
    if isinstance(content, list):
        content = "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        return ""
    return strip_wrappers(content) or _TAG.sub("", content).strip()
