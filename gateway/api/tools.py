"""Responses tools as the function tools a chat engine takes, and its calls mapped back
(sans-I/O).

``translate_tools(raw, unknown) -> Tools``: the request's ``tools`` (OpenAI API reference,
"Responses", ``tools``), each type as follows:

- ``function`` (``name``, ``description``, ``parameters``, ``strict``): a chat function tool.
  ``defer_loading`` is ignored: no tool search runs here, so every function is offered at once.
- ``namespace`` (``name``, ``description``, ``tools``: functions and custom tools; Codex CLI
  groups its MCP servers' and connectors' tools so): each inner tool is flattened to a
  top-level function named ``flat_name(namespace, name)``, ``<namespace>__<name>``, or
  ``<namespace><name>`` when the namespace already ends in ``__`` (Codex's ``mcp__server__``
  then gives the ``mcp__server__tool`` names its models were trained on). The namespace's
  description leads each inner tool's.
- ``custom`` (free-form: ``name``, ``description``, ``format``): a function with one string
  parameter, ``{"input": string}`` (``custom_arguments``). A grammar ``format`` (``lark``,
  ``regex``) is told to the model in the description; nothing constrains the engine to it.
- Built-in tools the gateway cannot run (``DROPPED``: web search, file search, code
  interpreter, image generation, computer use, tool search, programmatic tool calling) are
  dropped, named in ``Tools.dropped`` for the route's notice (``DROPPED_HEADER``, and its
  log), or refused naming ``tools[i].type`` when ``UNKNOWN_FIELDS=refuse``. ``mcp``,
  ``shell``, ``local_shell`` and ``apply_patch`` (``REFUSED``) are always refused: the client
  expects calls of kinds the engine cannot make, or a server's tools the model would not have.
- Flat names are unique: a tool whose flat name another already has is a 400 naming it.

``ToolMap.client(flat)`` maps an engine call's function name back to the client's tool (its
``name``, ``namespace`` and kind), so the call goes out as the client named it: a
``function_call`` with ``name`` and ``namespace``, or a ``custom_tool_call`` with its ``input``.
A name the engine made up goes out as a function call of that name.

``translate_tool_choice(raw, tools) -> (tool_choice, tools)``: ``none``, ``auto``,
``required``; ``{"type": "function" | "custom", "name"}`` a tool of the request (a top-level
one, as the reference's tool choices name them); ``{"type": "allowed_tools", "mode", "tools"}``
offers the engine only those tools, with ``mode`` as its choice (allowed built-in tools were
dropped: they are skipped). A built-in tool choice is refused: the answer would not come from
that tool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import orjson

from gateway.api.fields import UnknownFields
from gateway.errors import InvalidRequest
from gateway.names.tools import ClientTool, ToolMap

DROPPED_HEADER = "x-thinkgate-dropped-tools"
DROPPED = frozenset({
    "web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11",
    "file_search", "code_interpreter", "image_generation", "computer", "computer_use",
    "computer_use_preview", "tool_search", "programmatic_tool_calling",
})  # fmt: skip
REFUSED = frozenset({"mcp", "shell", "local_shell", "apply_patch"})
CUSTOM_INPUT = "input"  # the one parameter of a custom tool carried as a function


@dataclass(frozen=True, slots=True)
class Tools:
    """The chat tools sent upstream, the map back, and the built-in tools dropped."""

    chat: list[dict[str, Any]] = field(default_factory=list)
    names: ToolMap = field(default_factory=ToolMap)
    dropped: tuple[str, ...] = ()
    echo: list[Any] = field(default_factory=list)  # the request's tools but the dropped ones


def flat_name(namespace: str | None, name: str) -> str:
    """The engine's name of ``name`` in ``namespace`` (rule in the module docstring)."""
    if not namespace:
        return name
    return f"{namespace}{name}" if namespace.endswith("__") else f"{namespace}__{name}"


def custom_arguments(text: str) -> str:
    """A custom tool's free-form input as the arguments of the function that carries it."""
    return orjson.dumps({CUSTOM_INPUT: text}).decode()


def dropped_header(dropped: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The response header naming the built-in tools dropped (none when none were)."""
    return ((DROPPED_HEADER, ",".join(dropped)),) if dropped else ()


def translate_tools(raw: Any, unknown: UnknownFields = "ignore") -> Tools:
    """The request's ``tools``; ``InvalidRequest`` names the tool at fault."""
    if raw is None:
        return Tools()
    if not isinstance(raw, list):
        raise InvalidRequest("'tools' must be a list.", param="tools")
    builder = _Builder(unknown)
    for i, tool in enumerate(raw):
        builder.add(tool, f"tools[{i}]")
    return Tools(builder.chat, ToolMap(MappingProxyType(builder.names)),
                 tuple(dict.fromkeys(builder.dropped)), builder.echo)  # fmt: skip


class _Builder:
    def __init__(self, unknown: UnknownFields) -> None:
        self.unknown = unknown
        self.chat: list[dict[str, Any]] = []
        self.names: dict[str, ClientTool] = {}
        self.dropped: list[str] = []
        self.echo: list[Any] = []

    def add(self, tool: Any, where: str) -> None:
        kind = _kind(tool, where)
        if kind in DROPPED:
            if self.unknown == "refuse":
                raise InvalidRequest(f"Built-in tool '{kind}' is not supported by this gateway "
                                     "(UNKNOWN_FIELDS=refuse).", param=f"{where}.type")  # fmt: skip
            self.dropped.append(kind)
            return
        if kind == "namespace":
            self._namespace(tool, where)
        else:
            self._tool(tool, kind, where, None, "")
        self.echo.append(tool)

    def _namespace(self, tool: dict[str, Any], where: str) -> None:
        namespace = required_string(tool, "name", where)
        description = tool.get("description")
        description = description if isinstance(description, str) else ""
        inner = tool.get("tools")
        if not isinstance(inner, list) or not inner:
            raise InvalidRequest(f"Missing required parameter: '{where}.tools'.",
                                 param=f"{where}.tools")  # fmt: skip
        for i, member in enumerate(inner):
            kind = _kind(member, f"{where}.tools[{i}]")
            if kind not in ("function", "custom"):
                raise InvalidRequest(f"Invalid value for '{where}.tools[{i}].type': function or "
                                     "custom.", param=f"{where}.tools[{i}].type")  # fmt: skip
            self._tool(member, kind, f"{where}.tools[{i}]", namespace, description)

    def _tool(self, tool: dict[str, Any], kind: str, where: str, namespace: str | None,
              lead: str) -> None:  # fmt: skip
        name = required_string(tool, "name", where)
        flat = flat_name(namespace, name)
        if flat in self.names:
            raise InvalidRequest(f"Tool name '{flat}' is used twice (namespaces are flattened "
                                 "to '<namespace>__<name>').", param=f"{where}.name")  # fmt: skip
        if kind == "function":
            function = _function(tool, where)
        else:
            function = {"parameters": _custom_parameters(tool)}
            kind = "custom"
        function = {"name": flat, **function}
        described = "\n\n".join(t for t in (lead, _description(tool, kind)) if t)
        if described:
            function["description"] = described
        self.chat.append({"type": "function", "function": function})
        self.names[flat] = ClientTool(name, namespace, "custom" if kind == "custom" else "function")


def _kind(tool: Any, where: str) -> str:
    kind = _type(tool)
    if kind in REFUSED:
        raise InvalidRequest(f"Built-in tool '{kind}' is not supported by this gateway: function, "
                             "custom and namespace tools only.", param=f"{where}.type")  # fmt: skip
    if kind is not None and (kind in ("function", "custom", "namespace") or kind in DROPPED):
        return kind
    raise InvalidRequest(f"Invalid value for '{where}.type'.", param=f"{where}.type")


def _function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    function: dict[str, Any] = {}
    if tool.get("parameters") is not None:
        function["parameters"] = tool["parameters"]
    strict = tool.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise InvalidRequest(f"Invalid value for '{where}.strict'.", param=f"{where}.strict")
        function["strict"] = strict
    return function


def _description(tool: dict[str, Any], kind: str) -> str:
    """The tool's description; a custom tool's grammar told after it."""
    description = tool.get("description")
    text = description if isinstance(description, str) else ""
    fmt = tool.get("format")
    if kind != "custom" or not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        return text
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if not isinstance(definition, str) or not definition:
        return text
    told = f"The input must follow this {syntax if isinstance(syntax, str) else ''} grammar:"
    return "\n\n".join(t for t in (text, told.replace("  ", " "), definition) if t)


def _custom_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """One string parameter, the tool's free-form input."""
    text = {"type": "string", "description": f"The free-form input of {tool['name']}."}
    return {"type": "object", "properties": {CUSTOM_INPUT: text}, "required": [CUSTOM_INPUT],
            "additionalProperties": False}  # fmt: skip


def translate_tool_choice(raw: Any, tools: Tools) -> tuple[Any, list[dict[str, Any]]]:
    """Chat's ``tool_choice`` (``None``: not set) and the chat tools offered with it."""
    if raw is None:
        return None, tools.chat
    if isinstance(raw, str) and raw in ("none", "auto", "required"):
        if raw == "required" and not tools.chat:
            raise InvalidRequest("'tool_choice': 'required' needs 'tools'.", param="tool_choice")
        return raw, tools.chat
    kind = _type(raw)
    if kind in ("function", "custom"):
        flat = _chosen(raw, kind, tools, "tool_choice")
        return {"type": "function", "function": {"name": flat}}, tools.chat
    if kind == "allowed_tools":
        return _allowed(raw, tools)
    if kind is None or kind not in DROPPED | REFUSED:
        raise InvalidRequest("Invalid value for 'tool_choice'.", param="tool_choice")
    raise InvalidRequest(f"'tool_choice' '{kind}' is not supported by this gateway: built-in "
                         "tools do not run here.", param="tool_choice")  # fmt: skip


def _chosen(raw: dict[str, Any], kind: str, tools: Tools, where: str) -> str:
    """The flat name of the top-level tool ``raw`` names (``{"type", "name"}``)."""
    name = raw.get("name")
    found = tools.names.tools.get(name) if isinstance(name, str) else None
    if found is None or found.namespace is not None or found.kind != kind:
        raise InvalidRequest(f"'{where}' names a {kind} tool that is not in 'tools'.",
                             param=f"{where}.name")  # fmt: skip
    assert isinstance(name, str)
    return name


def _allowed(raw: dict[str, Any], tools: Tools) -> tuple[Any, list[dict[str, Any]]]:
    mode, listed = raw.get("mode"), raw.get("tools")
    if mode not in ("auto", "required"):
        raise InvalidRequest("Invalid value for 'tool_choice.mode': auto or required.",
                             param="tool_choice.mode")  # fmt: skip
    if not isinstance(listed, list):
        raise InvalidRequest("Missing required parameter: 'tool_choice.tools'.",
                             param="tool_choice.tools")  # fmt: skip
    allowed: set[str] = set()
    for i, entry in enumerate(listed):
        kind = _type(entry)
        if kind in ("function", "custom"):
            allowed.add(_chosen(entry, kind, tools, f"tool_choice.tools[{i}]"))
        elif (
            kind is None or kind not in DROPPED
        ):  # a dropped built-in tool cannot be chosen: skipped
            raise InvalidRequest(f"Invalid value for 'tool_choice.tools[{i}]'.",
                                 param=f"tool_choice.tools[{i}]")  # fmt: skip
    offered = [t for t in tools.chat if t["function"]["name"] in allowed]
    if offered:
        return mode, offered
    if mode == "required":
        raise InvalidRequest("'tool_choice' requires a call, and allows no tool that runs here.",
                             param="tool_choice.tools")  # fmt: skip
    return None, []


def _type(item: Any) -> str | None:
    """An object's ``type``, when it is a string (a list or an object is no name)."""
    kind = item.get("type") if isinstance(item, dict) else None
    return kind if isinstance(kind, str) else None


def required_string(item: dict[str, Any], name: str, where: str) -> str:
    """``item[name]``, a non-empty string; else a 400 naming ``where.name`` as missing."""
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"Missing required parameter: '{where}.{name}'.",
                             param=f"{where}.{name}")  # fmt: skip
    return value
