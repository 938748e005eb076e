"""The tool call a chat request makes, if any: vLLM with ``--enable-auto-tool-choice
--tool-call-parser`` (sans-I/O).

``plan_tool(data, turn, arguments) -> ToolPlan | None`` for a request body ``data``, the
``NextTurn`` its messages end with (``gateway.side.sim.turn``) and ``sim.tool_arguments``.

Rules:

- ``tools`` is a list of ``{"type": "function", "function": {"name", "description"?,
  "parameters"?}}`` (else 400); ``tool_choice`` is ``"none"``, ``"auto"`` (the default with
  tools), ``"required"`` or ``{"type": "function", "function": {"name"}}`` naming one of them
  (else 400); a ``tool_choice`` other than ``"none"`` needs ``tools``.
- Whether the model calls, and what:

  ``none``      never.
  ``auto``      only when the user asks (the conversation ends with the user's message:
                ``NextTurn.asks``) and a tool fits the question (``sim.fit``); otherwise
                it answers in prose. After a tool result it answers, so an agent loop ends in
                two steps: question → call, result → answer.
  ``required``  the tool that fits, else the first; a named function: that one. vLLM forces
                these by guided decoding, whatever the conversation.

- Arguments: ``sim.tool_arguments`` (an object) if given, else sampled from the tool's
  schema with the question's hints (``gateway.side.sim.arguments``). The call id is a fresh
  ``chatcmpl-tool-<hex>``; each further choice calls under its own (``ToolPlan.again``).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from gateway.side.sim.arguments import sample_arguments
from gateway.side.sim.errors import bad_request
from gateway.side.sim.fit import Tool, fit_tool, hints_for
from gateway.side.sim.script import ScriptedCall, ToolPlan, new_call_id
from gateway.side.sim.turn import NextTurn

__all__ = ["parse_tools", "plan_tool"]

Choice = Literal["none", "auto", "required"] | Tool


def plan_tool(
    data: dict[str, Any], turn: NextTurn, arguments: dict[str, Any] | None
) -> ToolPlan | None:
    """The call the model makes (rules in the module docstring)."""
    tools = parse_tools(data.get("tools"))
    choice = _choice(data.get("tool_choice", "auto" if tools else "none"), tools)
    tool = _pick(choice, tools, turn)
    if tool is None:
        return None
    if arguments is None:
        arguments = sample_arguments(tool.parameters, hints_for(turn.question))
    return ToolPlan(ScriptedCall(new_call_id(), tool.name), orjson.dumps(arguments).decode())


def parse_tools(raw: object) -> dict[str, Tool]:
    """The request's function tools by name, in order."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise bad_request("'tools' must be a list", "tools")
    tools = [_tool(item) for item in raw]
    return {tool.name: tool for tool in tools}


def _tool(item: object) -> Tool:
    function = item.get("function") if isinstance(item, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(item, dict) or item.get("type") != "function" or not name:
        raise bad_request("each tool must be {'type': 'function', 'function': {'name': ...}}",
                          "tools")  # fmt: skip
    if not isinstance(name, str) or not isinstance(function, dict):
        raise bad_request("a tool's name must be a string", "tools")
    description, parameters = function.get("description"), function.get("parameters")
    return Tool(name, description if isinstance(description, str) else "",
                parameters if isinstance(parameters, dict) else {})  # fmt: skip


def _choice(choice: object, tools: dict[str, Tool]) -> Choice:
    """The request's ``tool_choice``: a mode, or the named tool."""
    if isinstance(choice, dict):
        function = choice.get("function")
        named = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(named, str) or named not in tools:
            raise bad_request("'tool_choice' must name a function in 'tools'", "tool_choice")
        return tools[named]
    if choice not in ("none", "auto", "required"):
        raise bad_request("'tool_choice' must be none, auto, required or a named function",
                          "tool_choice")  # fmt: skip
    if choice != "none" and not tools:
        raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
    return "none" if choice == "none" else "auto" if choice == "auto" else "required"


def _pick(choice: Choice, tools: dict[str, Tool], turn: NextTurn) -> Tool | None:
    if isinstance(choice, Tool):
        return choice
    if choice == "none" or (choice == "auto" and not turn.asks):
        return None
    fitting = fit_tool(turn.question, list(tools.values()))
    if choice == "required":
        return fitting or next(iter(tools.values()))
    return fitting
