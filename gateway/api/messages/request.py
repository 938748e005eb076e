"""The Anthropic Messages API request at the edge, translated to the upstream's Chat Completions.

``parse_messages_request(raw, unknown) -> MessagesRequest`` validates a request as Anthropic's
API reference defines it and builds the chat body; ``parse_count_tokens_request`` does the same
for ``/v1/messages/count_tokens``. ``MessagesRequest.build`` finishes the body once the route
has opened the reasoning that came back sealed (it needs the tenant's key).

- The field policy first (``gateway.api.fields``: ``MESSAGES``, ``COUNT_TOKENS``, applied by
  ``gateway.api.screen``): fields without effect here (``cache_control``, ``container``,
  ``diagnostics``, ``inference_geo``, ``metadata``, ``service_tier``, ``speed``,
  ``billing_policy``, ``fallbacks``, ...) are dropped, never sent on; ``compaction``, ``thread``
  and a non-empty ``mcp_servers`` are refused naming them; a field no reference names follows
  ``UNKNOWN_FIELDS`` (``ignore``: dropped, not forwarded, and named in ``unknown`` for the
  route's ``x-thinkgate-ignored`` header; ``refuse``: a 400 naming it). vLLM's own sampling
  fields (the table's ``engine`` rows: ``seed``, ``min_p``, ``repetition_penalty``,
  ``logit_bias``, ``structured_outputs``, ``chat_template_kwargs``) pass through as on chat.
- ``max_tokens`` is required; ``stop_sequences`` → ``stop``; ``temperature``, ``top_p``,
  ``top_k`` pass through.
- ``system`` and ``messages``: ``gateway.api.messages.turns`` (``role: "system"`` entries
  folded into the one leading system message, in order: ``gateway.api.messages.system``).
  ``tools`` and ``tool_choice`` (server tools dropped with a notice; the system messages' tool
  changes applied): ``gateway.api.messages.tools``. ``thinking``, ``output_config``
  (``effort``, ``format``) and ``output_format``: ``gateway.api.messages.thinking``.
- ``context_management`` edits (``gateway.api.context_edits``) are applied by ``build`` to the
  chat messages sent, measured on the prompt as the engine gets it (after the model's history
  rule); ``context_management`` is the response's report of them, ``None`` when the request
  sent none.
- ``prompt_tokens`` is the gateway's estimate of the prompt (``prompt_estimate``: the bytes of
  the messages and tools sent, divided by 4, rounded up): what ``message_start`` reports before
  the engine's count arrives at the end of the stream, and what ``count_tokens`` answers when
  no engine tokenizes. It errs high (JSON's quotes and keys count too), never asks the engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.api.context_edits import AppliedEdit, Edit, apply_edits, parse_edits, report
from gateway.api.fields import COUNT_TOKENS, MESSAGES, UnknownFields
from gateway.api.items import History, handed_back
from gateway.api.jsonbody import json_object
from gateway.api.messages.thinking import output, thinking
from gateway.api.messages.tools import tooling
from gateway.api.messages.turns import Signed, conversation
from gateway.api.screen import Screened, screen
from gateway.errors import InvalidRequest

# vLLM's own sampling fields a self-hosted client may add: passed through as on chat
ENGINE_EXTRAS = tuple(name for name, rule in MESSAGES.items() if rule.source == "engine")
MAX_TOKENS = 1_000_000


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    model: str
    stream: bool
    max_tokens: int
    messages: list[Any]  # the chat messages sent upstream (for the record)
    params: dict[str, Any]  # the Messages fields other than messages (for the record)
    upstream_body: bytes
    chat: dict[str, Any]  # the chat body but its messages
    history: History  # the conversation, reasoning parts per assistant message
    system: list[dict[str, Any]] = field(default_factory=list)
    signed: Signed = field(default_factory=list)  # (signature, text)
    show_thinking: bool = False  # the request asked for thinking blocks
    stop_sequences: tuple[str, ...] = ()
    n: int = 1
    omit_thinking: bool = False  # thinking.display "omitted": blocks without their text
    edits: tuple[Edit, ...] = ()
    manages_context: bool = False  # the request sent context_management: the answer reports
    applied: tuple[AppliedEdit, ...] = ()  # the edits that cleared something (set by build)
    unknown: tuple[str, ...] = ()  # fields no reference names, accepted (UNKNOWN_FIELDS=ignore)
    dropped: tuple[str, ...] = ()  # server tools left out (x-thinkgate-dropped-tools)

    @property
    def params_for_thinking(self) -> dict[str, Any]:
        """The chat fields a format's thinking switch reads."""
        effort = self.chat.get("reasoning_effort")
        return {"reasoning_effort": effort} if effort else {}

    @property
    def prompt_tokens(self) -> int:
        """The gateway's estimate of the prompt sent (``prompt_estimate``). Once built, the
        messages' bytes are read off the body sent rather than encoded again (an agent's
        context is 100 kB): ``build`` writes it as the chat body's fields then
        ``,"messages":`` and the messages."""
        tools = self.chat.get("tools")
        if not self.upstream_body:
            return prompt_estimate(self.messages, tools)
        size = len(self.upstream_body) - len(orjson.dumps(self.chat)) - len(b',"messages":')
        return _estimate(size, tools)

    @property
    def context_management(self) -> dict[str, Any] | None:
        """The answer's ``context_management`` report, if the request asked for edits."""
        return report(self.applied) if self.manages_context else None

    def build(
        self, opened: dict[str, str], history_field: str, turns: str = "all"
    ) -> MessagesRequest:
        """The request with each sealed reasoning opened into its turn, the context edits
        applied, and the reasoning handed back per the model's history rule."""
        tools = self.chat.get("tools")

        def measure(messages: list[dict[str, Any]]) -> int:
            return prompt_estimate(handed_back(messages, history_field, turns), tools)

        conversation = [*self.system, *self.history.with_reasoning(opened)]
        edited, applied = apply_edits(self.edits, conversation, measure)
        messages = handed_back(edited, history_field, turns)
        body = orjson.dumps({**self.chat, "messages": messages})
        return dataclasses.replace(self, messages=messages, upstream_body=body, applied=applied)


def prompt_estimate(messages: list[Any], tools: Any = None) -> int:
    """The gateway's estimate of a prompt's tokens: the bytes of its chat messages and tools,
    as sent, divided by 4 and rounded up (as the reservation and ``gateway.api.room`` do)."""
    return _estimate(len(orjson.dumps(messages)), tools)


def _estimate(messages_size: int, tools: Any) -> int:
    """``prompt_estimate`` from the messages' encoded size."""
    size = messages_size + (len(orjson.dumps(tools)) if tools else 0)
    return -(-size // 4)


def parse_messages_request(raw: bytes, unknown: UnknownFields = "ignore") -> MessagesRequest:
    """Decode, apply the field policy, validate and translate; ``InvalidRequest`` (400, with
    ``param``) on a problem. The body is final (``upstream_body``) unless reasoning came back
    sealed: then the route opens it and calls ``build``."""
    screened = screen(json_object(raw), MESSAGES, unknown)
    max_tokens = screened.body.get("max_tokens")
    if type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS:
        raise InvalidRequest("max_tokens: Field required (an integer of at least 1)",
                             param="max_tokens")  # fmt: skip
    return _translated(screened, max_tokens, strict=unknown == "refuse")


def parse_count_tokens_request(raw: bytes, unknown: UnknownFields = "ignore") -> MessagesRequest:
    """``parse_messages_request`` under the ``COUNT_TOKENS`` policy: only what the prompt is
    made of counts (``messages``, ``system``, ``tools``, ``context_management``); every other
    Messages field is accepted and ignored, ``max_tokens`` included."""
    screened = screen(json_object(raw), COUNT_TOKENS, unknown)
    return _translated(screened, MAX_TOKENS, strict=unknown == "refuse")


def _translated(screened: Screened, max_tokens: int, *, strict: bool) -> MessagesRequest:
    body = screened.body
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise InvalidRequest("model: Field required", param="model")
    stream = _bool(body.get("stream"), "stream")
    chat: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    chat.update(_sampling(body))
    chat.update({name: body[name] for name in ENGINE_EXTRAS if name in body})
    said = conversation(body.get("system"), body.get("messages"))
    tools = tooling(body, strict, said.tool_changes)
    chat.update(tools.chat)
    asked = thinking(body.get("thinking"), max_tokens, chat)
    output(body.get("output_config"), body.get("output_format"), chat)
    if stream:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    edits = parse_edits(body.get("context_management"))
    call = MessagesRequest(
        model, stream, max_tokens, [], {k: v for k, v in body.items() if k != "messages"}, b"",
        chat, said.history, said.system, said.signed, asked.show, tuple(chat.get("stop") or ()),
        omit_thinking=asked.omit, edits=edits,
        manages_context=body.get("context_management") is not None,
        unknown=screened.unknown, dropped=tools.dropped,
    )  # fmt: skip
    return call.build({}, "reasoning") if not said.history.sealed else call


def _bool(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name}: Input should be a valid boolean", param=name)
    return value


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidRequest(f"{name}: Input should be a valid number", param=name)
            chat[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if type(top_k) is not int or top_k < 0:
            raise InvalidRequest("top_k: Input should be a non-negative integer", param="top_k")
        chat["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise InvalidRequest("stop_sequences: a list of non-empty strings",
                                 param="stop_sequences")  # fmt: skip
        if stops:
            chat["stop"] = stops
    return chat
