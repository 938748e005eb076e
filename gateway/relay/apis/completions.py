"""The engine's legacy completion, rewritten for one client (sans-I/O).

The same per-choice splitting as chat (``gateway.relay.choice``) over each choice's ``text``:
the model's reasoning format applies to the generated text, which starts inside the reasoning
only when the prompt ended with the format's open marker (``opened_by``: a raw prompt is the
client's own template). A key allowed to see reasoning gets it in the choice's
``reasoning_content`` (a thinkgate extension of the completions format, as on chat); a hidden
key gets the text without it, and no ``logprobs`` for a choice whose text held reasoning (they
would spell it out). A chunk left with no text and no finish reason is dropped; usage is filled
(``completion_tokens_details.reasoning_tokens``) and reaches the client only if it asked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from gateway.errors import RemoteProtocolError
from gateway.relay.choice import ChoiceState
from gateway.relay.formats import ReasoningFormat
from gateway.relay.rewrite import Rewriter, StreamRelay, parse_chunk, withhold_tokens
from gateway.relay.sse import DONE_EVENT, Event, encode_data


def opened_by(fmt: ReasoningFormat, prompt: str | None) -> ReasoningFormat:
    """``fmt`` as it applies to the output of ``prompt``: inside reasoning from the first byte
    exactly when the prompt ends with the open marker (whitespace after it aside). A format
    without an open marker (the block is always opened for it) is left as it is."""
    if fmt.open is None or not fmt.splits:
        return fmt
    opened = prompt is not None and prompt.rstrip().endswith(fmt.open)
    return dataclasses.replace(fmt, opened=opened)


def _text(choice: dict[str, Any]) -> str | None:
    text = choice.get("text")
    if not isinstance(text, str | None):
        raise RemoteProtocolError("upstream sent a completion text that is not a string")
    return text


class CompletionsWhole(Rewriter):
    """A whole completion."""

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        choices = body.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise RemoteProtocolError("upstream response has malformed 'choices'")
        for choice in choices:
            state = self.choice(int(choice.get("index") or 0))
            state.finish_reason = choice.get("finish_reason")
            reasoning, content = state.take(_text(choice), None, final=True)
            if state.blocked is not None:  # a guardrail ended it where its match began
                choice["finish_reason"] = state.finish_reason = "content_filter"
            place(self, choice, state, reasoning, content)
        usage = body.get("usage")
        if isinstance(usage, dict):
            self.usage = body["usage"] = self.fill_usage(usage)
        return body


class CompletionsRelay(StreamRelay):
    """A streamed completion: one upstream event in, client bytes out."""

    def feed(self, event: Event) -> bytes:
        if event.is_done:
            self.done = True
            return DONE_EVENT
        chunk = parse_chunk(event)
        kept = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                raise RemoteProtocolError("upstream chunk has a choice that is not an object")
            state = self.choice(int(choice.get("index") or 0))
            if state.blocked is not None and state.finish_reason == "content_filter":
                continue  # a guardrail ended it, and the client was told: nothing more
            finish = choice.get("finish_reason")
            if finish is not None:
                state.finish_reason = finish
            reasoning, content = state.take(_text(choice), None, final=finish is not None)
            if state.blocked is not None:
                choice["finish_reason"] = finish = state.finish_reason = "content_filter"
            if place(self, choice, state, reasoning, content) or finish is not None:
                kept.append(choice)
        had_choices = bool(chunk.get("choices"))
        if had_choices:
            chunk["choices"] = kept
        self._usage(chunk)
        if (not kept or not had_choices) and chunk.get("usage") is None:
            return b""  # no text due and no usage to report
        return encode_data(orjson.dumps(chunk))

    def _usage(self, chunk: dict[str, Any]) -> None:
        if chunk.get("usage") is None:
            return
        self.usage = self.fill_usage(chunk["usage"])
        if self.policy.include_usage:
            chunk["usage"] = self.usage
        else:
            del chunk["usage"]


def place(
    rewriter: Rewriter, choice: dict[str, Any], state: ChoiceState, reasoning: str, content: str
) -> bool:
    """Put the choice's text and reasoning per policy; whether it has anything to send."""
    shown = rewriter.policy.show_reasoning
    choice["text"] = content
    choice.pop("reasoning_content", None)
    if reasoning and shown:
        choice["reasoning_content"] = reasoning
    held = state.last_had_reasoning or not state.splitter.idle or bool(reasoning)
    if (held and not shown) or state.guard is not None:  # a guard's text may differ from them
        withhold_tokens(choice)
    return bool(content) or bool(reasoning and shown)
