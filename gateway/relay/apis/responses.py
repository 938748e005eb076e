"""The upstream's chat completion, rewritten as a Responses API response (sans-I/O).

The same per-choice splitting as chat (``gateway.relay.rewrite``: the model's reasoning format,
source and thinking switch, the visibility policy), then shaped as the OpenAI API reference's
Responses objects (items and their events: ``gateway.relay.apis.response_items``):

- Output items, in the order the model produced them: a ``reasoning`` item for a key allowed
  to see reasoning (its text in ``content``, and as a ``summary_text`` part too when the
  request asked for a summary: ``ResponseMeta.summary``), a ``message`` item with one
  ``output_text`` part (left out when the model only called tools: whitespace alone before a
  call is no message), and per tool call of the upstream a ``function_call`` item, or a
  ``custom_tool_call`` for a custom tool, named as the client named the tool
  (``ResponseMeta.tools``). A hidden key never gets a byte of reasoning text: no content, no
  summary, no delta, no count beyond ``usage``.
- Sealed reasoning (``ResponseMeta.seal``, the request included
  ``reasoning.encrypted_content``): the reasoning item carries ``encrypted_content``, made
  when the item closes. A hidden key then gets the item too, without text, announced
  (``output_item.added``) and closed (``.done``) at once when its reasoning ended.
- Streaming (``ResponsesStream``): ``response.created`` and ``response.in_progress`` first
  (a background response: ``created`` and ``response.queued`` at once, status ``queued``,
  ``in_progress`` with the engine's first chunk); each item is announced, grows and closes
  by its events when the next item starts or the stream ends. The terminal event (``end``)
  goes out once the record is durable: ``response.completed``, ``response.incomplete``
  (``incomplete_details.reason: max_output_tokens`` when the engine stopped at the limit) or,
  right after a failure's ``error`` event, ``response.failed`` (the item cut short is in it,
  ``status: incomplete``). Every event carries its ``sequence_number``, from 0.
- ``output_text.logprobs`` (``ResponseMeta.logprobs``): streamed, the engine's logprobs of
  each chunk whose text went to the answer as it came (a chunk that carried reasoning, or
  whose text was held or cut, gives none: they would spell out reasoning or tags); whole, the
  last tokens that spell the answer exactly (``answer_logprobs``).
- ``usage``: ``input_tokens``, ``output_tokens``, ``total_tokens`` and
  ``output_tokens_details.reasoning_tokens`` (filled as on chat).
- One choice only: the Responses API has no ``n``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.names.ids import new_response_id
from gateway.names.tools import ToolMap
from gateway.relay.apis.response_items import (
    Emitted,
    Item,
    ItemKind,
    Shown,
    answer_logprobs,
    logprobs_of,
)
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
from gateway.relay.toolcalls import ToolCallPiece

Sealer = Callable[[str], str]  # reasoning text -> encrypted_content token


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What every response object of one request repeats, and how its items are made."""

    model: str
    echo: dict[str, Any]  # the request's parameters the response repeats
    id: str = field(default_factory=new_response_id)
    created_at: int = field(default_factory=lambda: int(time.time()))
    seal: Sealer | None = None  # set when the request included reasoning.encrypted_content
    tools: ToolMap = field(default_factory=ToolMap)  # the engine's names -> the client's tools
    summary: bool = False  # the request asked for a reasoning summary
    logprobs: bool = False  # the request asked for output_text.logprobs


def response_object(
    meta: ResponseMeta, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
    *, error: dict[str, Any] | None = None, incomplete: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    echo = meta.echo
    return {
        "id": meta.id, "object": "response", "created_at": meta.created_at, "status": status,
        "model": meta.model, "output": output, "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": echo.get("instructions"), "metadata": echo.get("metadata") or {},
        "max_output_tokens": echo.get("max_output_tokens"),
        "temperature": echo.get("temperature"), "top_p": echo.get("top_p"),
        "reasoning": echo.get("reasoning"), "user": echo.get("user"),
        "store": echo.get("store", True),
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "previous_response_id": echo.get("previous_response_id"),
        "tool_choice": echo.get("tool_choice", "auto"), "tools": echo.get("tools", []),
        "text": echo.get("text", {"format": {"type": "text"}}),
        "truncation": echo.get("truncation", "disabled"),
        "background": echo.get("background", False),
        "conversation": echo.get("conversation"),
        "usage": responses_usage(usage),
    }  # fmt: skip


def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat's usage as the Responses API names it."""
    if not usage:
        return None
    details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "input_tokens_details": {"cached_tokens": cached_tokens(usage), "cache_write_tokens": 0},
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "output_tokens_details": {"reasoning_tokens": int(details.get("reasoning_tokens") or 0)},
        "total_tokens": int(usage.get("total_tokens") or 0),
    }


def _status(state: ChoiceState | None) -> tuple[str, str | None]:
    """``(status, incomplete reason)`` of a response whose choice ended so."""
    if state is not None and state.finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if state is not None and state.blocked is not None:  # a guardrail ended it
        return "incomplete", "content_filter"
    return "completed", None


class _Shaping:
    """What both paths share: how this key is shown reasoning, and items made and sealed."""

    policy: Policy
    meta: ResponseMeta

    @property
    def shown(self) -> Shown:
        """A summary only for a key that may see reasoning: a hidden one gets no text."""
        show = self.policy.show_reasoning
        return Shown(show, show and self.meta.summary)

    @property
    def keeps_reasoning(self) -> bool:
        """Whether a reasoning item is made at all: shown, or sealed for the key."""
        return self.policy.show_reasoning or self.meta.seal is not None

    def new(self, kind: ItemKind) -> Item:
        return Item.new(kind, self.meta.id)

    def rendered(self, item: Item, status: str = "completed") -> dict[str, Any]:
        """The item's final object; a reasoning item sealed first (once: the same token
        every time it is rendered)."""
        if item.kind == "reasoning" and self.meta.seal is not None and item.sealed is None:
            item.sealed = self.meta.seal(item.text)
        return item.render(status, self.shown)


class ResponsesWhole(_Shaping, Rewriter):
    """A whole chat completion as one response object."""

    def __init__(self, policy: Policy, meta: ResponseMeta) -> None:
        super().__init__(policy)
        self.meta = meta
        self.final: dict[str, Any] | None = None

    def final_object(self) -> dict[str, Any] | None:
        """The response object as the client got it (for storing)."""
        return self.final

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        choices = body.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        raw_logprobs = first.get("logprobs") if isinstance(first, dict) else None
        rewrite_completion(self, body)  # withholds logprobs where reasoning was: kept above
        state = self.choice(0)
        status, incomplete = _status(state)
        output = []
        reasoning, content = state.shown_text()
        if reasoning and self.keeps_reasoning:
            item = self.new("reasoning")
            item.texts.append(reasoning)
            output.append(self.rendered(item))
        calls = state.tools.calls
        if content.strip() or not calls:  # R1's "\n\n" before a call says nothing
            item = self.new("message")
            item.texts.append(content)
            if self.meta.logprobs and state.guard is None:  # a guard's text may differ
                item.logprobs = answer_logprobs(logprobs_of(raw_logprobs), content)
            output.append(self.rendered(item, status))
        for call in calls:
            item = Item.for_call(call, self.meta.tools.client(call.name), self.meta.id)
            if item.decoder is not None:
                item.decoder.feed("".join(call.arguments))
                item.decoder.close()
            output.append(self.rendered(item))
        self.final = response_object(self.meta, status, output, self.usage, incomplete=incomplete)
        return self.final


class ResponsesStream(_Shaping, EventRelay):
    """The chat stream as Responses events (rules in the module docstring)."""

    def __init__(self, policy: Policy, meta: ResponseMeta) -> None:
        super().__init__(policy)
        self.meta = meta
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # closed items, for the final object
        self._open: Item | None = None
        self._error: dict[str, Any] | None = None
        self._space = ""  # answer text that is only whitespace so far, held (see _choice)
        self._logprobs: list[dict[str, Any]] = []  # of answer text not sent yet
        self._queued = False  # a background response announced itself before the engine

    def error_event(self, error_json: bytes) -> bytes:
        self._error = orjson.loads(error_json)["error"]
        error = self._error or {}
        body = {"type": "error", "code": error.get("code"), "message": error.get("message"),
                "param": error.get("param")}  # fmt: skip
        return b"".join([*([] if self._started else self._start()), self._emit("error", body)])

    def end(self) -> bytes:
        out = [] if self._started else self._start()
        if self._error is None:
            out += self._close()
        elif self._open is not None:  # cut short: kept as it was, no more events after error
            item, self._open = self._open, None
            if item.kind != "reasoning" or self.policy.show_reasoning:
                self._items.append(item.render("incomplete", self.shown))
        if self._error is not None:
            error = {"code": self._error.get("code") or "server_error",
                     "message": self._error.get("message")}  # fmt: skip
            final = response_object(self.meta, "failed", self._items, self.usage, error=error)
            return b"".join([*out, self._emit("response.failed", {"response": final})])
        final = self.final_object()
        return b"".join([*out, self._emit(f"response.{final['status']}", {"response": final})])

    def final_object(self) -> dict[str, Any]:
        """The completed response object, the item still open included as completed (the
        record is written, and the response stored, before ``end`` closes it)."""
        items = list(self._items)
        if self._open is not None:
            items.append(self.rendered(self._open))
        status, incomplete = _status(self.choices.get(0))
        return response_object(self.meta, status, items, self.usage, incomplete=incomplete)

    def queued(self) -> bytes:
        """A background response's first events, before the engine is asked:
        ``response.created`` and ``response.queued`` (status ``queued``);
        ``response.in_progress`` follows with the engine's first chunk."""
        self._queued = True
        shell = response_object(self.meta, "queued", [], None)
        return self._emit("response.created", {"response": shell}) + self._emit(
            "response.queued", {"response": shell}
        )

    def _start(self) -> list[bytes]:
        self._started = True
        shell = response_object(self.meta, "in_progress", [], None)
        created = [] if self._queued else [self._emit("response.created", {"response": shell})]
        return [*created, self._emit("response.in_progress", {"response": shell})]

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        state = self.choice(0)
        if state.blocked is not None:  # a guardrail ended it: nothing more of it goes out
            state.finish_reason = "content_filter"
            return []
        finish = choice.get("finish_reason")
        if finish is not None:
            state.finish_reason = finish
        delta = choice.get("delta") or {}
        text, upstream_reasoning = text_fields(delta)
        reasoning, content = state.take(text, upstream_reasoning, finish is not None)
        if state.blocked is not None:
            state.finish_reason = "content_filter"
            delta = {}
        if self.meta.logprobs and content and content == text and not reasoning \
                and state.guard is None:  # fmt: skip
            self._logprobs += logprobs_of(choice.get("logprobs"))  # text went out as it came
        out: list[bytes] = []
        if reasoning and self.keeps_reasoning:
            out += self._grow("reasoning", reasoning)
        if content:
            out += self._answer(content)
        if "tool_calls" in delta:
            for piece in state.tools.add(delta["tool_calls"]):
                out += self._call(piece)
        if finish is not None and self._space:  # the end: whitespace alone is an answer
            space, self._space = self._space, ""  # only when no tool was called
            out += [] if state.tools.calls else self._grow("message", space)
        return out

    def _answer(self, text: str) -> list[bytes]:
        """Answer text; whitespace that opens no message yet is held: R1 writes "\n\n"
        before a tool call as before an answer, and a message item of it would say nothing."""
        text, self._space = self._space + text, ""
        if (self._open is None or self._open.kind != "message") and not text.strip():
            self._space = text
            return []
        return self._grow("message", text)

    def _grow(self, kind: ItemKind, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self._open is None or self._open.kind != kind:
            out += self._close()
            out += self._announce(self.new(kind))
        item = self._open
        assert item is not None
        item.texts.append(text)
        if kind == "reasoning" and not self.policy.show_reasoning:
            return out  # sealed only: the text leaves once, encrypted, when the item closes
        logprobs: list[dict[str, Any]] = []
        if kind == "message":
            logprobs, self._logprobs = self._logprobs, []
            item.logprobs += logprobs
        return out + self._events(item.grown(len(self._items), text, self.shown, logprobs))

    def _call(self, piece: ToolCallPiece) -> list[bytes]:
        out: list[bytes] = []
        item = self._open
        if piece.new or item is None or item.call is not piece.call:
            out += self._close()
            item = Item.for_call(piece.call, self.meta.tools.client(piece.call.name), self.meta.id)
            out += self._announce(item)
        delta = piece.arguments
        if item.decoder is not None and delta:
            delta = item.decoder.feed(delta)
        if delta:
            out += self._events(item.grown(len(self._items), delta, self.shown))
        return out

    def _announce(self, item: Item) -> list[bytes]:
        """Open ``item``. A reasoning item a key may not read is announced only when it
        closes, sealed."""
        self._open = item
        if item.kind == "reasoning" and not self.policy.show_reasoning:
            return []
        return self._events(item.opened(len(self._items), self.shown))

    def _close(self) -> list[bytes]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = len(self._items)
        out: list[bytes] = []
        if item.decoder is not None:
            rest = item.decoder.close()
            out += self._events(item.grown(index, rest, self.shown)) if rest else []
        done = self.rendered(item)
        self._items.append(done)
        if item.kind == "reasoning" and not self.policy.show_reasoning:
            added = {**done, "status": "in_progress"}
            return self._events([
                ("response.output_item.added", {"output_index": index, "item": added}),
                ("response.output_item.done", {"output_index": index, "item": done}),
            ])  # fmt: skip
        return out + self._events(item.closed(index, done, self.shown))

    def _events(self, emitted: Emitted) -> list[bytes]:
        return [self._emit(name, body) for name, body in emitted]

    def _emit(self, name: str, body: dict[str, Any]) -> bytes:
        data = orjson.dumps({"type": name, "sequence_number": self._sequence, **body})
        self._sequence += 1
        return encode_event(name, data)
