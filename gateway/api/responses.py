"""The Responses API request at the edge, translated to the upstream's Chat Completions.

``parse_responses_request(raw) -> ResponsesRequest`` validates what this slice of the endpoint
supports and builds the chat body sent upstream (OpenAI API reference, "Responses"):

- ``input``: a string (one user message) or a list of message items: ``{"role": "user" |
  "system" | "developer" | "assistant", "content": str | [{"type": "input_text" |
  "output_text", "text"}]}``, with or without ``"type": "message"``. ``instructions`` becomes a
  leading system message; ``developer`` is sent as ``system`` (chat templates know no other).
- ``max_output_tokens`` → ``max_tokens``; ``temperature``, ``top_p``, ``user`` pass through;
  ``reasoning.effort`` → ``reasoning_effort`` (the format's thinking switch reads it,
  ``gateway.relay.formats``); ``metadata`` is echoed, not sent.
- ``store`` is accepted and nothing is stored yet (a later slice stores responses); ``include``
  may name only what is supported.
- Not supported yet, refused with a 400 that names the field: ``tools``, ``tool_choice`` other
  than ``auto``/``none``, ``previous_response_id``, ``background``, ``conversation``,
  ``include: ["reasoning.encrypted_content"]``, items of other types (``function_call``,
  ``function_call_output``, ``reasoning``), non-text content parts. Unknown fields are refused
  too, as the reference's strict schema does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import InvalidRequest

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = {"input_text", "output_text"}
_KNOWN = {
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "reasoning",
    "stream", "store", "include", "metadata", "user", "tools", "tool_choice",
    "parallel_tool_calls", "previous_response_id", "background", "conversation", "text",
    "truncation",
}  # fmt: skip
_NOT_YET = ("previous_response_id", "background", "conversation")
MAX_OUTPUT_TOKENS = 1_000_000


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

    @property
    def params_for_thinking(self) -> dict[str, Any]:
        """The chat fields a format's thinking switch reads (``reasoning_effort``)."""
        effort = (self.echo.get("reasoning") or {}).get("effort")
        return {"reasoning_effort": effort} if effort else {}


def parse_responses_request(raw: bytes) -> ResponsesRequest:
    """Decode, validate and translate; ``InvalidRequest`` (400, with ``param``) on a problem."""
    body = _object(raw)
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise InvalidRequest(f"Unknown parameter: '{unknown[0]}'.", param=unknown[0])
    _refuse_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    messages = _instructions(body.get("instructions")) + _input(body.get("input"))
    chat: dict[str, Any] = {"model": model, "messages": messages}
    max_tokens = _max_output_tokens(body.get("max_output_tokens"))
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = _number(body[name], name)
    if isinstance(body.get("user"), str):
        chat["user"] = body["user"]
    effort = _effort(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    stream = _bool(body.get("stream"), "stream")
    if stream:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    params = {k: v for k, v in body.items() if k != "input"}
    echo = {k: body.get(k) for k in ("instructions", "max_output_tokens", "metadata",
                                     "temperature", "top_p", "user", "store")}  # fmt: skip
    echo["reasoning"] = {"effort": effort, "summary": None}
    return ResponsesRequest(model, stream, max_tokens, messages, params, orjson.dumps(chat), echo)


def _object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name in _NOT_YET:
        if body.get(name) not in (None, False):
            raise InvalidRequest(f"'{name}' is not supported by this gateway yet.", param=name)
    if body.get("tools"):
        raise InvalidRequest("'tools' are not supported by this gateway yet.", param="tools")
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise InvalidRequest("'tool_choice' is not supported yet.", param="tool_choice")
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise InvalidRequest("'include' must be a list of strings.", param="include")
    if include:
        raise InvalidRequest(f"'include' value '{include[0]}' is not supported yet.",
                             param="include")  # fmt: skip
    text = body.get("text")
    if text is not None and (
        not isinstance(text, dict) or (text.get("format") or {}).get("type", "text") != "text"
    ):
        raise InvalidRequest("Only plain text output ('text.format': text) is supported yet.",
                             param="text.format")  # fmt: skip


def _instructions(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, str):
        raise InvalidRequest("'instructions' must be a string.", param="instructions")
    return [{"role": "system", "content": value}]


def _input(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    return [_message(item, i) for i, item in enumerate(value)]


def _message(item: Any, index: int) -> dict[str, Any]:
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise InvalidRequest(f"Invalid value for '{where}': an item must be an object.",
                             param=where)  # fmt: skip
    kind = item.get("type", "message")
    if kind != "message":
        raise InvalidRequest(f"Input items of type '{kind}' are not supported yet.",
                             param=f"{where}.type")  # fmt: skip
    role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise InvalidRequest(f"Invalid value for '{where}.role'.", param=f"{where}.role")
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"Invalid value for '{where}'.", param=where)
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
            raise InvalidRequest(f"Only text content parts are supported yet ('{where}[{i}]').",
                                 param=f"{where}[{i}]")  # fmt: skip
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"Invalid value for '{where}[{i}].text'.",
                                 param=f"{where}[{i}].text")  # fmt: skip
        texts.append(text)
    return "".join(texts)


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


def _effort(reasoning: Any) -> str | None:
    if reasoning is None:
        return None
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else ...
    if effort is None:
        return None
    if effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
        raise InvalidRequest("Invalid value for 'reasoning.effort'.", param="reasoning.effort")
    return str(effort)
