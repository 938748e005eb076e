"""Responses output items as they grow, rendered and announced as the OpenAI API reference
shapes them (sans-I/O; ``gateway.relay.apis.responses`` drives them).

Item kinds and their objects:

- ``reasoning``: ``{"id", "type", "summary", "content"?, "encrypted_content"?, "status"}``.
  ``content`` (one ``reasoning_text`` part) only for a key that may see reasoning;
  ``summary`` holds one ``summary_text`` part, the model's own trace whole, when the request
  asked for a summary (``Shown.summary``); a sealed item carries ``encrypted_content``.
- ``message``: one ``output_text`` part (``annotations``, ``logprobs``).
- ``function_call``: ``call_id``, ``name`` and ``namespace`` as the client named the tool
  (``gateway.api.tools.ToolMap``), ``arguments``.
- ``custom_tool_call``: ``call_id``, ``name``, ``namespace``, ``input`` (the free-form input,
  decoded from the function arguments that carry it: ``gateway.relay.apis.freeform``). The
  reference's object has no ``status``, so it has none.

Streamed, an item is announced with no text (``response.output_item.added``; a text item's
part then comes in its own ``content_part.added``, a summary's in
``reasoning_summary_part.added``), grows by deltas (``reasoning_text``, or
``reasoning_summary_text`` when summarised; ``output_text``; ``function_call_arguments``;
``custom_tool_call_input``), and closes with the matching ``.done`` events, then
``response.output_item.done`` with the whole item. A summarised reasoning item streams its
text once, as the summary (clients that show reasoning read summaries; sending both kinds
of delta would double the stream and show it twice where both are read as "thinking"); its
``content`` is in the item's ``.done`` object and the response, for clients that read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.names.ids import item_id
from gateway.names.tools import ClientTool
from gateway.relay.apis.freeform import InputDecoder
from gateway.relay.toolcalls import ToolCall

ItemKind = Literal["reasoning", "message", "function_call", "custom_tool_call"]
Emitted = list[tuple[str, dict[str, Any]]]  # (event type, its fields)


@dataclass(frozen=True, slots=True)
class Shown:
    """What a key is shown of reasoning: its text, and as a summary too."""

    text: bool
    summary: bool = False


@dataclass(slots=True)
class Item:
    """One output item as it grows."""

    kind: ItemKind
    id: str
    texts: list[str] = field(default_factory=list)
    call: ToolCall | None = None  # a tool call's engine call
    tool: ClientTool | None = None  # ... and the client's tool it calls
    decoder: InputDecoder | None = None  # a custom tool call's input
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # a message's output_text's
    sealed: str | None = None  # a reasoning item's encrypted_content, made once

    @classmethod
    def new(cls, kind: ItemKind, response_id: str) -> Item:
        return cls(kind, item_id(kind, response_id))

    @classmethod
    def for_call(cls, call: ToolCall, tool: ClientTool, response_id: str) -> Item:
        kind: ItemKind = "custom_tool_call" if tool.kind == "custom" else "function_call"
        decoder = InputDecoder() if kind == "custom_tool_call" else None
        return cls(kind, item_id(kind, response_id), call=call, tool=tool, decoder=decoder)

    @property
    def text(self) -> str:
        """The item's text: reasoning or answer, a call's arguments, a custom call's input."""
        if self.decoder is not None:
            return self.decoder.input
        if self.call is not None:
            return "".join(self.call.arguments)
        return "".join(self.texts)

    def render(self, status: str, shown: Shown, *, empty: bool = False) -> dict[str, Any]:
        """The item object; ``empty``: as announced, before any text."""
        text = "" if empty else self.text
        if self.kind == "reasoning":
            return self._reasoning(status, shown, empty)
        if self.kind == "message":
            content = [] if empty else [output_text(text, self.logprobs)]
            return {"id": self.id, "type": "message", "role": "assistant", "status": status,
                    "content": content}  # fmt: skip
        assert self.call is not None and self.tool is not None
        item: dict[str, Any] = {"id": self.id, "type": self.kind}
        if self.kind == "function_call":
            item["status"] = status
        item.update(call_id=self.call.id, name=self.tool.name)
        if self.tool.namespace is not None:
            item["namespace"] = self.tool.namespace
        item["input" if self.kind == "custom_tool_call" else "arguments"] = text
        return item

    def _reasoning(self, status: str, shown: Shown, empty: bool) -> dict[str, Any]:
        """A reasoning item: announced summarised, it has no ``content`` to add parts to."""
        text = self.text
        summarised = shown.text and shown.summary and not empty
        item: dict[str, Any] = {"id": self.id, "type": "reasoning",
                                "summary": [summary_text(text)] if summarised else []}  # fmt: skip
        if shown.text and not (empty and shown.summary):
            item["content"] = [] if empty else [{"type": "reasoning_text", "text": text}]
        if self.sealed is not None:
            item["encrypted_content"] = self.sealed
        item["status"] = status
        return item

    def opened(self, index: int, shown: Shown) -> Emitted:
        """The events that announce the item (a shown reasoning item, or any other)."""
        added = self.render("in_progress", shown, empty=True)
        out: Emitted = [("response.output_item.added", {"output_index": index, "item": added})]
        where = {"item_id": self.id, "output_index": index}
        if self.kind == "reasoning" and shown.summary:
            out.append(("response.reasoning_summary_part.added",
                        {**where, "summary_index": 0, "part": summary_text("")}))  # fmt: skip
        elif self.kind in ("reasoning", "message"):
            part = reasoning_text("") if self.kind == "reasoning" else output_text("", [])
            out.append(("response.content_part.added",
                        {**where, "content_index": 0, "part": part}))  # fmt: skip
        return out

    def grown(self, index: int, delta: str, shown: Shown,
              logprobs: list[dict[str, Any]] | None = None) -> Emitted:  # fmt: skip
        """The delta event of ``delta`` (a shown item's)."""
        where: dict[str, Any] = {"item_id": self.id, "output_index": index}
        if self.kind == "reasoning" and shown.summary:
            return [("response.reasoning_summary_text.delta",
                     {**where, "summary_index": 0, "delta": delta})]  # fmt: skip
        if self.kind == "reasoning":
            return [("response.reasoning_text.delta", {**where, "content_index": 0,
                                                        "delta": delta})]  # fmt: skip
        if self.kind == "message":
            return [("response.output_text.delta", {**where, "content_index": 0, "delta": delta,
                                                     "logprobs": logprobs or []})]  # fmt: skip
        name = "custom_tool_call_input" if self.kind == "custom_tool_call" else (
            "function_call_arguments")  # fmt: skip
        return [(f"response.{name}.delta", {**where, "delta": delta})]

    def closed(self, index: int, done: dict[str, Any], shown: Shown) -> Emitted:
        """The events that close the item, ``done`` its final object."""
        where: dict[str, Any] = {"item_id": self.id, "output_index": index}
        text, last = self.text, ("response.output_item.done",
                                 {"output_index": index, "item": done})  # fmt: skip
        if self.kind == "function_call":
            return [("response.function_call_arguments.done",
                     {**where, "name": done["name"], "arguments": text}), last]  # fmt: skip
        if self.kind == "custom_tool_call":
            return [("response.custom_tool_call_input.done", {**where, "input": text}), last]
        if self.kind == "reasoning" and shown.summary:
            summary = {**where, "summary_index": 0}
            return [("response.reasoning_summary_text.done", {**summary, "text": text}),
                    ("response.reasoning_summary_part.done",
                     {**summary, "part": summary_text(text)}), last]  # fmt: skip
        part = {**where, "content_index": 0}
        if self.kind == "reasoning":
            return [("response.reasoning_text.done", {**part, "text": text}),
                    ("response.content_part.done", {**part, "part": reasoning_text(text)}),
                    last]  # fmt: skip
        return [("response.output_text.done", {**part, "text": text, "logprobs": self.logprobs}),
                ("response.content_part.done",
                 {**part, "part": output_text(text, self.logprobs)}), last]  # fmt: skip


def output_text(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def reasoning_text(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def summary_text(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def logprobs_of(entries: Any) -> list[dict[str, Any]]:
    """A chat choice's ``logprobs.content`` entries as ``output_text.logprobs`` (the same
    fields: ``token``, ``logprob``, ``bytes``, ``top_logprobs``); anything malformed: none."""
    content = entries.get("content") if isinstance(entries, dict) else None
    if not isinstance(content, list) or not all(isinstance(e, dict) for e in content):
        return []
    return [{"token": e.get("token"), "logprob": e.get("logprob"), "bytes": e.get("bytes"),
             "top_logprobs": e.get("top_logprobs") or []} for e in content]  # fmt: skip


def answer_logprobs(entries: list[dict[str, Any]], answer: str) -> list[dict[str, Any]]:
    """The entries of a whole message's logprobs that spell ``answer``, its end: the answer
    follows the reasoning in the engine's output, so its tokens are the last ones whose text
    makes it up exactly; none when they do not (a token that is not whole text)."""
    taken, length = [], 0
    for entry in reversed(entries):
        if length >= len(answer):
            break
        token = entry.get("token")
        if not isinstance(token, str):
            return []
        taken.append(entry)
        length += len(token)
    taken.reverse()
    spelled = "".join(str(e["token"]) for e in taken)
    return taken if answer and spelled == answer else []
