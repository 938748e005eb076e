"""The upstream's chat completion, rewritten as a Responses API response (sans-I/O).

The same per-choice splitting as chat (``gateway.relay.rewrite``: the model's reasoning format,
source and thinking switch, the visibility policy), then shaped as the OpenAI API reference's
Responses objects:

- Output items, in the order the model produced them: a ``reasoning`` item (``content:
  [{"type": "reasoning_text", "text"}]``, ``summary: []``) only for a key allowed to see
  reasoning, then a ``message`` item with one ``output_text`` part. A hidden key never gets a
  byte of reasoning: no item, no delta, no count beyond ``usage``.
- Streaming (``ResponsesStream``): ``response.created`` and ``response.in_progress`` first; an
  item opens with ``response.output_item.added`` and ``response.content_part.added``, grows
  with ``response.reasoning_text.delta`` / ``response.output_text.delta``, and closes with the
  matching ``.done`` events and ``response.output_item.done`` when the next item starts or the
  stream ends. The terminal event (``end``) goes out once the record is durable:
  ``response.completed``, ``response.incomplete`` (``incomplete_details.reason:
  max_output_tokens`` when the engine stopped at the limit) or, right after a failure's
  ``error`` event, ``response.failed`` (the item cut short is in it, ``status:
  incomplete``). Every event carries its ``sequence_number``, from 0.
- ``usage``: ``input_tokens``, ``output_tokens``, ``total_tokens`` and
  ``output_tokens_details.reasoning_tokens`` (filled as on chat).
- One choice only: the Responses API has no ``n``.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.errors import RemoteProtocolError, UpstreamStatusError
from gateway.relay.rewrite import Policy, Rewriter, StreamRelay, rewrite_completion, text_fields
from gateway.relay.sse import Event, encode_event

ItemKind = Literal["reasoning", "message"]
_TEXT: dict[ItemKind, str] = {"reasoning": "reasoning_text", "message": "output_text"}


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What every response object of one request repeats."""

    model: str
    echo: dict[str, Any]  # the request's parameters the response repeats
    id: str = field(default_factory=lambda: f"resp_{secrets.token_hex(16)}")
    created_at: int = field(default_factory=lambda: int(time.time()))


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
        "store": echo.get("store") is not False, "parallel_tool_calls": False,
        "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
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


def _item(kind: ItemKind, item_id: str, text: str, status: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [_part("message", text)]}  # fmt: skip


def _part(kind: ItemKind, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _new_id(kind: ItemKind) -> str:
    return f"{'rs' if kind == 'reasoning' else 'msg'}_{secrets.token_hex(16)}"


class ResponsesWhole(Rewriter):
    """A whole chat completion as one response object."""

    def __init__(self, policy: Policy, meta: ResponseMeta) -> None:
        super().__init__(policy)
        self.meta = meta

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        rewrite_completion(self, body)
        state = self.choice(0)
        output = []
        reasoning, content = "".join(state.reasoning), "".join(state.content)
        if reasoning and self.policy.show_reasoning:
            output.append(_item("reasoning", _new_id("reasoning"), reasoning, "completed"))
        incomplete = "max_output_tokens" if state.finish_reason == "length" else None
        status = "incomplete" if incomplete else "completed"
        output.append(_item("message", _new_id("message"), content, status))
        return response_object(self.meta, status, output, self.usage, incomplete=incomplete)


class ResponsesStream(StreamRelay):
    """The chat stream as Responses events (rules in the module docstring)."""

    def __init__(self, policy: Policy, meta: ResponseMeta) -> None:
        super().__init__(policy)
        self.meta = meta
        self._sequence = 0
        self._started = False
        self._items: list[dict[str, Any]] = []  # closed items, for the final object
        self._open: tuple[ItemKind, str, list[str]] | None = None
        self._error: dict[str, Any] | None = None

    def feed(self, event: Event) -> bytes:
        out = [] if self._started else self._start()
        if event.is_done:
            self.done = True
            return b"".join(out)
        chunk = _chunk(event)
        if chunk.get("usage"):
            self.usage = self.fill_usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and int(choice.get("index") or 0) == 0:
                out += self._choice(choice)
        return b"".join(out)

    def error_event(self, error_json: bytes) -> bytes:
        self._error = orjson.loads(error_json)["error"]
        error = self._error or {}
        body = {"type": "error", "code": error.get("code"), "message": error.get("message"),
                "param": error.get("param")}  # fmt: skip
        return b"".join([*([] if self._started else self._start()), self._emit("error", body)])

    def end(self) -> bytes:
        out = [] if self._started else self._start()
        state = self.choices.get(0)
        if self._error is None:
            out += self._close()
        elif self._open is not None:  # cut short: kept as it was, no more events after error
            kind, item_id, texts = self._open
            self._items.append(_item(kind, item_id, "".join(texts), "incomplete"))
            self._open = None
        if self._error is not None:
            error = {"code": self._error.get("code") or "server_error",
                     "message": self._error.get("message")}  # fmt: skip
            final = response_object(self.meta, "failed", self._items, self.usage, error=error)
            return b"".join([*out, self._emit("response.failed", {"response": final})])
        incomplete = "max_output_tokens" if state and state.finish_reason == "length" else None
        status = "incomplete" if incomplete else "completed"
        final = response_object(self.meta, status, self._items, self.usage, incomplete=incomplete)
        return b"".join([*out, self._emit(f"response.{status}", {"response": final})])

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
        text, upstream_reasoning = text_fields(choice.get("delta") or {})
        reasoning, content = state.take(text, upstream_reasoning, finish is not None)
        out: list[bytes] = []
        if reasoning and self.policy.show_reasoning:
            out += self._grow("reasoning", reasoning)
        if content:
            out += self._grow("message", content)
        return out

    def _grow(self, kind: ItemKind, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self._open is None or self._open[0] != kind:
            out += self._close()
            item_id = _new_id(kind)
            self._open = (kind, item_id, [])
            index = len(self._items)
            out.append(
                self._emit(
                    "response.output_item.added",
                    {"output_index": index, "item": _item(kind, item_id, "", "in_progress")},
                )
            )
            out.append(self._emit("response.content_part.added", {
                "item_id": item_id, "output_index": index, "content_index": 0,
                "part": _part(kind, "")}))  # fmt: skip
        _, item_id, texts = self._open
        texts.append(text)
        name = f"response.{_TEXT[kind]}.delta"
        body: dict[str, Any] = {"item_id": item_id, "output_index": len(self._items),
                                "content_index": 0, "delta": text}  # fmt: skip
        if kind == "message":
            body["logprobs"] = []
        out.append(self._emit(name, body))
        return out

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        kind, item_id, texts = self._open
        self._open = None
        text, index = "".join(texts), len(self._items)
        done = f"response.{_TEXT[kind]}.done"
        body: dict[str, Any] = {"item_id": item_id, "output_index": index, "content_index": 0,
                                "text": text}  # fmt: skip
        if kind == "message":
            body["logprobs"] = []
        item = _item(kind, item_id, text, "completed")
        self._items.append(item)
        return [
            self._emit(done, body),
            self._emit(
                "response.content_part.done",
                {
                    "item_id": item_id,
                    "output_index": index,
                    "content_index": 0,
                    "part": _part(kind, text),
                },
            ),
            self._emit("response.output_item.done", {"output_index": index, "item": item}),
        ]

    def _emit(self, name: str, body: dict[str, Any]) -> bytes:
        data = orjson.dumps({"type": name, "sequence_number": self._sequence, **body})
        self._sequence += 1
        return encode_event(name, data)


def _chunk(event: Event) -> dict[str, Any]:
    try:
        chunk = orjson.loads(event.data)
    except orjson.JSONDecodeError:
        raise RemoteProtocolError("upstream sent an event that is not JSON") from None
    if not isinstance(chunk, dict):
        raise RemoteProtocolError("upstream sent an event that is not a JSON object")
    if event.event == "error" or "error" in chunk or chunk.get("object") == "error":
        raise UpstreamStatusError.from_body(chunk, 502)
    return chunk
