"""A Messages request's ``tools`` and ``tool_choice``, as chat's function tools (sans-I/O).

``tooling(body, strict) -> Tooling``:

- Client tools (``type`` absent or ``custom``: ``name``, ``description``, ``input_schema``;
  ``cache_control``, ``strict`` and the like accepted and ignored) become function tools.
- Every other ``type`` is a tool Anthropic defines and runs or describes itself
  (``web_search_*``, ``code_execution_*``, ``bash_*``, ``text_editor_*``, MCP toolsets, ...):
  the engine knows none of them. They are dropped, their types named in ``Tooling.dropped``
  for the route's notice (the ``x-thinkgate-dropped-tools`` header and a log line, as on
  Responses: ``gateway.api.tools.DROPPED_HEADER``); refused naming ``tools[i].type`` when
  strict (``UNKNOWN_FIELDS=refuse``).
- Tool names are unique, as the reference requires (a second one is refused naming it).
- The system messages' tool changes (``gateway.api.messages.system.ToolChange``) apply in
  order: a ``tool_removal`` withdraws a tool, a ``tool_addition`` offers again one declared or
  defined before (``tool_reference``) or a new one (``tool_definition``, translated as a
  ``tools`` entry). The engine is offered the set in force at the end of the conversation.
  Tools declared with ``defer_loading`` are offered from the start (no tool search runs here).
- ``tool_choice`` ``auto`` / ``any`` (→ ``required``) / ``tool`` (a client tool offered) /
  ``none``; ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.api.messages.system import ToolChange
from gateway.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class Tooling:
    chat: dict[str, Any] = field(default_factory=dict)  # tools, tool_choice, parallel_tool_calls
    dropped: tuple[str, ...] = ()  # the types of the server tools left out, each named once


def tooling(body: dict[str, Any], strict: bool, changes: tuple[ToolChange, ...] = ()) -> Tooling:
    """The chat fields of the request's tools, as the system messages' tool changes leave
    them (rules in the module docstring)."""
    raw = body.get("tools")
    offer = _Offer(strict)
    if raw is not None:
        if not isinstance(raw, list):
            raise InvalidRequest("tools: Input should be a valid list", param="tools")
        for i, tool in enumerate(raw):
            offer.declare(tool, f"tools[{i}]")
    for change in changes:
        offer.change(change)
    chat: dict[str, Any] = {"tools": list(offer.offered.values())} if offer.offered else {}
    choice = body.get("tool_choice")
    if choice is not None:
        chat.update(_tool_choice(choice, set(offer.offered)))
    return Tooling(chat, tuple(dict.fromkeys(offer.dropped)))


class _Offer:
    """The tools offered to the engine, by name, in order, as declarations and changes go."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.offered: dict[str, dict[str, Any]] = {}
        self.known: dict[str, dict[str, Any]] = {}  # every client tool declared or defined
        self.servers: set[str] = set()  # names of the server tools left out
        self.dropped: list[str] = []

    def declare(self, tool: Any, param: str) -> None:
        kind = _kind(tool, param, self.strict)
        if kind is not None:
            self.dropped.append(kind)
            self.servers.add(str(tool.get("name")))
            return
        chat = _tool(tool, param)
        name = chat["function"]["name"]
        if name in self.known or name in self.servers:
            raise InvalidRequest(f"{param}.name: tool names must be unique ('{name}')",
                                 param=f"{param}.name")  # fmt: skip
        self.known[name] = self.offered[name] = chat

    def change(self, change: ToolChange) -> None:
        if change.definition is not None:
            self.declare(change.definition, f"{change.param}.tool.definition")
            return
        name = change.name or ""
        if name in self.servers:
            return  # a server tool: left out whatever the change
        if name not in self.known:
            raise InvalidRequest(
                f"{change.param}.tool.name: no tool '{name[:64]}' was declared "
                "in tools or defined before",
                param=f"{change.param}.tool.name",
            )
        if change.add:
            self.offered[name] = self.known[name]
        else:
            self.offered.pop(name, None)


def _kind(tool: Any, param: str, strict: bool) -> str | None:
    """``None`` for a client tool; the type of a tool this gateway cannot offer."""
    if not isinstance(tool, dict):
        raise InvalidRequest(f"{param}: Input should be an object", param=param)
    kind = tool.get("type")
    if kind in (None, "custom"):
        return None
    shown = "".join(c if c.isprintable() and c != "," else "?" for c in str(kind)[:64])
    if strict:
        raise InvalidRequest(f"{param}.type: server tool '{shown}' is not supported by this "
                             "gateway; only custom tools with an input_schema",
                             param=f"{param}.type")  # fmt: skip
    return shown


def _tool(tool: dict[str, Any], param: str) -> dict[str, Any]:
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{param}.name: Field required", param=f"{param}.name")
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}.input_schema: Field required",
                             param=f"{param}.input_schema")  # fmt: skip
    function: dict[str, Any] = {"name": name, "parameters": schema}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, names: set[str]) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise InvalidRequest("tool_choice.type: one of auto, any, tool, none",
                             param="tool_choice.type")  # fmt: skip
    out: dict[str, Any] = {}
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise InvalidRequest("tool_choice.name: no such tool", param="tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out
