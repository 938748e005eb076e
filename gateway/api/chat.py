"""The chat request at the HTTP edge: decode, validate, and build the body sent upstream.

Validation checks only what the gateway relies on or what a model server would otherwise
reject with a worse message; every other field passes through untouched (vLLM extras such as
``top_k``, ``structured_outputs``, ``chat_template_kwargs``, tools, ``reasoning_content`` in
assistant messages). The forwarded body is the client's own JSON object with three changes:

- the field policy (``gateway.api.fields.CHAT``, applied by ``gateway.api.screen``): fields
  without effect here (``metadata``, ``store``, ``service_tier``, ``prompt_cache_key``, ...)
  are not sent on, fields whose loss would change the answer (``audio``, ``web_search_options``,
  the removed ``guided_*``, ...) are refused naming them, and fields no reference names follow
  ``UNKNOWN_FIELDS`` (by default sent on, as vLLM's extras, and named in
  ``x-thinkgate-ignored``);
- ``include_reasoning`` and ``reasoning`` are removed: they are directives to the gateway (a
  request may lower its own reasoning visibility with ``include_reasoning: false`` or
  ``reasoning: {"exclude": true}``, never raise it); OpenRouter's ``reasoning.effort`` and
  ``reasoning.max_tokens`` become ``reasoning_effort`` and ``thinking_token_budget`` unless the
  request set those;
- for streams, ``stream_options.include_usage`` is forced on (the gateway always needs usage)
  and the client's own choice is remembered;
- an assistant message's reasoning of an earlier turn (``reasoning`` or ``reasoning_content``,
  the names vLLM and DeepSeek/SGLang give it) is sent under the one field the model's engine
  reads, or dropped, per the model's history rule (``with_history``): vLLM 0.32 reads only
  ``reasoning`` and silently drops ``reasoning_content`` (vllm-project/vllm#38488).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    create_model,
)

from gateway.api.fields import CHAT, UnknownFields
from gateway.api.items import handed_back
from gateway.api.jsonbody import json_object
from gateway.api.screen import screen
from gateway.errors import InvalidRequest

MAX_N = 16
_REASONING_KEYS = {"reasoning", "reasoning_content"}
MAX_TOKENS_LIMIT = 1_000_000


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool | None = None


class _ReasoningDirective(BaseModel):
    model_config = ConfigDict(extra="allow")
    exclude: StrictBool = False


class _ChatBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr = Field(min_length=1, max_length=256)
    messages: Annotated[list[_Message], Field(min_length=1)]
    stream: StrictBool | None = False  # null: the default, as OpenAI's reference allows
    stream_options: _StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N, strict=True)] | None = 1
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT, strict=True)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT, strict=True)] | None = (
        None
    )
    include_reasoning: StrictBool = True
    reasoning: _ReasoningDirective | None = None
    # typed as OpenAI's reference types them; every field not named here passes through
    temperature: Annotated[float, Field(ge=0, le=2, strict=True)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2, strict=True)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2, strict=True)] | None = None
    seed: Annotated[int, Field(strict=True)] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20, strict=True)] | None = None
    user: StrictStr | None = None


# ``_ChatBody`` with the messages taken as they come: ``_checked`` tests each one's role itself
# (an agent's 201 messages: 97 µs of validation became 10) and runs the full model on any
# doubt, so every error is the one the full model reports.
_Quick = create_model(
    "_Quick", __base__=_ChatBody, messages=(Annotated[list[Any], Field(min_length=1)], ...)
)
_ROLES = frozenset(get_args(_Message.model_fields["role"].annotation))


def _checked(body: dict[str, Any]) -> _ChatBody:
    try:
        quick = _Quick.model_validate(body)
    except ValidationError:
        pass
    else:
        if all(type(m) is dict and type(m.get("role")) is str and m["role"] in _ROLES
               for m in body["messages"]):  # fmt: skip
            return quick
    try:
        return _ChatBody.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc) from None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    stream: bool
    include_usage: bool
    wants_reasoning: bool  # false when the request lowered its own visibility
    max_tokens: int | None
    n: int
    has_stop: bool
    messages: list[Any]
    params: dict[str, Any]  # every other field, as forwarded (for the audit record)
    upstream_body: bytes
    has_history: bool = False  # an assistant message carries reasoning
    unknown: tuple[str, ...] = ()  # fields no reference names, accepted (UNKNOWN_FIELDS=ignore)

    def with_history(self, history_field: str, turns: str) -> ChatRequest:
        """The request with each assistant message's reasoning (``reasoning`` or
        ``reasoning_content``) handed back as the model's history rule says
        (``gateway.api.items.handed_back``)."""
        if not self.has_history:
            return self
        canonical = []
        for message in self.messages:
            if message.get("role") == "assistant" and _REASONING_KEYS & message.keys():
                text = message.get("reasoning")
                text = message.get("reasoning_content") if text is None else text
                message = {k: v for k, v in message.items() if k not in _REASONING_KEYS}
                if text:
                    message["reasoning"] = text
            canonical.append(message)
        messages = handed_back(canonical, history_field, turns)
        body = _encode({**self.params, "messages": messages})
        return dataclasses.replace(self, messages=messages, upstream_body=body)

    def without_thinking(self, switches: tuple[str, ...]) -> ChatRequest:
        """The request with each of ``switches`` set to false in ``chat_template_kwargs``: the
        gateway decided thinking is off, and the template must agree (``gateway.relay.formats``)."""
        if not switches:
            return self
        kwargs = self.params.get("chat_template_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
        kwargs.update(dict.fromkeys(switches, False))
        params = {**self.params, "chat_template_kwargs": kwargs}
        body = _encode({**params, "messages": self.messages})
        return dataclasses.replace(self, params=params, upstream_body=body)


def parse_chat_request(raw: bytes, unknown: UnknownFields = "ignore") -> ChatRequest:
    """Decode and validate; ``InvalidRequest`` (400, with ``param``) on any problem."""
    screened = screen(json_object(raw), CHAT, unknown, forward_unknown=True)
    body = screened.body
    _too_large(body)
    checked = _checked(body)
    wants_reasoning = checked.include_reasoning and not (
        checked.reasoning is not None and checked.reasoning.exclude
    )
    include_usage = bool(checked.stream_options and checked.stream_options.include_usage)
    body.pop("include_reasoning", None)
    _reasoning_directive(body, body.pop("reasoning", None))
    if checked.stream:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return ChatRequest(
        model=checked.model,
        stream=bool(checked.stream),
        include_usage=include_usage,
        wants_reasoning=wants_reasoning,
        max_tokens=checked.max_completion_tokens or checked.max_tokens,
        n=checked.n or 1,
        has_stop=bool(body.get("stop")),
        messages=body["messages"],
        params={k: v for k, v in body.items() if k != "messages"},
        upstream_body=_encode(body),
        has_history=_has_history(body["messages"]),
        unknown=screened.unknown,
    )


def _reasoning_directive(body: dict[str, Any], directive: Any) -> None:
    """OpenRouter's ``reasoning`` object, beyond ``exclude``: its ``effort`` and ``max_tokens``
    as the engine's ``reasoning_effort`` and ``thinking_token_budget`` (checked with them, by
    ``gateway.relay.effort``), unless the request named those itself."""
    if not isinstance(directive, dict):
        return
    effort, budget = directive.get("effort"), directive.get("max_tokens")
    if effort is not None:
        body.setdefault("reasoning_effort", effort)
    if budget is not None:
        body.setdefault("thinking_token_budget", budget)


def _has_history(messages: list[Any]) -> bool:
    """Whether an assistant message carries reasoning (each must be a string or null)."""
    found = False
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        for name in _REASONING_KEYS & message.keys():
            if not isinstance(message[name], str | None):
                raise InvalidRequest(f"Invalid value for 'messages[{index}].{name}': a string.",
                                     param=f"messages[{index}].{name}")  # fmt: skip
            found = True
    return found


def _too_large(body: dict[str, Any]) -> None:
    """``max_tokens: 1e30`` is a number too large, not "not an integer"."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, float) and value > MAX_TOKENS_LIMIT:
            raise InvalidRequest(f"Invalid value for '{name}': too large (at most "
                                 f"{MAX_TOKENS_LIMIT:,}).", param=name)  # fmt: skip


def _encode(body: dict[str, Any]) -> bytes:
    """The body as forwarded. orjson reads 1,024 levels of nesting but writes only 254: a
    field nested deeper than that passes validation and must still be the client's error."""
    try:
        return orjson.dumps(body)
    except TypeError:
        raise InvalidRequest("The request is nested too deeply (254 levels at most).") from None


def _invalid(exc: ValidationError) -> InvalidRequest:
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = [str(p) for p in error["loc"]]
    param = ".".join(loc) if loc else None
    if error["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param)
    return InvalidRequest(f"Invalid value for '{param}': {error['msg']}.", param=param)
