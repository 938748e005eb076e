"""The Responses API request at the edge, translated to the upstream's Chat Completions.

``parse_responses_request(raw) -> ResponsesRequest`` validates the request (OpenAI API
reference, "Responses") and builds the chat body sent upstream; ``ResponsesRequest.build``
finishes it once the route has what needs I/O (the stored conversation of
``previous_response_id``, the opened ``encrypted_content`` tokens, the model's history rule).

- ``input``: a string (one user message) or a list of items (``gateway.api.items``);
  ``instructions`` becomes a leading system message.
- ``max_output_tokens`` → ``max_tokens``; ``temperature``, ``top_p``, ``user``,
  ``parallel_tool_calls`` pass through; ``reasoning.effort`` → ``reasoning_effort`` (the
  format's thinking switch reads it, ``gateway.relay.formats``, and it is the request's
  reasoning budget, ``gateway.relay.effort``); ``reasoning.summary`` is
  accepted and echoed (no summaries are written: ``summary`` stays ``[]``); ``metadata`` is
  echoed, not sent.
- ``tools``: function tools (``{"type": "function", "name", "description", "parameters",
  "strict"}``) become chat tools; built-in tools (web search, file search, code interpreter,
  computer use, MCP, image generation, shell, custom tools) are refused with a 400 naming
  them. ``tool_choice`` ``"none"``/``"auto"``/``"required"`` or ``{"type": "function", "name"}``.
- ``text.format``: ``text``, ``json_object`` or ``json_schema`` (``name``, ``schema``,
  ``strict``) → chat's ``response_format``, the engine's structured output.
- ``include``: only ``"reasoning.encrypted_content"`` (the reasoning comes back sealed).
- ``store`` (default true), ``previous_response_id``: kept for the route
  (``gateway.conversation``). ``background``, ``conversation``, ``prompt``, and ``truncation``
  other than ``disabled`` are refused; unknown fields too, as the reference's strict schema
  does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.api.items import History, chat_messages, handed_back, input_items
from gateway.api.jsonbody import json_object
from gateway.errors import InvalidRequest

_KNOWN = {
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "reasoning",
    "stream", "store", "include", "metadata", "user", "tools", "tool_choice",
    "parallel_tool_calls", "previous_response_id", "background", "conversation", "text",
    "truncation", "prompt", "service_tier", "max_tool_calls", "top_logprobs",
    "prompt_cache_key", "safety_identifier", "stream_options",
}  # fmt: skip
_NOT_SUPPORTED = ("background", "conversation", "prompt", "max_tool_calls", "top_logprobs")
_BUILT_IN = {
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "computer", "computer_use_preview", "image_generation", "mcp",
    "local_shell", "shell", "custom", "apply_patch",
}  # fmt: skip
ENCRYPTED = "reasoning.encrypted_content"
MAX_OUTPUT_TOKENS = 1_000_000
# The reference's efforts (gateway.relay.effort.EFFORTS says what each costs; a test keeps
# the two equal: the relay is this layer's neighbour, not below it).
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
HistoryField = str  # "reasoning" | "reasoning_content" | "drop" (settings validate it)


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    model: str
    stream: bool
    max_tokens: int | None
    messages: list[Any]  # the chat messages sent upstream (for the record)
    params: dict[str, Any]  # the Responses fields other than input (for the record)
    upstream_body: bytes
    echo: dict[str, Any] = field(default_factory=dict)  # parameters the response repeats
    n: int = 1
    wants_reasoning: bool = True
    history: History = field(default_factory=lambda: History([], {}))  # this request's input
    chat: dict[str, Any] = field(default_factory=dict)  # the chat body but its messages
    instructions: list[dict[str, Any]] = field(default_factory=list)
    include_encrypted: bool = False
    store: bool = True
    previous_response_id: str | None = None
    input_items: list[dict[str, Any]] = field(default_factory=list)  # as listed back
    # the turns a follow-up replays: the earlier ones and this input, reasoning in "reasoning"
    conversation: list[dict[str, Any]] = field(default_factory=list)

    @property
    def params_for_thinking(self) -> dict[str, Any]:
        """The chat fields a format's thinking switch reads (``reasoning_effort``)."""
        effort = (self.echo.get("reasoning") or {}).get("effort")
        return {"reasoning_effort": effort} if effort else {}

    def build(
        self, opened: dict[str, str], history_field: HistoryField,
        earlier: list[dict[str, Any]] | None = None, turns: str = "all",
    ) -> ResponsesRequest:  # fmt: skip
        """The request with its final messages: the instructions, the ``earlier`` turns (a
        stored conversation, reasoning in ``reasoning``), then this input with each sealed
        token replaced by ``opened[token]``; the reasoning field renamed or dropped per
        ``history_field``. The record keeps the messages as sent."""
        conversation = [*(earlier or []), *self.history.with_reasoning(opened)]
        messages = handed_back([*self.instructions, *conversation], history_field, turns)
        body = {**self.chat, "messages": messages}
        return dataclasses.replace(self, messages=messages, upstream_body=orjson.dumps(body),
                                   conversation=conversation)  # fmt: skip


def parse_responses_request(raw: bytes) -> ResponsesRequest:
    """Decode, validate and translate; ``InvalidRequest`` (400, with ``param``) on a problem.
    The body is final (``upstream_body``) unless the input has sealed reasoning or a
    ``previous_response_id``: then the route calls ``build``."""
    body = json_object(raw)
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise InvalidRequest(f"Unknown parameter: '{unknown[0]}'.", param=unknown[0])
    _refuse_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    instructions = _instructions(body.get("instructions"))
    history = chat_messages(body.get("input"))
    chat: dict[str, Any] = {"model": model, **_sampling(body), **_tooling(body)}
    text_format, response_format = _text_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    stream = _bool(body.get("stream"), "stream")
    if stream:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise InvalidRequest("Invalid value for 'previous_response_id'.",
                             param="previous_response_id")  # fmt: skip
    echo = _echo(body, chat, text_format)
    call = ResponsesRequest(
        model, stream, chat.get("max_tokens"), [], {k: v for k, v in body.items() if k != "input"},
        b"", echo, history=history, chat=chat, instructions=instructions,
        include_encrypted=ENCRYPTED in (body.get("include") or []), store=echo["store"],
        previous_response_id=previous, input_items=input_items(body["input"]),
    )  # fmt: skip
    return call.build({}, "reasoning") if not history.sealed and previous is None else call


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The chat fields for the output budget, sampling, the user and reasoning effort."""
    chat: dict[str, Any] = {}
    max_tokens = _max_output_tokens(body.get("max_output_tokens"))
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = _number(body[name], name)
    if isinstance(body.get("user"), str):
        chat["user"] = body["user"]
    effort, _ = _reasoning(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    return chat


def _tooling(body: dict[str, Any]) -> dict[str, Any]:
    """The chat fields for tools."""
    chat: dict[str, Any] = {}
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = _bool(body["parallel_tool_calls"], "parallel_tool_calls")
    return chat


def _echo(body: dict[str, Any], chat: dict[str, Any], text_format: Any) -> dict[str, Any]:
    """The parameters every response object repeats."""
    names = ("instructions", "max_output_tokens", "metadata", "temperature", "top_p", "user",
             "previous_response_id")  # fmt: skip
    echo = {name: body.get(name) for name in names}
    effort, summary = _reasoning(body.get("reasoning"))
    store = body.get("store")
    echo.update(
        reasoning={"effort": effort, "summary": summary},
        store=True if store is None else _bool(store, "store"),
        tools=body.get("tools") or [],
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=chat.get("parallel_tool_calls", True),
        text={"format": text_format},
        truncation="disabled",
    )
    return echo


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name in _NOT_SUPPORTED:
        if body.get(name) not in (None, False):
            raise InvalidRequest(f"'{name}' is not supported by this gateway.", param=name)
    if body.get("truncation") not in (None, "disabled"):
        raise InvalidRequest("Only 'truncation': 'disabled' is supported by this gateway.",
                             param="truncation")  # fmt: skip
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise InvalidRequest("'include' must be a list of strings.", param="include")
    for value in include:
        if value != ENCRYPTED:  # strings, checked above
            raise InvalidRequest(f"'include' value '{value}' is not supported by this gateway.",
                                 param="include")  # fmt: skip


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidRequest("'tools' must be a list.", param="tools")
    tools = []
    for i, tool in enumerate(raw):
        kind = tool.get("type") if isinstance(tool, dict) else None
        kind = kind if isinstance(kind, str) else None
        if kind in _BUILT_IN:
            raise InvalidRequest(f"Built-in tool '{kind}' is not supported by this gateway: "
                                 "only function tools.", param=f"tools[{i}].type")  # fmt: skip
        if kind != "function":
            raise InvalidRequest(f"Invalid value for 'tools[{i}].type'.", param=f"tools[{i}].type")
        assert isinstance(tool, dict)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"Missing required parameter: 'tools[{i}].name'.",
                                 param=f"tools[{i}].name")  # fmt: skip
        function: dict[str, Any] = {"name": name}
        for key in ("description", "parameters"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        if tool.get("strict") is not None:
            function["strict"] = _bool(tool["strict"], f"tools[{i}].strict")
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(raw: Any, tools: list[dict[str, Any]]) -> Any:
    if raw is None:
        return None
    if isinstance(raw, str) and raw in ("none", "auto", "required"):
        if raw == "required" and not tools:
            raise InvalidRequest("'tool_choice': 'required' needs 'tools'.", param="tool_choice")
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function":
        names = {t["function"]["name"] for t in tools}
        if not isinstance(raw.get("name"), str) or raw["name"] not in names:
            raise InvalidRequest("'tool_choice' names a function that is not in 'tools'.",
                                 param="tool_choice.name")  # fmt: skip
        return {"type": "function", "function": {"name": raw["name"]}}
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if not isinstance(kind, str):
        raise InvalidRequest("Invalid value for 'tool_choice'.", param="tool_choice")
    raise InvalidRequest(f"'tool_choice' '{kind}' is not supported by this gateway.",
                         param="tool_choice")  # fmt: skip


def _text_format(text: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The echoed ``text.format`` and chat's ``response_format`` (``None`` for plain text)."""
    if text is None:
        return {"type": "text"}, None
    fmt = text.get("format") if isinstance(text, dict) else ...
    if fmt is None:
        return {"type": "text"}, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return fmt, None  # type: ignore[return-value]
    if kind == "json_object":
        return fmt, {"type": "json_object"}  # type: ignore[return-value]
    if kind == "json_schema":
        name, schema = fmt.get("name"), fmt.get("schema")  # type: ignore[union-attr]
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise InvalidRequest("'text.format' json_schema needs a 'name' and a 'schema'.",
                                 param="text.format")  # fmt: skip
        spec: dict[str, Any] = {"name": name, "schema": schema}
        if fmt.get("strict") is not None:  # type: ignore[union-attr]
            spec["strict"] = _bool(fmt["strict"], "text.format.strict")  # type: ignore[index]
        return fmt, {"type": "json_schema", "json_schema": spec}  # type: ignore[return-value]
    raise InvalidRequest("Invalid value for 'text.format'.", param="text.format")


def _instructions(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, str):
        raise InvalidRequest("'instructions' must be a string.", param="instructions")
    return [{"role": "system", "content": value}]


def _max_output_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise InvalidRequest("Invalid value for 'max_output_tokens'.", param="max_output_tokens")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"Invalid value for '{name}'.", param=name)
    return float(value)


def _bool(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"Invalid value for '{name}'.", param=name)
    return value


def _reasoning(reasoning: Any) -> tuple[str | None, str | None]:
    """``(effort, summary)`` of the ``reasoning`` object."""
    if reasoning is None:
        return None, None
    if not isinstance(reasoning, dict):
        raise InvalidRequest("Invalid value for 'reasoning'.", param="reasoning")
    effort, summary = reasoning.get("effort"), reasoning.get("summary")
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest("Invalid value for 'reasoning.effort'.", param="reasoning.effort")
    if summary not in (None, "auto", "concise", "detailed"):
        raise InvalidRequest("Invalid value for 'reasoning.summary'.", param="reasoning.summary")
    return effort, summary
