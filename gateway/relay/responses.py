"""The upstream's chat completion, rewritten as a Responses API response (sans-I/O).

The same per-choice splitting as chat (``gateway.relay.rewrite``: the model's reasoning format,
source and thinking switch, the visibility policy), then shaped as the OpenAI API reference's
Responses objects:

- Output items, in the order the model produced them: a ``reasoning`` item (``content:
  [{"type": "reasoning_text", "text"}]``, ``summary: []``) for a key allowed to see
  reasoning, a ``message`` item with one ``output_text`` part (left out when the model only
  called tools: whitespace alone before a call is no message), and a ``function_call`` item
  (``call_id``, ``name``, ``arguments``) per tool call of the upstream. A hidden key never
  gets a byte of reasoning text: no content, no delta, no count beyond ``usage``.
- Sealed reasoning (``ResponseMeta.seal``, the request included
  ``reasoning.encrypted_content``): the reasoning item carries ``encrypted_content``, made
  when the item closes. A hidden key then gets the item too, without ``content``, announced
  (``output_item.added``) and closed (``.done``) at once when its reasoning ended.
- Streaming (``ResponsesStream``): ``response.created`` and ``response.in_progress`` first; an
  item opens with ``response.output_item.added`` and ``response.content_part.added``, grows
  with ``response.reasoning_text.delta`` / ``response.output_text.delta`` /
  ``response.function_call_arguments.delta``, and closes with the matching ``.done`` events
  and ``response.output_item.done`` when the next item starts or the stream ends. The
  terminal event (``end``) goes out once the record is durable: ``response.completed``,
  ``response.incomplete`` (``incomplete_details.reason: max_output_tokens`` when the engine
  stopped at the limit) or, right after a failure's ``error`` event, ``response.failed`` (the
  item cut short is in it, ``status: incomplete``). Every event carries its
  ``sequence_number``, from 0.
- ``usage``: ``input_tokens``, ``output_tokens``, ``total_tokens`` and
  ``output_tokens_details.reasoning_tokens`` (filled as on chat).
- One choice only: the Responses API has no ``n``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.relay.choice import ChoiceState
from gateway.relay.rewrite import (
    EventRelay,
    Policy,
    Rewriter,
    rewrite_completion,
    text_fields,
)
from gateway.relay.sse import encode_event
from gateway.relay.toolcalls import ToolCall, ToolCallPiece

ItemKind = Literal["reasoning", "message", "function_call"]
_TEXT: dict[ItemKind, str] = {"reasoning": "reasoning_text", "message": "output_text"}
_PREFIX: dict[ItemKind, str] = {"reasoning": "rs", "message": "msg", "function_call": "fc"}
Sealer = Callable[[str], str]  # reasoning text -> encrypted_content token


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What every response object of one request repeats, and how reasoning is sealed."""

    model: str
    echo: dict[str, Any]  # the request's parameters the response repeats
    id: str = field(default_factory=lambda: f"resp_{secrets.token_hex(16)}")
    created_at: int = field(default_factory=lambda: int(time.time()))
    seal: Sealer | None = None  # set when the request included reasoning.encrypted_content


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
        "usage": responses_usage(usage),
    }  # fmt: skip


def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat's usage as the Responses API names it."""
    if not usage:
        return None
    details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "output_tokens_details": {"reasoning_tokens": int(details.get("reasoning_tokens") or 0)},
        "total_tokens": int(usage.get("total_tokens") or 0),
    }


@dataclass(slots=True)
class Item:
    """One output item as it grows."""

    kind: ItemKind
    id: str
    texts: list[str] = field(default_factory=list)
    call: ToolCall | None = None  # a function_call's call
    sealed: str | None = None  # a reasoning item's encrypted_content, made once

    @classmethod
    def new(cls, kind: ItemKind, call: ToolCall | None = None) -> Item:
        return cls(kind, f"{_PREFIX[kind]}_{secrets.token_hex(16)}", call=call)

    @property
    def text(self) -> str:
        return "".join(self.call.arguments if self.call is not None else self.texts)

    def seal(self, seal: Sealer | None) -> str | None:
        """The item's ``encrypted_content`` (the same token every time it is rendered)."""
        if seal is not None and self.sealed is None:
            self.sealed = seal(self.text)
        return self.sealed

    def render(self, status: str, *, shown: bool = True, sealed: str | None = None,
               empty: bool = False) -> dict[str, Any]:  # fmt: skip
        """The item object; ``shown`` False leaves a reasoning item's text out (a hidden key
        gets only ``encrypted_content``); ``empty``: as announced, before any text: with
        ``content: []``, its part added by its own ``content_part.added`` event (a client that
        accumulates, openai-node's ``responses.stream()``, adds each part it is told of)."""
        text = self.text
        if self.kind == "reasoning":
            item: dict[str, Any] = {"id": self.id, "type": "reasoning", "summary": []}
            if shown:
                item["content"] = [] if empty else [{"type": "reasoning_text", "text": text}]
            if sealed is not None:
                item["encrypted_content"] = sealed
            item["status"] = status
            return item
        if self.kind == "function_call":
            call = self.call
            assert call is not None
            return {"id": self.id, "type": "function_call", "status": status,
                    "call_id": call.id, "name": call.name,
                    "arguments": "" if empty else text}  # fmt: skip
        return {"id": self.id, "type": "message", "role": "assistant", "status": status,
                "content": [] if empty else [_part("message", text)]}  # fmt: skip


def _part(kind: ItemKind, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _status(state: ChoiceState | None) -> tuple[str, str | None]:
    """``(status, incomplete reason)`` of a response whose choice ended so."""
    if state is not None and state.finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


class ResponsesWhole(Rewriter):
    """A whole chat completion as one response object."""

    def __init__(self, policy: Policy, meta: ResponseMeta) -> None:
        super().__init__(policy)
        self.meta = meta
        self.final: dict[str, Any] | None = None

    def final_object(self) -> dict[str, Any] | None:
        """The response object as the client got it (for storing)."""
        return self.final

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        rewrite_completion(self, body)
        state = self.choice(0)
        status, incomplete = _status(state)
        output = []
        reasoning, content = "".join(state.reasoning), "".join(state.content)
        shown, seal = self.policy.show_reasoning, self.meta.seal
        if reasoning and (shown or seal is not None):
            item = Item.new("reasoning")
            item.texts.append(reasoning)
            output.append(item.render("completed", shown=shown, sealed=item.seal(seal)))
        calls = state.tools.calls
        if content.strip() or not calls:  # R1's "\n\n" before a call says nothing
            item = Item.new("message")
            item.texts.append(content)
            output.append(item.render(status))
        output += [Item.new("function_call", call).render("completed") for call in calls]
        self.final = response_object(self.meta, status, output, self.usage, incomplete=incomplete)
        return self.final


class ResponsesStream(EventRelay):
    """The chat stream as Responses events (rules in the module docstring)."""

    def __init__(self, policy: Policy, meta: ResponseMeta) -> None:
        super().__init__(policy)
        self.meta = meta
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # closed items, for the final object
        self._open: Item | None = None
        self._error: dict[str, Any] | None = None
        self._space = ""  # answer text that is only whitespace so far, held (see _choice)

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
                self._items.append(item.render("incomplete", shown=self.policy.show_reasoning))
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
        item = self._open
        if item is not None:
            items.append(self._rendered(item))
        status, incomplete = _status(self.choices.get(0))
        return response_object(self.meta, status, items, self.usage, incomplete=incomplete)

    def _rendered(self, item: Item) -> dict[str, Any]:
        if item.kind != "reasoning":
            return item.render("completed")
        shown = self.policy.show_reasoning
        return item.render("completed", shown=shown, sealed=item.seal(self.meta.seal))

    def _start(self) -> list[bytes]:
        self._started = True
        shell = response_object(self.meta, "in_progress", [], None)
        return [
            self._emit("response.created", {"response": shell}),
            self._emit("response.in_progress", {"response": shell}),
        ]

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        state = self.choice(0)
        finish = choice.get("finish_reason")
        if finish is not None:
            state.finish_reason = finish
        delta = choice.get("delta") or {}
        text, upstream_reasoning = text_fields(delta)
        reasoning, content = state.take(text, upstream_reasoning, finish is not None)
        out: list[bytes] = []
        if reasoning and (self.policy.show_reasoning or self.meta.seal is not None):
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
            out += self._announce(Item.new(kind))
        item = self._open
        assert item is not None
        item.texts.append(text)
        if kind == "reasoning" and not self.policy.show_reasoning:
            return out  # sealed only: the text leaves once, encrypted, when the item closes
        body: dict[str, Any] = {"item_id": item.id, "output_index": len(self._items),
                                "content_index": 0, "delta": text}  # fmt: skip
        if kind == "message":
            body["logprobs"] = []
        out.append(self._emit(f"response.{_TEXT[kind]}.delta", body))
        return out

    def _call(self, piece: ToolCallPiece) -> list[bytes]:
        out: list[bytes] = []
        item = self._open
        if piece.new or item is None or item.call is not piece.call:
            out += self._close()
            item = Item.new("function_call", piece.call)
            out += self._announce(item)
        if piece.arguments:
            out.append(self._emit("response.function_call_arguments.delta", {
                "item_id": item.id, "output_index": len(self._items),
                "delta": piece.arguments}))  # fmt: skip
        return out

    def _announce(self, item: Item) -> list[bytes]:
        """Open ``item``: ``output_item.added`` and, for text items, ``content_part.added``. A
        reasoning item a key may not read is announced only when it closes, sealed."""
        self._open = item
        index = len(self._items)
        if item.kind == "reasoning" and not self.policy.show_reasoning:
            return []
        added = item.render("in_progress", empty=True)
        out = [self._emit("response.output_item.added", {"output_index": index, "item": added})]
        if item.kind != "function_call":
            out.append(self._emit("response.content_part.added", {
                "item_id": item.id, "output_index": index, "content_index": 0,
                "part": _part(item.kind, "")}))  # fmt: skip
        return out

    def _close(self) -> list[bytes]:
        item, self._open = self._open, None
        if item is None:
            return []
        index, text = len(self._items), item.text
        done = self._rendered(item)
        self._items.append(done)
        if item.kind == "function_call":
            return [
                self._emit(
                    "response.function_call_arguments.done",
                    {
                        "item_id": item.id,
                        "output_index": index,
                        "name": done["name"],
                        "arguments": text,
                    },
                ),
                self._emit("response.output_item.done", {"output_index": index, "item": done}),
            ]
        if item.kind == "reasoning" and not self.policy.show_reasoning:
            added = {**done, "status": "in_progress"}
            return [
                self._emit("response.output_item.added", {"output_index": index, "item": added}),
                self._emit("response.output_item.done", {"output_index": index, "item": done}),
            ]
        kind = item.kind
        body: dict[str, Any] = {"item_id": item.id, "output_index": index, "content_index": 0,
                                "text": text}  # fmt: skip
        if kind == "message":
            body["logprobs"] = []
        part = {"item_id": item.id, "output_index": index, "content_index": 0,
                "part": _part(kind, text)}  # fmt: skip
        return [
            self._emit(f"response.{_TEXT[kind]}.done", body),
            self._emit("response.content_part.done", part),
            self._emit("response.output_item.done", {"output_index": index, "item": done}),
        ]

    def _emit(self, name: str, body: dict[str, Any]) -> bytes:
        data = orjson.dumps({"type": name, "sequence_number": self._sequence, **body})
        self._sequence += 1
        return encode_event(name, data)
