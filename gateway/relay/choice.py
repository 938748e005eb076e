"""One choice of a completion: its text split into reasoning and content, counted (sans-I/O).

``ChoiceState.take(content, upstream_reasoning, final) -> (reasoning, content)`` is called once
per delta (or once per whole message) and keeps what the choice produced for the record.

Rules:

- Where reasoning comes from is configured per model (``REASONING_SOURCE``, see
  ``ChoiceState.start``), never guessed from the first delta:

  - ``text``: the choice is *text-split* (its content goes through the ``ThinkSplitter`` of the
    model's format) until its upstream sends a reasoning field (``reasoning`` or
    ``reasoning_content``); from then on it is *separated*;
  - ``upstream``: the engine runs a reasoning parser, so the choice is separated from the first
    byte: content with no reasoning field is content (vLLM drops a lone ``</think>`` token and
    sends only content when the reasoning was empty).

- Thinking off for the request (``ReasoningFormat.thinking``): nothing is split and every text
  field, the upstream's reasoning field included, is the answer: a hybrid model in
  non-thinking mode does not reason, whatever an engine's parser calls its output (vLLM's
  ``deepseek_r1`` parser puts all of it in ``reasoning`` when no ``</think>`` comes).
- Separated choices still guard against two upstream defects, both seen in real vLLM 0.32:

  1. vLLM's parser finds ``</think>`` by token id, so a tag the model *spelled* across several
     tokens stays in the reasoning field, and the answer after it too. Reasoning text of a
     separated choice therefore goes through a splitter that looks for the format's close
     marker and ``ends`` only (the block's opening was removed upstream): what follows a
     spelled ``</think>`` is content.
  2. With ``stop`` strings, streaming garbles the boundary (vllm-project/vllm#51641): the
     reasoning may end in a piece of the tag (``"…42.\n</thi"``) and the first content may
     start with a piece of it (``"k>"``, ``"hink>"``, ``"\n</think>"``, even a lone ``">"``),
     and text in between may be lost. When the request has ``stop`` (``repair_leak``): a tag
     prefix that ends the reasoning field is dropped, and the first content loses a leading
     ``\n?`` + tail of the close marker when a newline follows it (R1's answer starts with one, so
     a quote such as ``"> text"`` is left alone). Lost text stays lost. Each repair is
     counted in ``leaks_repaired``.

- Tool calls (``tools``) are kept as they arrive (``gateway.relay.toolcalls``); they are the
  answer's, never split.
- Counting: a delta is a reasoning token when it carried reasoning or was consumed whole by a
  marker dropped inside reasoning (the marker is a reasoning token for the model too). A delta
  held back whole (a piece of a marker still to be decided) counts once the text is decided:
  as reasoning when a marker was dropped or the text went on as reasoning, as content when it
  became the start of the answer (an "also ends" marker such as ``<tool_call>`` stays there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from gateway.relay.formats import NONE, THINK_CLOSE, ReasoningFormat, ReasoningSource
from gateway.relay.guarding import TextGuard
from gateway.relay.thinksplit import REASONING_STATES, Reasoning, SplitEvent, ThinkSplitter
from gateway.relay.toolcalls import ToolCalls


@cache
def _leaks(close: str) -> tuple[str, ...]:
    """What #51641 leaves at the start of content: a tail of the close marker, maybe after a
    newline, longest first; each counts as a leak only when the answer's newline follows it."""
    tails = {p + close[i:] for i in range(len(close)) for p in ("", "\n")}
    return tuple(sorted(tails, key=len, reverse=True))


@dataclass(slots=True)
class ChoiceState:
    splitter: ThinkSplitter
    repair_leak: bool = False
    separated: bool = False
    close: str = THINK_CLOSE  # the format's close marker, for the #51641 repair
    thinking: bool = True  # False: no splitting at all, every text field is the answer
    finish_reason: str | None = None
    deltas: int = 0
    reasoning_deltas: int = 0
    last_had_reasoning: bool = False
    leaks_repaired: int = 0
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    tools: ToolCalls = field(default_factory=ToolCalls)  # the calls the choice made
    guard: TextGuard | None = None  # guardrail policies over the split text (relay.guarding)
    _shown: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))  # guarded
    _raw_reasoning: list[str] = field(default_factory=list)  # guarded: as the model wrote it
    _carry: str = ""  # guarded: client reasoning the budget's cut released, sent with the next
    _leak_held: str = ""
    _leak_armed: bool = False
    _pending: int = 0  # deltas held back whole, their channel still to be decided

    @classmethod
    def start(
        cls, fmt: ReasoningFormat, source: ReasoningSource, *, thinking: bool, repair_leak: bool,
        guard: TextGuard | None = None,
    ) -> ChoiceState:  # fmt: skip
        """A choice of a request in ``fmt``, reasoning from ``source``, thinking on or off,
        its text through ``guard`` when guardrail policies apply."""
        if not thinking:
            return cls(ThinkSplitter(NONE), thinking=False, guard=guard)
        state = cls(ThinkSplitter(fmt), repair_leak, close=fmt.close or THINK_CLOSE, guard=guard)
        if source == "upstream":
            state._become_separated()
        return state

    @property
    def quiet(self) -> bool:
        """Nothing is pending a decision: the fast path may take this choice's chunks (never
        a guarded one's: every delta goes through its guard)."""
        return not self._leak_armed and self.guard is None

    def plain_reasoning(self, text: str) -> bool:
        """True when all of ``text`` is certainly reasoning: the splitter is inside reasoning,
        holds nothing, and ``text`` has no character that could start a marker."""
        splitter = self.splitter
        return (self.guard is None and splitter.in_reasoning and splitter.idle
                and not splitter.could_hold(text))  # fmt: skip

    def take_plain(self, text: str, reasoning: bool) -> bool:
        """``take`` for the fast path's commonest deltas, without the splitter: when the
        splitter would hand ``text`` back whole as ``reasoning`` (or answer) text and change
        nothing (``ThinkSplitter.hands_back``), and no delta is held, it is counted and kept
        as ``take`` would; ``False`` (nothing done) otherwise. An answer delta of a choice
        whose reasoning comes in its own field takes ``take``'s repairs."""
        if self._pending or (self.separated and not reasoning) or self.guard is not None:
            return False
        if self.splitter.hands_back(text) is not reasoning:
            return False
        if reasoning:
            self.reasoning.append(text)
            self.reasoning_deltas += 1
        else:
            self.content.append(text)
        self.last_had_reasoning = reasoning
        self.deltas += 1
        return True

    def take_guarded(self, text: str, upstream_reasoning: bool) -> tuple[str, bool] | None:
        """``take`` of one non-final delta of a guarded choice, for the fast path: when the
        splitter would hand ``text`` back whole in one channel and change nothing, no delta
        or repair is pending, and the guard takes it in that channel alone
        (``TextGuard.take_one``), it is counted and kept as ``take`` would, and the result is
        ``(what the client is sent, whether it is reasoning)``; ``None``, with nothing done,
        otherwise. ``upstream_reasoning``: ``text`` came in the upstream's reasoning field."""
        guard = self.guard
        if guard is None or self._pending or self._leak_armed or self._carry or not self.thinking:
            return None
        if not self.separated:  # a reasoning field would make it separated: not here
            reasoning = None if upstream_reasoning else self.splitter.hands_back(text)
        elif upstream_reasoning:
            reasoning = True if self.splitter.hands_back(text) else None
        else:  # the answer of a separated choice: nothing held to release first
            reasoning = False if self.splitter.idle else None
        if reasoning is None:
            return None
        taken = guard.take_one("reasoning" if reasoning else "answer", text)
        if taken is None:
            return None
        client, kept = taken
        if reasoning:
            self._count(text, "", kept, "")
            self._raw_reasoning.append(text)
        else:
            self._count("", text, "", kept)
        if client:
            self._shown[0 if reasoning else 1].append(client)
        return client, reasoning

    def take(
        self, text: str | None, upstream_reasoning: str | None, final: bool
    ) -> tuple[str, str]:
        """``(reasoning, content)`` of one delta or message, counted and kept for the record."""
        if not self.thinking and upstream_reasoning is not None:
            text, upstream_reasoning = upstream_reasoning + (text or ""), None
        if upstream_reasoning is not None and not self.separated:
            self._become_separated()
        was_reasoning = self.splitter.state in REASONING_STATES
        dropped = self.splitter.dropped
        fed = upstream_reasoning if self.separated else text
        events = self.splitter.feed(fed) if fed else []
        extra = ""
        if self.separated and text:
            if self._leak_armed:
                self.splitter.drop_held()  # a tag prefix ending the reasoning (#51641)
            events += self.splitter.release()
            extra = self._repair(text)
        if final:
            events += self.splitter.close()
            extra += self._flush_leak()
        reasoning, content = _join(events)
        content += extra
        self._settle_pending(events, self.splitter.dropped > dropped)
        if bool(fed) and was_reasoning and not (reasoning or content):
            if self.splitter.idle:  # consumed whole by a dropped marker: a reasoning token
                self.reasoning_deltas += 1
            else:  # held: decided by the text that follows
                self._pending += 1
            self.deltas += 1
        return self._out(reasoning, content, final)

    def _out(self, reasoning: str, content: str, final: bool) -> tuple[str, str]:
        """Count the split delta; through the guard, if any, what the client and the record
        get of it."""
        if self.guard is None:
            self._count(reasoning, content, reasoning, content)
            return reasoning, content
        guarded = self.guard.take(reasoning, content, final)
        self._count(reasoning, content, guarded.kept_reasoning, guarded.kept_content)
        if reasoning:
            self._raw_reasoning.append(reasoning)
        shown_reasoning, self._carry = self._carry + guarded.reasoning, ""
        if shown_reasoning:
            self._shown[0].append(shown_reasoning)
        if guarded.content:
            self._shown[1].append(guarded.content)
        return shown_reasoning, guarded.content

    def model_reasoning(self) -> str:
        """The reasoning as the model wrote it (a continuation resumes from it), whatever a
        guardrail policy made of the record's copy."""
        return "".join(self._raw_reasoning if self.guard is not None else self.reasoning)

    def shown_text(self) -> tuple[str, str]:
        """``(reasoning, answer)`` as the client was sent them; ``reasoning`` and ``content``
        are the record's copies, which a guardrail policy may redact differently."""
        if self.guard is None:
            return "".join(self.reasoning), "".join(self.content)
        return "".join(self._shown[0]), "".join(self._shown[1])

    @property
    def blocked(self) -> str | None:
        """The guardrail policy that ended this choice, if one did."""
        return self.guard.blocked if self.guard is not None else None

    @property
    def reasoning_tokens(self) -> int:
        """Reasoning tokens so far, deltas held back inside the reasoning included."""
        return self.reasoning_deltas + self._pending

    def end_reasoning(self) -> None:
        """The gateway ended this choice's reasoning (its budget was spent, ``gateway.relay.
        effort``): text held back inside it is kept as reasoning, held-back deltas count as
        reasoning tokens, and from now on every text field is the answer (the engine continues
        after the close marker, whatever field its parser puts the text in)."""
        reasoning, _ = _join(self.splitter.close())
        if reasoning and self.guard is not None:
            self._raw_reasoning.append(reasoning)
            guarded = self.guard.take(reasoning, "", False)  # the rest: with the answer's first
            self._carry += guarded.reasoning
            reasoning = guarded.kept_reasoning
        if reasoning:
            self.reasoning.append(reasoning)
        self.reasoning_deltas += self._pending
        self._pending, self._leak_armed, self._leak_held = 0, False, ""
        self.splitter, self.thinking, self.separated = ThinkSplitter(NONE), False, False

    def _settle_pending(self, events: list[SplitEvent], dropped: bool) -> None:
        """Held-back deltas whose text was decided now: reasoning tokens when a marker was
        dropped or the text went on as reasoning; else they began the answer."""
        if self._pending and (events or dropped or self.splitter.idle):
            if dropped or (events and isinstance(events[0], Reasoning)):
                self.reasoning_deltas += self._pending
            self._pending = 0

    def _become_separated(self) -> None:
        """From now on reasoning comes in its own field."""
        self.separated = True
        self.splitter = ThinkSplitter.inside_reasoning(self.splitter.format)
        self._leak_armed = self.repair_leak

    def _repair(self, text: str) -> str:
        """The first content after separated reasoning, without what #51641 leaked into it."""
        if not self._leak_armed or self.splitter.reasoning_ended:
            self._leak_armed = False  # a spelled </think> was found by our own splitter
            return text
        held = self._leak_held + text
        stripped = strip_leaked_tag(held, final=False, close=self.close)
        if stripped is None:
            self._leak_held = held  # could still be a leaked tail: wait for more
            return ""
        self._leak_armed, self._leak_held = False, ""
        if stripped != held:
            self.leaks_repaired += 1
        return stripped

    def _flush_leak(self) -> str:
        held, self._leak_held, self._leak_armed = self._leak_held, "", False
        return held

    def _count(self, reasoning: str, content: str, kept_reasoning: str, kept_content: str) -> None:
        """Count a delta by its split text; keep for the record what the guard let it keep."""
        self.last_had_reasoning = bool(reasoning)
        if kept_reasoning:
            self.reasoning.append(kept_reasoning)
        if reasoning:
            self.reasoning_deltas += 1
        if kept_content:
            self.content.append(kept_content)
        if reasoning or content:
            self.deltas += 1


def _join(events: list[SplitEvent]) -> tuple[str, str]:
    if len(events) == 1:  # the common case: one channel
        piece = events[0].text
        return (piece, "") if isinstance(events[0], Reasoning) else ("", piece)
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
    content = "".join(e.text for e in events if not isinstance(e, Reasoning))
    return reasoning, content


def strip_leaked_tag(text: str, *, final: bool, close: str = THINK_CLOSE) -> str | None:
    """``text`` without a leading leaked piece of ``close`` (see rule 2), or ``None`` while
    more text could still decide it."""
    leaks = _leaks(close)
    for leak in leaks:
        if text.startswith(leak + "\n"):
            return text[len(leak) :]
    if not final and any((leak + "\n").startswith(text) for leak in leaks):
        return None
    return text
