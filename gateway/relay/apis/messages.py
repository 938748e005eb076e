"""The upstream's chat completion, rewritten as an Anthropic Messages API message (sans-I/O).

The same per-choice splitting as chat (``gateway.relay.rewrite``), shaped as Anthropic's API
reference shapes a message:

- Content blocks, in the order the model produced them: the reasoning as a ``thinking`` block
  (``thinking``, ``signature``: the gateway's seal of the text, so a changed block is refused when
  it comes back) for a key allowed to see reasoning, or a ``redacted_thinking`` block (``data``:
  the reasoning sealed) for a hidden key, never a byte of the text; both only when the request
  asked for thinking (``MessageMeta.thinking``). With ``thinking.display: "omitted"``
  (``MessageMeta.omit_thinking``) the block is a ``thinking`` block with its ``signature`` and
  empty ``thinking`` text, for any key: no reasoning text at all. Then a ``text`` block (left
  out when the model only called tools: whitespace alone before a call is no answer) and a
  ``tool_use`` block (``id``, ``name``, ``input`` parsed from the arguments) per tool call.
- ``stop_reason``: ``end_turn``, ``stop_sequence`` (with ``stop_sequence``: the engine's
  ``stop_reason`` names the string that matched), ``max_tokens``, ``tool_use``.
- ``usage``: ``input_tokens``, ``output_tokens`` (the reasoning included, as Anthropic counts
  it), the cache fields 0. The engine counts the prompt only once it answers (its usage comes
  with the last chunk), so ``message_start`` carries the gateway's estimate
  (``MessageMeta.input_tokens``: bytes / 4 of the messages and tools sent, as ``count_tokens``
  without a tokenizer; no round trip to the engine's ``/tokenize`` on the way to the first
  byte), and ``message_delta`` the engine's exact figures (the estimate again should the
  engine's usage never come).
- ``context_management`` (``MessageMeta.context_management``, when the request sent one): the
  context edits applied (``gateway.api.context_edits``), on the whole message and on the
  streamed ``message_delta``, as Anthropic reports them.
- Streaming (``MessagesStream``): ``message_start``; per block ``content_block_start``,
  ``content_block_delta`` (``thinking_delta``, then one ``signature_delta``; ``text_delta``;
  ``input_json_delta``) and ``content_block_stop``; a hidden key's ``redacted_thinking`` block,
  and an omitted ``thinking`` block (start, ``signature_delta``, stop), are sent at once when
  the reasoning ended; then ``message_delta`` (``stop_reason``,
  ``stop_sequence``, ``usage``) and ``message_stop``, sent once the record is durable. A failure
  after the start is one ``error`` event and the stream ends. While withheld reasoning runs, the
  keep-alive is a ``ping`` event.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.errors import RemoteProtocolError
from gateway.relay.choice import ChoiceState
from gateway.relay.rewrite import (
    EventRelay,
    Policy,
    Rewriter,
    cached_tokens,
    rewrite_completion,
    text_fields,
)
from gateway.relay.sse import encode_event
from gateway.relay.toolcalls import ToolCall, ToolCallPiece

BlockKind = Literal["thinking", "omitted_thinking", "redacted_thinking", "text", "tool_use"]
Sealer = Callable[[str], str]  # reasoning text -> signature / data token
PING = encode_event("ping", b'{"type":"ping"}')
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
         "content_filter": "refusal"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class MessageMeta:
    model: str
    thinking: bool  # the request asked for thinking blocks
    stop_sequences: tuple[str, ...] = ()
    seal: Sealer | None = None
    id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(12)}")
    omit_thinking: bool = False  # thinking.display "omitted": blocks carry no text
    input_tokens: int = 0  # the prompt's estimate, for message_start
    context_management: dict[str, Any] | None = None  # the context edits' report

    def sealed_kind(self, show: bool) -> BlockKind | None:
        """The kind of block reasoning goes out in once it ended, sealed; ``None`` when it is
        streamed as it comes (visible, shown) or not sent at all."""
        if self.omit_thinking and (show or self.seal is not None):
            return "omitted_thinking"
        if show or self.seal is None:
            return None
        return "redacted_thinking"


def message_usage(usage: dict[str, Any] | None, estimate: int = 0) -> dict[str, Any]:
    """Anthropic's usage of the engine's; ``estimate`` the input tokens while it has none.
    Anthropic's ``input_tokens`` leaves out the tokens read from the cache (a client adds the
    two for the prompt's size), so the engine's cached tokens move from one to the other."""
    usage = usage or {}
    cached = cached_tokens(usage)
    return {
        "input_tokens": max(int(usage.get("prompt_tokens") or estimate) - cached, 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def stop_of(meta: MessageMeta, finish: str | None, matched: Any) -> tuple[str | None, str | None]:
    """``(stop_reason, stop_sequence)`` of a choice that finished so."""
    if finish == "stop" and isinstance(matched, str) and matched in meta.stop_sequences:
        return "stop_sequence", matched
    return (_STOP.get(finish, "end_turn") if finish else None), None


def _input(call: ToolCall) -> Any:
    try:
        parsed = orjson.loads("".join(call.arguments) or "{}")
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):  # Anthropic's tool_use input is an object
        raise RemoteProtocolError("the model server sent tool arguments that are no JSON object")
    return parsed


def _thinking_blocks(meta: MessageMeta, policy: Policy, reasoning: str) -> list[dict[str, Any]]:
    if not reasoning or not meta.thinking:
        return []
    seal = meta.seal
    kind = meta.sealed_kind(policy.show_reasoning)
    signature = seal(reasoning) if seal is not None else ""
    if kind == "omitted_thinking":
        return [{"type": "thinking", "thinking": "", "signature": signature}]
    if kind == "redacted_thinking":
        return [{"type": "redacted_thinking", "data": signature}]
    if policy.show_reasoning:
        return [{"type": "thinking", "thinking": reasoning, "signature": signature}]
    return []


def _message(meta: MessageMeta, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
             usage: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    message = {"id": meta.id, "type": "message", "role": "assistant", "model": meta.model,
               "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
               "usage": message_usage(usage, meta.input_tokens)}  # fmt: skip
    if meta.context_management is not None:
        message["context_management"] = meta.context_management
    return message


class MessagesWhole(Rewriter):
    """A whole chat completion as one message."""

    def __init__(self, policy: Policy, meta: MessageMeta) -> None:
        super().__init__(policy)
        self.meta = meta

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        rewrite_completion(self, body)
        state = self.choice(0)
        choices = body.get("choices") or [{}]
        shown_reasoning, text = state.shown_text()
        content = _thinking_blocks(self.meta, self.policy, shown_reasoning)
        calls = state.tools.calls
        if text.strip() or not calls:
            content.append({"type": "text", "text": text})
        content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)}
                    for c in calls]  # fmt: skip
        stop = stop_of(self.meta, state.finish_reason, choices[0].get("stop_reason"))
        return _message(self.meta, content, stop, self.usage)


@dataclass(slots=True)
class _Block:
    kind: BlockKind
    index: int
    texts: list[str] = field(default_factory=list)
    call: ToolCall | None = None


class MessagesStream(EventRelay):
    """The chat stream as Messages events (rules in the module docstring)."""

    keepalive = PING

    def __init__(self, policy: Policy, meta: MessageMeta) -> None:
        super().__init__(policy)
        self.meta = meta
        self._open: _Block | None = None
        self._blocks = 0
        self._failed = False
        self._space = ""  # answer text that is only whitespace so far, held (as Responses)
        self._matched: Any = None
        self._answered = False  # a text or tool_use block was sent

    def error_event(self, error_json: bytes) -> bytes:
        self._failed = True
        error = orjson.loads(error_json).get("error") or {}
        body = {"type": "error", "error": {"type": _error_type(error), "message":
                error.get("message") or "The gateway failed while streaming."}}  # fmt: skip
        return b"".join([*([] if self._started else self._start()), _emit("error", body)])

    def end(self) -> bytes:
        if self._failed:
            return b""  # the error event was the stream's last word
        out = [] if self._started else self._start()
        if not self._answered:  # as a whole message: an answer that said nothing is ""
            out += self._grow("text", "") if self._open is None or self._open.kind != "text" \
                else []  # fmt: skip
        out += self._close()
        state = self.choices.get(0)
        stop = stop_of(self.meta, state.finish_reason if state else None, self._matched)
        out.append(_emit("message_delta", self._delta(stop)))
        out.append(_emit("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def _delta(self, stop: tuple[str | None, str | None]) -> dict[str, Any]:
        usage = message_usage(self.usage, self.meta.input_tokens)
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": stop[0], "stop_sequence": stop[1]},
                 "usage": {"input_tokens": usage["input_tokens"],
                           "output_tokens": usage["output_tokens"]}}  # fmt: skip
        if self.meta.context_management is not None:
            delta["context_management"] = self.meta.context_management
        return delta

    def _start(self) -> list[bytes]:
        self._started = True
        shell = _message(self.meta, [], (None, None), None)
        shell.pop("context_management", None)  # reported once known to be final: at the end
        return [_emit("message_start", {"type": "message_start", "message": shell})]

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        state = self.choice(0)
        if state.blocked is not None:  # a guardrail ended it: nothing more of it goes out
            state.finish_reason = "content_filter"
            return []
        finish = choice.get("finish_reason")
        if finish is not None:
            state.finish_reason = finish
            self._matched = choice.get("stop_reason")
        delta = choice.get("delta") or {}
        text, upstream_reasoning = text_fields(delta)
        reasoning, content = state.take(text, upstream_reasoning, finish is not None)
        if state.blocked is not None:
            state.finish_reason, delta = "content_filter", {}
        out: list[bytes] = []
        if reasoning:
            out += self._reasoning(reasoning)
        if content:
            out += self._answer(content, state)
        if "tool_calls" in delta:
            for piece in state.tools.add(delta["tool_calls"]):
                out += self._call(piece)
        if finish is not None and self._space:  # the end: whitespace alone is an answer
            space, self._space = self._space, ""
            out += [] if state.tools.calls else self._grow("text", space)
        return out

    def _reasoning(self, text: str) -> list[bytes]:
        if not self.meta.thinking:
            return []
        kind = self.meta.sealed_kind(self.policy.show_reasoning)
        if kind is None:
            return self._grow("thinking", text) if self.policy.show_reasoning else []
        out: list[bytes] = []
        if self._open is None or self._open.kind != kind:
            out += self._close()
            self._open = self._new(kind)  # announced when it closes, sealed
        self._open.texts.append(text)
        return out

    def _answer(self, text: str, state: ChoiceState) -> list[bytes]:
        text, self._space = self._space + text, ""
        if (self._open is None or self._open.kind != "text") and not text.strip():
            self._space = text
            return []
        return self._grow("text", text)

    def _new(self, kind: BlockKind, call: ToolCall | None = None) -> _Block:
        self._answered = self._answered or kind in ("text", "tool_use")
        block = _Block(kind, self._blocks, call=call)
        self._blocks += 1
        return block

    def _grow(self, kind: BlockKind, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self._open is None or self._open.kind != kind:
            out += self._close()
            block = self._new(kind)
            self._open = block
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" \
                else {"type": "text", "text": ""}  # fmt: skip
            out.append(_emit("content_block_start", {"type": "content_block_start",
                             "index": block.index, "content_block": start}))  # fmt: skip
        block = self._open
        block.texts.append(text)
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" \
            else {"type": "text_delta", "text": text}  # fmt: skip
        out.append(_emit("content_block_delta", {"type": "content_block_delta",
                         "index": block.index, "delta": delta}))  # fmt: skip
        return out

    def _call(self, piece: ToolCallPiece) -> list[bytes]:
        out: list[bytes] = []
        block = self._open
        if piece.new or block is None or block.call is not piece.call:
            out += self._close()
            block = self._new("tool_use", piece.call)
            self._open = block
            start = {"type": "tool_use", "id": piece.call.id, "name": piece.call.name, "input": {}}
            out.append(_emit("content_block_start", {"type": "content_block_start",
                             "index": block.index, "content_block": start}))  # fmt: skip
        if piece.arguments:
            delta = {"type": "input_json_delta", "partial_json": piece.arguments}
            out.append(_emit("content_block_delta", {"type": "content_block_delta",
                             "index": block.index, "delta": delta}))  # fmt: skip
        return out

    def _close(self) -> list[bytes]:
        block, self._open = self._open, None
        if block is None:
            return []
        stop = _emit("content_block_stop", {"type": "content_block_stop", "index": block.index})
        text = "".join(block.texts)
        seal = self.meta.seal
        if block.kind == "thinking":
            delta = {"type": "signature_delta", "signature": seal(text) if seal else ""}
            signature = _emit("content_block_delta", {"type": "content_block_delta",
                              "index": block.index, "delta": delta})  # fmt: skip
            return [signature, stop]
        if block.kind == "redacted_thinking":
            assert seal is not None
            start = {"type": "redacted_thinking", "data": seal(text)}
            return [_emit("content_block_start", {"type": "content_block_start",
                          "index": block.index, "content_block": start}), stop]  # fmt: skip
        if block.kind == "omitted_thinking":
            return [*self._omitted(block.index, seal(text) if seal else ""), stop]
        return [stop]

    def _omitted(self, index: int, signature: str) -> list[bytes]:
        """An omitted thinking block's start and signature: no text, ever."""
        start = {"type": "thinking", "thinking": "", "signature": ""}
        delta = {"type": "signature_delta", "signature": signature}
        return [_emit("content_block_start", {"type": "content_block_start", "index": index,
                                              "content_block": start}),
                _emit("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": delta})]  # fmt: skip


def _error_type(error: dict[str, Any]) -> str:
    kinds = {"rate_limit_error": "rate_limit_error", "invalid_request_error":
             "invalid_request_error"}  # fmt: skip
    kind = kinds.get(str(error.get("type")))
    if kind is not None:
        return kind
    return "overloaded_error" if error.get("code") in ("upstream_overloaded",) else "api_error"


def _emit(name: str, body: dict[str, Any]) -> bytes:
    return encode_event(name, orjson.dumps(body))
