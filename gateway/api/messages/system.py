"""A Messages request's system prompt: the ``system`` field and the ``role: "system"`` messages
inside ``messages`` (sans-I/O).

``system_texts(system)`` begins a ``SystemTexts`` with the ``system`` field; ``add`` takes each
system message in order as ``gateway.api.messages.turns`` walks the turns, and ``prompt`` gives
the ``SystemPrompt``: the one text the leading chat system message carries, and the tool changes
the system messages make.

- ``system`` (a string or text blocks, their ``cache_control`` accepted and ignored; blocks
  joined with a newline) and every ``role: "system"`` message inside ``messages`` (Claude Code
  sends them while its Agent or Skill tool is on) become **one leading system message**, their
  texts in the order given, separated by a blank line. Why one, at the start: most chat
  templates (Llama 3, Qwen, DeepSeek, Mistral) render a system message only in first place and
  refuse or drop one anywhere else, and vLLM applies the model's template as it is. What is
  lost is the position: a reminder sent after a user turn reads, to the model, as part of its
  instructions, which is what it is.
- ``clear_at: "next_user_message"`` is honoured as the reference defines it: once a ``user``
  message follows the system message, its text is no longer shown to the model. ``never`` (the
  default) shows it on every request that includes it.
- A system message's ``output_config`` is accepted without effect: the request's own
  ``output_config.effort`` sets the budget of the one answer the engine writes.
- ``tool_addition`` and ``tool_removal`` blocks (the mid-conversation tool changes beta) are
  ``ToolChange``s, in order, for ``gateway.api.messages.tools`` to apply to the tools offered
  (a chat engine is offered one set of tools, so the set in force at the end is the one it
  gets). ``tool_reference`` names a tool; ``tool_definition`` carries a ``tools`` entry; the
  MCP references are refused: no MCP server is connected here (``mcp_servers`` is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.messages.text import content_of, text
from gateway.errors import InvalidRequest

_CLEAR_AT = (None, "never", "next_user_message")
_CHANGES = ("tool_addition", "tool_removal")


@dataclass(frozen=True, slots=True)
class ToolChange:
    """One ``tool_addition`` or ``tool_removal`` block."""

    add: bool
    param: str  # where the block is, for an error that names it
    name: str | None = None  # a tool_reference's tool
    definition: dict[str, Any] | None = None  # a tool_definition's tools entry


@dataclass(frozen=True, slots=True)
class SystemPrompt:
    text: str  # the leading system message's text ("" when there is none)
    tool_changes: tuple[ToolChange, ...] = ()


@dataclass(slots=True)
class SystemTexts:
    """The system texts gathered in order while the turns are walked: the ``system`` field's
    (``system_texts``), then each system message's (``add``); ``prompt`` once the last user
    message is known."""

    said: list[tuple[str, int | None]]  # a text, and its index if cleared at the next user turn
    changes: list[ToolChange]

    def add(self, message: dict[str, Any], i: int) -> None:
        """``messages[i]``, a ``role: "system"`` message (validated here)."""
        param = f"messages[{i}]"
        clear_at = message.get("clear_at")
        if clear_at not in _CLEAR_AT:
            raise InvalidRequest(f"{param}.clear_at: one of never, next_user_message",
                                 param=f"{param}.clear_at")  # fmt: skip
        said = _message(content_of(message.get("content", ""), f"{param}.content"),
                        f"{param}.content", self.changes)  # fmt: skip
        self.said.append((said, i if clear_at == "next_user_message" else None))

    def prompt(self, last_user: int) -> SystemPrompt:
        """The texts still shown, now that ``messages[last_user]`` is known to be the last user
        message (-1: none), joined."""
        shown = [t for t, cleared in self.said if t and (cleared is None or cleared > last_user)]
        return SystemPrompt("\n\n".join(shown), tuple(self.changes))


def system_texts(system: Any) -> SystemTexts:
    """The gathering, begun with the ``system`` field (a string or text blocks; validated)."""
    if system is None:
        return SystemTexts([], [])
    if isinstance(system, list):
        said = "\n".join(text(block, f"system[{i}]") for i, block in enumerate(system))
    elif isinstance(system, str):
        said = system
    else:
        raise InvalidRequest("system: a string or a list of text blocks", param="system")
    return SystemTexts([(said, None)], [])


def _message(content: str | list[Any], param: str, changes: list[ToolChange]) -> str:
    """A system message's text; its tool changes appended to ``changes``."""
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in _CHANGES:
            changes.append(_change(block, f"{param}[{j}]"))
        else:
            texts.append(text(block, f"{param}[{j}]"))
    return "\n".join(texts)


def _change(block: dict[str, Any], param: str) -> ToolChange:
    add = block["type"] == "tool_addition"
    tool = block.get("tool")
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind == "tool_reference" and isinstance(tool, dict):
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"{param}.tool.name: Field required", param=f"{param}.tool.name")
        return ToolChange(add, param, name=name)
    if kind == "tool_definition" and add and isinstance(tool, dict):
        definition = tool.get("definition")
        if not isinstance(definition, dict):
            raise InvalidRequest(f"{param}.tool.definition: a tools entry",
                                 param=f"{param}.tool.definition")  # fmt: skip
        return ToolChange(add, param, definition=definition)
    raise InvalidRequest(f"{param}.tool.type: '{kind}' is not supported by this gateway: a "
                         "tool_reference, or a tool_definition added (no MCP server is "
                         "connected here)", param=f"{param}.tool.type")  # fmt: skip
