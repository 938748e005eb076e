"""Rewrites an upstream chat completion for one client (sans-I/O): the chunk path.

``StreamRelay.feed(event) -> bytes`` takes one upstream SSE event and returns the bytes to send
to the client (often the upstream's own bytes, re-framed; ``b""`` when nothing is due).
``rewrite_completion(body)`` does the same for a non-streaming response, through the same
per-choice code, so the two can never disagree.

Rules, per choice (state is kept per ``index``, so ``n > 1`` works):

- Each choice's text is split by its ``ChoiceState`` (``gateway.relay.choice``): ``content`` through
  the model's reasoning format, or, where the upstream separates reasoning itself (vLLM with
  ``--reasoning-parser``: ``reasoning_source: upstream``, or a reasoning field seen), its
  reasoning field, repaired for vLLM's known defects; with thinking off for the request,
  nothing is split. A chunk with ``finish_reason`` closes the choice so held-back text leaves
  with it.
- Reasoning goes to the client only when the policy shows it, in ``reasoning_content``,
  ``reasoning`` or both (``REASONING_FIELD``). A hidden policy removes every byte of it,
  including ``logprobs`` and ``token_ids`` of chunks that carried reasoning (they would spell it
  out: ``withhold_tokens``). A choice under guardrail policies has neither at all: they would
  spell out what a redaction removed.
- Tool calls pass through as the upstream sent them, and are kept for the record.
- An absent channel is absent: no ``"content": ""``; a choice left with an empty delta and no
  ``finish_reason`` is dropped, and so is a chunk left with no choices.
- The gateway always asks the upstream for usage; the usage chunk reaches the client only if
  it asked (``stream_options.include_usage``). ``usage: null`` placeholders are left alone.
- ``completion_tokens_details.reasoning_tokens``: the upstream's figure when it reports one
  above zero. Otherwise thinkgate counts: when every upstream delta carried one token (deltas ==
  ``completion_tokens``, vLLM's normal streaming) the reasoning deltas are the exact count (tag
  tokens included; behind vLLM's reasoning parser, which sends no delta for the ``</think>``
  token, one delta short per choice whose reasoning ended, that token counted as reasoning);
  when tokens were merged into fewer deltas, or for a non-streaming response,
  ``completion_tokens`` is shared out in proportion to the characters of reasoning and content.

Unchanged chunks are re-framed from the upstream's bytes without re-encoding the JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import RemoteProtocolError, UpstreamStatusError
from gateway.relay.choice import ChoiceState
from gateway.relay.effort import Budget, continuation_body, continuation_prefix
from gateway.relay.formats import BUILTIN, ReasoningField, ReasoningFormat, ReasoningSource
from gateway.relay.guarding import TextGuard
from gateway.relay.sse import DONE_EVENT, KEEPALIVE_COMMENT, Event, encode_data, encode_event
from gateway.relay.thinksplit import State

_TEXT_KEYS = ("content", "reasoning_content", "reasoning")
_UNCHANGED, _CHANGED, _DROPPED = object(), object(), object()
_DELTA_KEYS = {
    "content": b'"delta":{"content":',
    "reasoning_content": b'"delta":{"reasoning_content":',
    "reasoning": b'"delta":{"reasoning":',
}
_RENAMES = {
    "reasoning_content": _DELTA_KEYS["reasoning_content"],
    "reasoning": _DELTA_KEYS["reasoning"],
}


@dataclass(frozen=True, slots=True)
class Policy:
    format: ReasoningFormat
    show_reasoning: bool
    reasoning_field: ReasoningField
    include_usage: bool = False
    repair_leak: bool = False  # streamed with ``stop``: see gateway.relay.choice (vLLM #51641)
    source: ReasoningSource = "text"
    thinking: bool = True  # the request's own switch (ReasoningFormat.thinking)
    budget: Budget | None = None  # the reasoning budget (gateway.relay.effort)
    max_tokens: int = 0  # the output limit a continuation shares (with a budget)
    guard: Callable[[], TextGuard] | None = None  # a guard per choice (guardrail policies)
    choices: int = 1  # how many the request asked for (``n``): all blocked ends the stream

    @classmethod
    def named(cls, parser: str, show_reasoning: bool, reasoning_field: ReasoningField,
              **kwargs: Any) -> Policy:  # fmt: skip
        """A policy for a built-in format by name (tests, benchmarks)."""
        return cls(BUILTIN[parser], show_reasoning, reasoning_field, **kwargs)


class Rewriter:
    """Per-request state shared by the streaming and non-streaming paths."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.choices: dict[int, ChoiceState] = {}
        self.usage: dict[str, Any] | None = None
        self.spent = 0  # tokens of the upstream turn the gateway cut short (its budget)
        self.cutting = False  # the budget was spent: the turn must continue after the reasoning
        self.continued = False  # the answer comes from a continuation (at most one)
        self.upstream_tokens: int | None = None  # the engine's running count, when it sends one

    def budget_spent(self) -> bool:
        """Whether the one choice's reasoning just reached the point where the gateway ends it
        (``Budget.cut_at``); once per request."""
        budget = self.policy.budget
        cut_at = budget.cut_at if budget is not None else None
        if cut_at is None or self.continued or self.cutting:
            return False
        state = self.choices.get(0)
        return (
            state is not None
            and state.thinking
            and state.splitter.in_reasoning
            and (self.upstream_tokens or state.reasoning_tokens) >= cut_at
        )

    def continuation(self, upstream_body: bytes) -> bytes:
        """End the reasoning here and return the body of the request that continues the turn
        after it (``gateway.relay.effort``); the answer then comes from that request."""
        state = self.choices[0]
        state.end_reasoning()
        spent = self.upstream_tokens if self.upstream_tokens is not None else state.deltas
        self.spent, self.cutting, self.continued = spent, False, True
        prefix = continuation_prefix(self.policy.format, state.model_reasoning())
        body = continuation_body(orjson.loads(upstream_body), prefix, self.spent,
                                 self.policy.max_tokens)  # fmt: skip
        return orjson.dumps(body)

    @property
    def all_blocked(self) -> bool:
        """Whether guardrail policies ended every choice the request asked for: nothing more
        of the engine's output can reach the client."""
        blocked = sum(1 for state in self.choices.values() if state.blocked is not None)
        return blocked >= self.policy.choices

    @property
    def has_content(self) -> bool:
        """Whether any answer text (not reasoning) has been produced yet."""
        return any(state.content for state in self.choices.values())

    def choice(self, index: int) -> ChoiceState:
        state = self.choices.get(index)
        if state is None:
            p = self.policy
            state = ChoiceState.start(
                p.format, p.source, thinking=p.thinking, repair_leak=p.repair_leak,
                guard=p.guard() if p.guard is not None else None,
            )  # fmt: skip
            self.choices[index] = state
        return state

    def rewrite_fields(
        self, holder: dict[str, Any], state: ChoiceState, final: bool
    ) -> dict[str, Any]:
        """The delta/message with content split and reasoning placed per policy: ``holder``
        itself when nothing changes, else a new dict."""
        text, upstream_reasoning = text_fields(holder)
        reasoning, content = state.take(text, upstream_reasoning, final)
        shown = self.policy.show_reasoning and reasoning
        if upstream_reasoning is None and not shown and (content or None) == text:
            return holder  # the common case: nothing to place, remove or change
        return self._fields({k: v for k, v in holder.items() if k not in _TEXT_KEYS},
                            reasoning, content)  # fmt: skip

    def _fields(self, out: dict[str, Any], reasoning: str, content: str) -> dict[str, Any]:
        """``out`` (a delta or message without its text) with the split text placed."""
        if content:
            out["content"] = content
        if reasoning and self.policy.show_reasoning:
            if self.policy.reasoning_field != "reasoning":
                out["reasoning_content"] = reasoning
            if self.policy.reasoning_field != "reasoning_content":
                out["reasoning"] = reasoning
        return out

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A whole (non-streamed) response, rewritten in place: ``rewrite_completion``. A
        variant for another API overrides this and ``StreamRelay.feed``; the forward loop
        calls only these two."""
        return rewrite_completion(self, body)

    def fill_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """``usage`` with ``completion_tokens_details.reasoning_tokens`` filled in."""
        details = dict(usage.get("completion_tokens_details") or {})
        if self.continued:  # the continuation's usage, plus the turn cut short before it
            usage = {**usage, "completion_tokens": int(usage.get("completion_tokens") or 0)
                     + self.spent, "total_tokens": int(usage.get("total_tokens") or 0)
                     + self.spent}  # fmt: skip
        if not self.policy.thinking:  # nothing was reasoning, whatever the engine counted
            details["reasoning_tokens"] = 0
        elif self.continued:  # the turn was cut inside its reasoning: all of it was reasoning
            details["reasoning_tokens"] = self.spent
        elif not details.get("reasoning_tokens"):
            details["reasoning_tokens"] = self.count_reasoning_tokens(
                int(usage.get("completion_tokens") or 0)
            )
        return {**usage, "completion_tokens_details": details}

    def count_reasoning_tokens(self, completion_tokens: int) -> int:
        states = self.choices.values()
        deltas = sum(s.deltas for s in states)
        # vLLM's reasoning parser sends no delta for the </think> token that ends the reasoning
        closed = sum(1 for s in states if s.separated and s.reasoning and s.content)
        if deltas and deltas + closed == completion_tokens:
            return sum(s.reasoning_deltas for s in states) + closed
        r_chars = sum(len(p) for s in states for p in s.reasoning)
        c_chars = sum(len(p) for s in states for p in s.content)
        if not r_chars:
            return 0
        return min(completion_tokens, round(completion_tokens * r_chars / (r_chars + c_chars)))


class StreamRelay(Rewriter):
    """The streaming path: one upstream SSE event in, client bytes out."""

    keepalive = KEEPALIVE_COMMENT  # what keeps the client's connection while nothing is due

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.done = False
        # a guardrail ended every choice: the stream ends here and the engine's request is
        # closed (it stops generating), before its [DONE]
        self.stopped = False
        self._rename_to = _RENAMES.get(policy.reasoning_field)
        self.first_id: bytes | None = None  # after a cut: the chunk id the client knows
        self._ids: tuple[bytes, bytes] | None = None  # (continuation's, first's), as JSON

    def note_usage(self, chunk: dict[str, Any]) -> None:
        """Keep a chunk's usage (for relays that shape their own events): the running count a
        budget asked for, or the final usage."""
        usage = chunk.get("usage")
        if not usage:
            return
        if chunk.get("choices") and self._counting():
            self.upstream_tokens = int(usage.get("completion_tokens") or 0)
        else:
            self.usage = self.fill_usage(usage)

    def _counting(self) -> bool:
        """Whether the engine was asked for a running token count (``continuous_usage_stats``):
        the gateway keeps this request's budget, and the turn was not continued yet."""
        budget = self.policy.budget
        return budget is not None and budget.enforcement == "gateway" and not self.continued

    def cut_at(self, event: Event) -> None:
        """The budget was spent at ``event``: the turn continues in another upstream
        request, whose chunks keep this one's id for the client (``as_first``)."""
        self.cutting = True
        chunk_id = parse_chunk(event).get("id")
        self.first_id = orjson.dumps(chunk_id) if isinstance(chunk_id, str) else None

    def as_first(self, data: bytes, event: Event) -> bytes:
        """``data`` (from a continuation's ``event``) with the first request's chunk id."""
        if self.first_id is None or event.is_done:
            return data
        if self._ids is None:
            chunk_id = parse_chunk(event).get("id")
            if not isinstance(chunk_id, str):
                return data
            self._ids = (b'"id":' + orjson.dumps(chunk_id), b'"id":' + self.first_id)
        return data.replace(*self._ids, 1)

    def error_event(self, error_json: bytes) -> bytes:
        """The one event that tells the client the stream failed (``error_json``: the error
        object); ``end`` follows once the record is written."""
        return encode_event("error", error_json)

    def end(self) -> bytes:
        """The stream's last bytes, sent once its record is as durable as ``AUDIT_MODE`` says
        (chat: ``[DONE]``, after a success as after a failure)."""
        return DONE_EVENT

    def feed(self, event: Event) -> bytes:
        if event.is_done:
            self.done = True
            return DONE_EVENT
        chunk = parse_chunk(event)
        if self.policy.guard is None:  # every choice guarded, or none
            fast = self._fast_path(chunk, event.data)
        else:
            fast = self._guarded(chunk, event.data)
        if fast is not None:
            return fast
        return self._encoded(chunk, event.data, self._rewrite_choices(chunk))

    def _encoded(self, chunk: dict[str, Any], raw: bytes, changed: bool) -> bytes:
        """The client's bytes of a chunk whose choices were rewritten (``changed``: in place)."""
        if "usage" in chunk:
            changed = self._rewrite_usage(chunk) or changed
        if not chunk.get("choices") and chunk.get("usage") is None:
            return b""  # every choice was dropped and there is no usage to report
        return encode_data(orjson.dumps(chunk) if changed else raw)

    def _fast_path(self, chunk: dict[str, Any], raw: bytes) -> bytes | None:
        """The hot path, unguarded: a one-choice chunk whose delta is a single text field that
        is all answer (relayed as it came) or all reasoning (dropped for a key that must not
        see it, else the same bytes with the key renamed when the field differs, not
        re-encoded); ``None`` sends the chunk down the general path.

        Replacing bytes is safe: compact JSON cannot hold ``"delta":{"content":`` inside a
        string (quotes there are escaped), and the pattern must occur exactly once."""
        single = self._single_text_delta(chunk)
        if single is None:
            return None
        state, field, text = single
        if field == "content":
            if not (state.quiet and state.splitter.idle):
                return None  # something is held back and must go out first
            if state.separated or state.splitter.state is State.ANSWER:
                if not state.take_plain(text, reasoning=False):
                    state.take(text, None, final=False)
                return encode_data(raw)
            if not state.plain_reasoning(text):
                return None
        elif field not in _RENAMES or not (state.separated and state.plain_reasoning(text)):
            return None
        out = self._reasoning_out(raw, _DELTA_KEYS[field])
        if out is not None and not state.take_plain(text, reasoning=True):
            # recorded only when the fast path really takes the chunk
            if field == "content":
                state.take(text, None, final=False)
            else:
                state.take(None, text, final=False)
        return out

    def _guarded(self, chunk: dict[str, Any], raw: bytes) -> bytes | None:
        """The hot path, guarded: a one-choice chunk whose delta is a single text field the
        guard takes in one channel (``ChoiceState.take_guarded``): the text the client is sent
        patched into the upstream's bytes (the delta object replaced, nothing else
        re-encoded); ``None``, with nothing taken, sends the chunk down the general path.
        Once taken, anything unusual (the guard blocked the choice, an encoding the patch
        cannot find) is placed as the general path places it."""
        single = self._single_text_delta(chunk)
        if single is None:
            return None
        state, field, text = single
        choice = chunk["choices"][0]
        if choice.get("logprobs") or choice.get("token_ids"):
            return None  # withheld by the general path (they would spell a redaction out)
        taken = state.take_guarded(text, upstream_reasoning=field != "content")
        if taken is None:
            return None
        shown, reasoning = taken
        delta = choice["delta"]
        new_delta = self._fields({}, shown if reasoning else "", "" if reasoning else shown)
        if state.blocked is None:
            if not new_delta:
                return b""  # held back or withheld whole: nothing is due
            if new_delta == delta:
                return encode_data(raw)
            old = _DELTA_KEYS[field] + orjson.dumps(text) + b"}"
            if raw.count(old) == 1:  # compact JSON: never inside a string (see _fast_path)
                return encode_data(raw.replace(old, b'"delta":' + orjson.dumps(new_delta)))
        outcome = self._place(choice, state, delta, new_delta, None)
        if outcome is _DROPPED:
            chunk["choices"] = []
        return self._encoded(chunk, raw, outcome is not _UNCHANGED)

    def _single_text_delta(self, chunk: dict[str, Any]) -> tuple[ChoiceState, str, str] | None:
        """``(state, field, text)`` when ``chunk`` is one known choice whose delta is a single
        non-empty text field, with no finish reason and no usage; else ``None``."""
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1 or chunk.get("usage") is not None:
            return None
        choice = choices[0]
        if type(choice) is not dict or choice.get("finish_reason") is not None:
            return None
        delta = choice.get("delta")
        if type(delta) is not dict or len(delta) != 1:
            return None
        ((field, text),) = delta.items()
        state = self.choices.get(choice.get("index") or 0)
        if type(text) is not str or not text or state is None:
            return None
        return state, field, text

    def _reasoning_out(self, raw: bytes, pattern: bytes) -> bytes | None:
        """A chunk that is all reasoning as this client must see it; ``None``: general path."""
        if not self.policy.show_reasoning:
            return b""  # withheld: the whole chunk was reasoning
        if self._rename_to is None or raw.count(pattern) != 1:
            return None  # both fields wanted, or an unusual encoding: the general path
        if pattern == self._rename_to:
            return encode_data(raw)
        return encode_data(raw.replace(pattern, self._rename_to))

    def _rewrite_choices(self, chunk: dict[str, Any]) -> bool:
        choices = chunk.get("choices")
        if not choices:
            return False
        if not isinstance(choices, list):
            raise RemoteProtocolError("upstream chunk has 'choices' that is not a list")
        changed = False
        kept: list[dict[str, Any]] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise RemoteProtocolError("upstream chunk has a choice that is not an object")
            outcome = self._rewrite_choice(choice)
            changed = changed or outcome is not _UNCHANGED
            if outcome is not _DROPPED:
                kept.append(choice)
        if len(kept) != len(choices):
            chunk["choices"] = kept
        return changed

    def _rewrite_choice(self, choice: dict[str, Any]) -> object:
        """Rewrite ``choice`` in place (the parsed chunk is ours); say what happened."""
        state = self.choice(int(choice.get("index") or 0))
        if state.blocked is not None and state.finish_reason == "content_filter":
            return _DROPPED  # a guardrail ended it, and the client was told: nothing more
        finish = choice.get("finish_reason")
        if finish is not None:
            state.finish_reason = finish
        delta = choice.get("delta") or {}
        new_delta = self.rewrite_fields(delta, state, final=finish is not None)
        return self._place(choice, state, delta, new_delta, finish)

    def _place(self, choice: dict[str, Any], state: ChoiceState, delta: dict[str, Any],
               new_delta: dict[str, Any], finish: str | None) -> object:  # fmt: skip
        """Put ``new_delta`` (``delta`` rewritten) in ``choice``; say what happened."""
        if state.blocked is not None:
            choice["delta"] = {k: v for k, v in new_delta.items() if k != "tool_calls"}
            choice["finish_reason"] = state.finish_reason = "content_filter"
            if not self.policy.show_reasoning:
                withhold_tokens(choice)
            return _CHANGED
        if "tool_calls" in delta:
            state.tools.add(delta["tool_calls"])
        guarded = state.guard is not None and bool(choice.get("logprobs") or
                                                    choice.get("token_ids"))  # fmt: skip
        if new_delta is delta and not guarded:
            return _UNCHANGED
        if not new_delta and finish is None:
            return _DROPPED
        choice["delta"] = new_delta
        hidden = state.last_had_reasoning or not state.splitter.idle  # held: maybe reasoning
        if (hidden and not self.policy.show_reasoning) or state.guard is not None:
            withhold_tokens(choice)  # a guard's text may differ from what the tokens spell
        return _CHANGED

    def _rewrite_usage(self, chunk: dict[str, Any]) -> bool:
        usage = chunk["usage"]
        if usage is None:
            return False  # a null placeholder (OpenAI puts one in every chunk): left as it is
        if chunk.get("choices") and self._counting():  # the running count the budget asked for
            self.upstream_tokens = int(usage.get("completion_tokens") or 0)
            del chunk["usage"]
            return True
        self.usage = self.fill_usage(usage)
        if self.policy.include_usage:
            chunk["usage"] = self.usage
        else:
            del chunk["usage"]
        return True


class EventRelay(StreamRelay):
    """A stream shaped into another API's events (Responses, Messages): the first event opens
    the stream (``_start``), each chunk's usage is kept and its one choice becomes events
    (``_choice``); ``[DONE]`` ends the upstream's part."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._started = False

    def feed(self, event: Event) -> bytes:
        out = [] if self._started else self._start()
        if event.is_done:
            self.done = True
            return b"".join(out)
        chunk = parse_chunk(event)
        self.note_usage(chunk)
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and int(choice.get("index") or 0) == 0:
                out += self._choice(choice)
        return b"".join(out)

    def _start(self) -> list[bytes]:
        raise NotImplementedError

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        raise NotImplementedError


def parse_chunk(event: Event) -> dict[str, Any]:
    """An upstream SSE event's JSON object; an error event or object is the upstream's
    failure (``UpstreamStatusError``), anything else malformed a ``RemoteProtocolError``."""
    try:
        chunk = orjson.loads(event.data)
    except orjson.JSONDecodeError:
        raise RemoteProtocolError("upstream sent an event that is not JSON") from None
    if not isinstance(chunk, dict):
        raise RemoteProtocolError("upstream sent an event that is not a JSON object")
    if event.event == "error" or "error" in chunk or chunk.get("object") == "error":
        raise UpstreamStatusError.from_body(chunk, 502)
    return chunk


def text_fields(holder: Any) -> tuple[str | None, str | None]:
    """``(content, reasoning)`` of an upstream delta or message; the reasoning field is
    ``reasoning_content`` (DeepSeek, SGLang) or ``reasoning`` (vLLM)."""
    if not isinstance(holder, dict):
        raise RemoteProtocolError("upstream sent a delta or message that is not an object")
    upstream_reasoning = holder.get("reasoning_content")
    if upstream_reasoning is None:
        upstream_reasoning = holder.get("reasoning")
    text = holder.get("content")
    if not isinstance(text, str | None) or not isinstance(upstream_reasoning, str | None):
        raise RemoteProtocolError("upstream sent text fields that are not strings")
    return text, upstream_reasoning


def rewrite_completion(rewriter: Rewriter, body: dict[str, Any]) -> dict[str, Any]:
    """The non-streaming path: the same per-choice rewrite over whole messages."""
    choices = body.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise RemoteProtocolError("upstream response has malformed 'choices'")
    for choice in choices:
        state = rewriter.choice(int(choice.get("index") or 0))
        state.finish_reason = choice.get("finish_reason")
        raw = choice.get("message") or {}
        if isinstance(raw, dict) and raw.get("tool_calls"):
            state.tools.add(raw["tool_calls"])
        message = rewriter.rewrite_fields(raw, state, final=True)
        message.setdefault("content", None)
        if state.blocked is not None:  # a guardrail ended it where its match began
            message.pop("tool_calls", None)
            choice["finish_reason"] = state.finish_reason = "content_filter"
            state.tools = type(state.tools)()
        choice["message"] = message
        if (not rewriter.policy.show_reasoning and state.reasoning) or state.guard is not None:
            withhold_tokens(choice)
    usage = body.get("usage")
    if isinstance(usage, dict):
        rewriter.usage = body["usage"] = rewriter.fill_usage(usage)
    return body


def withhold_tokens(choice: dict[str, Any]) -> None:
    """A choice that held reasoning a key may not see loses what would spell it out: its
    ``logprobs`` and (vLLM's ``return_token_ids``) its ``token_ids``, which the model's public
    tokenizer decodes back to the text."""
    if choice.get("logprobs"):
        choice["logprobs"] = None
    if choice.get("token_ids"):
        choice["token_ids"] = None


def cached_tokens(usage: Mapping[str, Any] | None) -> int:
    """Of the prompt's tokens, those the engine found in its prefix cache: its own
    ``prompt_tokens_details.cached_tokens`` (vLLM with ``--enable-prompt-tokens-details``);
    0 when it reports none or nonsense."""
    details = usage.get("prompt_tokens_details") if usage else None
    found = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return found if type(found) is int and found > 0 else 0
