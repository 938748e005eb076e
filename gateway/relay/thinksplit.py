"""Incremental splitter of a model's text into reasoning and content (sans-I/O).

``ThinkSplitter(format).feed(text) -> list[Event]`` and ``close() -> list[Event]``; events are
``Reasoning(text)`` and ``Content(text)``. Non-streaming output goes through ``feed(all)`` then
``close()``: one code path, so streamed and whole results can never disagree. The format
(``gateway.relay.formats``, or its name) supplies the markers; they are any strings, matched exactly
and case-sensitively as text, so a marker of several tokens (Kimi K3's
``<|open|>think<|sep|>``) is found however the stream cuts it, between its tokens or inside a
UTF-8 sequence. Look-alikes (``<thinking>``, ``</ think>``, entities) are ordinary text.

Rules:

- An *opened* format (the chat template opened the block: R1 and every hybrid in thinking
  mode) starts inside reasoning. Its open marker before the close marker is dropped once
  (R1-0528 and Qwen3 write one themselves); any later one is literal reasoning.
- A format that is not opened (``think_tags``) starts in content; its first open marker opens
  reasoning (text before it stays content); a close marker before it is literal content.
- Inside reasoning, the close marker ends it and is dropped; each of the format's ``ends``
  markers (Qwen3's ``<tool_call>``) ends it too and stays, verbatim, at the start of the
  content; ``ends_unopened`` markers do so only at the very start of the output, after
  whitespace at most (Kimi K3's response channel: the model answered without thinking).
- A reasoning *field* (the engine separated it: ``inside_reasoning``) ends only at the close
  marker: the engine's own parser already moved what ends reasoning out of it, so an ``ends``
  marker left in the field is the model's text, not the end of its reasoning.
- After reasoning ends everything is content, verbatim, further markers included; ``none``
  is all content. With no close marker at all (``finish_reason: length``) everything after
  the opening is reasoning. Whitespace and CRLF are never touched.

States and the markers active in each (the whole transition table, ``_table``)::

    OPENING    reasoning  open -> REASONING (dropped)   close -> ANSWER (dropped)
                          ends, ends_unopened -> ANSWER (kept)
                          (non-whitespace text first -> OPENED)
    OPENED     reasoning  open -> REASONING (dropped)   close -> ANSWER (dropped)
                          ends -> ANSWER (kept)
    REASONING  reasoning  close -> ANSWER (dropped)     ends -> ANSWER (kept)
    FIELD      reasoning  close -> ANSWER (dropped)
    BEFORE     content    open -> REASONING (dropped)
    ANSWER     content    (no markers: pass through, nothing held)

Hold-back: only the longest suffix that is a proper prefix of a marker active in the current
state is held (at most the longest marker minus one character), and released the moment it
cannot become one. That suffix starts at one of the markers' first characters within the
window, so only those positions are tried. Each call scans the held suffix plus the new text
once, with ``str.find`` in C: O(chunk), never O(stream). At ``close()`` the held suffix is
flushed as literal text of the current channel. A chunk that holds none of the markers' first
characters, with nothing held, cannot touch a marker and is passed through without a scan.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache

from gateway.errors import LocalProtocolError
from gateway.relay.formats import THINK_CLOSE, THINK_OPEN, ReasoningFormat, lookup

OPEN_TAG, CLOSE_TAG = THINK_OPEN, THINK_CLOSE


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Content:
    text: str


SplitEvent = Reasoning | Content


class State(enum.Enum):
    OPENING = enum.auto()
    OPENED = enum.auto()
    REASONING = enum.auto()
    FIELD = enum.auto()
    BEFORE = enum.auto()
    ANSWER = enum.auto()


# A tuple, not a set: ``in`` compares by identity, where a set would call ``Enum.__hash__``
# (Python code on 3.11) on every chunk.
REASONING_STATES = (State.OPENING, State.OPENED, State.REASONING, State.FIELD)


@dataclass(frozen=True, slots=True)
class _Rule:
    """What one marker does in one state."""

    marker: str
    to: State
    keep: bool  # the marker stays in the text (it belongs to the content)
    at_start: bool = False  # only before any non-whitespace text (``ends_unopened``)


@dataclass(frozen=True, slots=True)
class _Row:
    state: State
    reasoning: bool  # the channel of this state
    rules: tuple[_Rule, ...]
    markers: tuple[str, ...]  # the rules' markers, in the same order
    starts: str  # the first characters of the markers, for the fast path
    first: str | None  # the one first character, when all markers share it (usually "<")
    window: int  # the longest held suffix: longest marker - 1
    at_start: bool  # some rule holds only at the start: non-whitespace text leaves to OPENED

    def may_start(self, text: str) -> bool:
        """Whether ``text`` holds a character that may start one of the markers."""
        if self.first is not None:
            return self.first in text
        return any(c in text for c in self.starts)


def _row(state: State, reasoning: bool, rules: list[_Rule]) -> _Row:
    markers = tuple(r.marker for r in rules)
    starts = "".join(sorted({m[0] for m in markers}))
    window = max((len(m) for m in markers), default=1) - 1
    first = starts if len(starts) == 1 else None
    at_start = any(r.at_start for r in rules)
    return _Row(state, reasoning, tuple(rules), markers, starts, first, window, at_start)


@cache
def _table(fmt: ReasoningFormat) -> dict[State, _Row]:
    """The transition table of ``fmt`` (see the module docstring); built once per format and
    kept (formats are a handful of frozen values from the registry and the settings)."""
    drop = [_Rule(fmt.close, State.ANSWER, False)] if fmt.close else []
    ends = [_Rule(m, State.ANSWER, True) for m in fmt.ends]
    unopened = [_Rule(m, State.ANSWER, True, at_start=True) for m in fmt.ends_unopened]
    opens = [_Rule(fmt.open, State.REASONING, False)] if fmt.open and fmt.close else []
    rows = (
        _row(State.OPENING, True, opens + drop + ends + unopened),
        _row(State.OPENED, True, opens + drop + ends),
        _row(State.REASONING, True, drop + ends),
        _row(State.FIELD, True, drop),
        _row(State.BEFORE, False, opens),
        _row(State.ANSWER, False, []),
    )
    return {row.state: row for row in rows}


def initial_state(fmt: ReasoningFormat) -> State:
    if not fmt.splits:
        return State.ANSWER
    return State.OPENING if fmt.opened else State.BEFORE


class ThinkSplitter:
    """Splits one choice's text stream; create one per choice index."""

    __slots__ = ("_closed", "_held", "_row", "_table", "dropped", "format", "state")

    def __init__(self, fmt: ReasoningFormat | str = "deepseek_r1") -> None:
        fmt = lookup(fmt) if isinstance(fmt, str) else fmt
        self.format = fmt
        self._table = _table(fmt)
        self._go(initial_state(fmt))
        self._held = ""
        self._closed = False
        self.dropped = 0  # markers dropped so far (a counter callers compare)

    def _go(self, state: State) -> None:
        self.state = state
        self._row = self._table[state]

    @classmethod
    def inside_reasoning(cls, fmt: ReasoningFormat | str) -> ThinkSplitter:
        """For a reasoning field (the engine separated it and removed the opening): only the
        close marker ends it, as the model spelled it across tokens; the rest is literal."""
        splitter = cls(fmt)
        splitter._go(State.FIELD)
        return splitter

    @property
    def idle(self) -> bool:
        """Nothing is held back."""
        return not self._held

    @property
    def in_reasoning(self) -> bool:
        return self.state in REASONING_STATES

    @property
    def reasoning_ended(self) -> bool:
        """True once the output is in the answer (always true for ``none``)."""
        return self.state is State.ANSWER

    def hands_back(self, text: str) -> bool | None:
        """Whether ``feed(text)`` would hand non-empty ``text`` back whole as one event and
        change nothing: ``True`` as reasoning, ``False`` as the answer; ``None`` when it might
        not (text held, a character that may start a marker, a state the first text leaves)."""
        if self._held or self._closed:
            return None
        if self.state is State.ANSWER:
            return False
        row = self._row
        if row.at_start or row.may_start(text):
            return None
        return row.reasoning

    def could_hold(self, text: str) -> bool:
        """Whether ``text`` holds a character that may start a marker active now."""
        return self._row.may_start(text)

    def feed(self, text: str) -> list[SplitEvent]:
        if self._closed:
            raise LocalProtocolError("feed() after close()")
        if self.state is State.ANSWER:  # the hot path once reasoning is over
            return [Content(text)] if text else []
        row = self._row
        first = row.first
        if not self._held and (first not in text if first is not None else not row.may_start(text)):
            if not text:  # the hot path inside reasoning: no marker can start
                return []
            if row.at_start and not text.isspace():
                self._go(State.OPENED)
            return [Reasoning(text) if row.reasoning else Content(text)]
        out: list[SplitEvent] = []
        buf = self._held + text
        self._held = ""
        while buf:
            buf = self._step(buf, out)
        return out

    def drop_held(self) -> str:
        """Forget the held text (a caller that knows it was a damaged marker); return it."""
        held, self._held = self._held, ""
        return held

    def release(self) -> list[SplitEvent]:
        """Give up waiting on held text: it is literal text of the current channel. For a
        caller that knows no marker can continue it (the upstream moved on to another field)."""
        out: list[SplitEvent] = []
        _emit(out, self._row.reasoning, self._held)
        self._held = ""
        return out

    def close(self) -> list[SplitEvent]:
        """End of the stream: flush whatever was held as literal text of the current channel."""
        if self._closed:
            return []
        self._closed = True
        return self.release()

    def _step(self, buf: str, out: list[SplitEvent]) -> str:
        """Consume ``buf`` up to and including the first active marker; return the rest."""
        row = self._row
        if not row.rules:
            _emit(out, row.reasoning, buf)
            return ""
        pos, rule = _first_marker(buf, row)
        text = buf[:pos] if rule is not None else buf[: len(buf) - _held_suffix(buf, row)]
        if row.at_start and text and not text.isspace():
            _emit(out, row.reasoning, text)  # past the start: at_start rules no longer hold
            self._go(State.OPENED)
            return buf[len(text) :]
        if rule is None:
            _emit(out, row.reasoning, text)
            self._held = buf[len(text) :]
            return ""
        _emit(out, row.reasoning, text)
        self._go(rule.to)
        if rule.keep:
            return buf[pos:]
        self.dropped += 1
        return buf[pos + len(rule.marker) :]


def _first_marker(buf: str, row: _Row) -> tuple[int, _Rule | None]:
    """The leftmost complete marker (markers of one state are prefix-free: no ties)."""
    if len(row.markers) == 1:  # the common case: one marker active
        pos = buf.find(row.markers[0])
        return (pos, row.rules[0]) if pos >= 0 else (len(buf), None)
    best, found = len(buf), None
    for rule in row.rules:
        pos = buf.find(rule.marker, 0, best + len(rule.marker))
        if 0 <= pos < best:
            best, found = pos, rule
    return best, found


def _held_suffix(buf: str, row: _Row) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of an active marker."""
    lo = max(0, len(buf) - row.window)
    earliest = len(buf)
    for first in row.starts:  # usually one character: "<"
        start = buf.find(first, lo, earliest)
        while start >= 0:
            suffix = buf[start:]
            if any(marker.startswith(suffix) for marker in row.markers):
                earliest = start
                break
            start = buf.find(first, start + 1, earliest)
    return len(buf) - earliest


def _emit(out: list[SplitEvent], reasoning: bool, text: str) -> None:
    if not text:
        return
    if out and isinstance(out[-1], Reasoning if reasoning else Content):
        text = out.pop().text + text
    out.append(Reasoning(text) if reasoning else Content(text))
