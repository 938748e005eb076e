"""Finding detectors' matches in a channel of text as it streams, exactly (sans-I/O).

``ChannelScanner(rules).feed(text, final) -> (released, findings)``: ``released`` is how far
(an offset in the channel's text) everything is decided, ``findings`` the matches decided in
this call, in order. The matches found are those of the whole channel scanned at once,
whatever the chunking: the same text fed in any pieces gives the same findings.

How (per rule, i.e. per detector of a policy):

- Each rule scans on its own, leftmost first, non-overlapping, as ``finditer`` over the whole
  text would, from where its last decided match ended. A position where a match attempt runs
  into the end of the text (``regex``'s partial matching) holds the rule: more text may make a
  match start there. ``regex`` answers a search with a complete match anywhere rather than an
  earlier partial one, so one search per rule and delta finds the hold when no complete match
  follows (the common case), and the positions before a complete match near the end are asked
  one by one.
- A shared search comes first, exact (what every rule finds is unchanged): the prefilter
  (``gateway.guard.prefilter``) resumes each rule whose matches start with a literal at that
  literal's next occurrence, or decides it to the end when there is none; its first-character
  gate does the same for rules whose matches start with a few ASCII characters (digits,
  capitals) or a non-ASCII one; a rule whose every match holds one of a few literals (an
  email's ``@``) holds, while none is in sight, only where its ``tail`` says a partial match
  starts.
- Prose first (``_quickly``): while the gated and needing rules all stand at one position, one
  search for anything any of them could act on, and their tails, decide them all at once;
  only with something in sight does each decide on its own.
- A complete match is decided once the characters that could change it are present: the
  built-ins' ``settle`` after its end (their closing look-ahead), a file's own regex
  ``window`` from its start (a greedy pattern could still grow), or the channel ends. A
  partial or undecided match holds the rule at its start; text before it has no match of that
  rule, however the channel goes on (no complete or partial match started there).
- The findings of every rule are merged: by start, then the more specific detector
  (``Detector.rank``), the longer, the earlier rule; a match inside one kept before it is
  dropped, and one that overlaps it is kept from where that one ends (so every character of
  every match is covered: a phone number that took a card's first digits leaves the card's
  rest a match). A candidate its validator refuses is no match, and the rule goes on from the
  position after its start, not after its end. A match is merged only once every rule has
  passed its start, so no match that could still come before it is unknown.
- ``released`` is the smallest of the rules' holds (or the end of the last kept match, when it
  reaches past that): text before it can leave. So the scanner holds back only from the start of
  a possible match: a word that could still become an email, digits that could still become a
  card number.

A few characters before the earliest hold are kept for the patterns' look-behind
(``CONTEXT``); the rest of the text is dropped as it is decided, so memory stays bounded by the
longest window.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import regex

from gateway.guard.detectors import Detector
from gateway.guard.prefilter import FirstChars, Prefilter, trie

CONTEXT = 32  # characters kept before a rule's position, at least: the rules' look-behinds


@dataclass(frozen=True, slots=True)
class Finding:
    start: int  # offsets in the channel's whole text
    end: int
    rule: int  # index into the scanner's rules
    text: str


class ChannelScanner:
    """The rules' states are parallel lists (``_pos``, ``_hold``, ``_decided``) in the plan's
    order, where each gate's rules are consecutive: a piece of prose costs a few searches, a
    slice assignment per gate and list-wide ``min``, not attribute reads or a loop per rule
    (with the maintained secret rules a policy has some thirty). ``Finding.rule`` is the
    rule's index as given."""

    def __init__(self, rules: Sequence[Detector]) -> None:
        plan = _plan(tuple(rules))  # a scanner per channel per choice: built once per rule set
        self._detectors = plan.detectors  # in the plan's order: each gate's rules together
        self._order = plan.order  # the plan's index -> the caller's (``Finding.rule``)
        count = len(self._detectors)
        self._pos = [0] * count  # where each rule's scan resumes (everything before: decided)
        self._hold = [0] * count  # where its first undecided match starts (or the end)
        self._decided: list[list[Finding]] = [[] for _ in range(count)]  # not yet merged
        self._waiting = 0  # how many findings ``_decided`` holds
        self._ranks = plan.ranks  # by the caller's index
        self._gate = plan.gate
        self._chars = plan.chars
        # the rules neither gate decides: those with a needed pattern and a tail, the others
        self._needing = plan.needing
        self._alone = plan.alone
        self._needed = plan.needed
        self._quick = plan.quick
        self._count = plan.count  # the rules ``_quick`` decides: the first so many
        # whether they all stand at one position, ``_at`` (their entries in ``_pos`` and
        # ``_hold`` are then out of date: ``_each`` writes them before it reads them)
        self._even = True
        self._at = 0
        self._reach = 0  # where the last-ending complete match of any rule ends
        self._context = plan.context
        self._buf = ""
        self._base = 0  # the channel offset of _buf[0]
        self._released = 0
        self._covered = 0  # end of the last kept finding
        self.closed = False

    @property
    def end(self) -> int:
        """The channel's length so far."""
        return self._base + len(self._buf)

    def text(self, start: int, end: int) -> str:
        """The channel's text from ``start`` to ``end`` (both not yet dropped)."""
        return self._buf[start - self._base : end - self._base]

    def feed(self, text: str, final: bool = False) -> tuple[int, list[Finding]]:
        if self.closed:
            raise ValueError("the channel is closed")
        self._buf += text
        self.closed = final
        end = self._base + len(self._buf)
        if final or not self._even or self._quick is None or not self._quickly(self._quick):
            self._each(final, end)
        if self._alone:
            for index in self._alone:
                self._scan(index, final)
            hold = self._least(self._hold, end)
        else:  # every rule gated or needing: ``_least`` written out, as in ``drop_before``
            # (a call each costs the 29-rule policy 2.5k instructions an event, of 52.5k)
            hold = self._at if self._even else min(self._hold, default=end)
        findings = self._merge(hold) if self._waiting else []
        self._released = max(hold, self._covered) if not final else end
        if not (self._even or final or self._waiting) and self._quick is not None:
            self._level()
        return self._released, findings

    def _each(self, final: bool, end: int) -> None:
        """The gated and needing rules decide on their own (something is in sight)."""
        if self._even:
            count = self._count
            self._pos[:count] = self._hold[:count] = [self._at] * count
            self._even = False
        if self._gate.rules:
            for index in self._through(self._gate, final):
                self._scan(index, final)
        if self._chars.rules:
            for index in self._through(self._chars, final):
                self._scan(index, final)
        detectors = self._detectors
        for index in self._needing:
            if not self._without_needed(detectors[index], index, final, end):
                self._search(index, final)

    def _quickly(self, quick: _Quick) -> bool:
        """Decide the gated and needing rules, all standing at one position, with two searches
        when nothing from there on could start or complete a match of theirs (prose): no
        literal, start character or needed literal, ASCII; they all stand, then, where the
        first tail starts (a word that may become an email), which is the least of the holds
        their own decisions would give. ``False``: something is in sight (or a literal cut
        by the end starts before that tail); each rule decides on its own."""
        buf, at = self._buf, self._at - self._base
        if quick.trigger.search(buf, at) is not None:
            return False
        if quick.lowered is not None and quick.lowered.search(buf[at:].lower()) is not None:
            return False
        hold = first = len(buf)
        for i, (tail, chars, within) in enumerate(quick.tails):
            if within and first >= hold:
                continue  # its run is inside the first one's, which starts past the hold
            run = len(buf.rstrip(chars)) if chars else at  # where the run ending the text starts
            if i == 0:
                first = run
            start = max(run, at)
            if start < hold and (m := tail.search(buf, start)) is not None:
                hold = min(hold, m.start())
        if hold > len(buf) - quick.longest and self._gate.cut_before(buf, at, hold):
            return False  # (a cut starts in the last ``longest - 1`` characters)
        self._at = hold + self._base
        return True

    def _level(self) -> None:
        """After the rules decided on their own: stand them all at the least of their holds,
        when no match of any rule reaches past it. Exact: each position a rule passes again
        starts no match of it (a dead position stays dead as text comes; a refused candidate
        is refused again), so the rule decides again what it decided."""
        count = self._count
        low = min(self._hold[:count])
        if low >= self._reach:
            self._at = low
            self._even = True

    def _through(self, gate: Prefilter | FirstChars, final: bool) -> list[int]:
        """A gate (``gateway.guard.prefilter``: the literals, the first characters) resumes
        each of its rules where a match of it could first start (returned: those to scan) or,
        finding none, decides it to the end."""
        base, end, pos, hold = self._base, self.end, self._pos, self._hold
        rules = gate.rules  # consecutive: the plan puts each gate's rules together
        low, high = rules[0], rules[-1] + 1
        if not gate.any(self._buf, min(pos[low:high]) - base, final):
            pos[low:high] = hold[low:high] = [end] * (high - low)  # prose: the common case
            return []
        first = gate.first(self._buf, {i: pos[i] - base for i in rules}, final)
        for i in rules:
            at = first.get(i)
            if at is None:
                hold[i] = pos[i] = end
            else:
                pos[i] = at + base
        return list(first)

    def drop_before(self, offset: int) -> None:
        """Forget the text before ``offset`` (already sent on), keeping look-behind context."""
        least = self._at if self._even and not self._alone else self._least(self._pos, offset)
        keep_from = min(offset, least) - self._context
        if keep_from > self._base:
            self._buf = self._buf[keep_from - self._base :]
            self._base = keep_from

    def _least(self, of: list[int], default: int) -> int:
        """The least of ``of`` (``_pos`` or ``_hold``), the even rules standing at ``_at``."""
        if not self._even:
            return min(of, default=default)
        count = self._count
        return min(self._at, *of[count:]) if len(of) > count else self._at

    def _scan(self, index: int, final: bool) -> None:
        detector = self._detectors[index]
        if not (detector.needs and self._without_needed(detector, index, final, self.end)):
            self._search(index, final)

    def _search(self, index: int, final: bool) -> None:
        """The rule's own search from its position (partial mode before the end)."""
        end, base, buf, pos = self.end, self._base, self._buf, self._pos
        detector = self._detectors[index]
        pattern = detector.pattern
        # a match attempt reads at most ``window`` characters: only the last ``window``
        # positions can still run into the end of the text
        limit = end - detector.window
        while True:
            # ``regex`` prefers a complete match anywhere to a partial one: a partial answer
            # means no complete match starts from here on, and it is the leftmost partial
            m = pattern.search(buf, pos[index] - base, partial=not final)
            if m is None:
                self._hold[index] = pos[index] = end
                return
            start = m.start() + base
            if m.partial:
                self._hold[index] = pos[index] = min(start, end)
                return
            stop = m.end() + base
            if not final:
                early = self._partial(pattern, max(pos[index], limit), start)
                if early is not None or _undecided(detector, start, stop, end):
                    self._hold[index] = pos[index] = start if early is None else early
                    return
            size = detector.valid(m.group())
            if size:
                pos[index] = stop
                self._reach = max(self._reach, stop)
                self._decided[index].append(Finding(start, start + size, self._order[index],
                                                    m.group()[:size]))  # fmt: skip
                self._waiting += 1
            else:  # not a value: a match may still start inside it ("+0 (415) 555-0198")
                pos[index] = start + 1

    def _without_needed(self, detector: Detector, index: int, final: bool, end: int) -> bool:
        """Decide a rule whose every complete match holds one of ``detector.needs`` (searched
        as ``_needed[index]``) when the text from its position has none: no complete match
        starts there; at the end, nothing is held, and before it, ASCII text is held where
        ``detector.tail`` says a partial match starts. ``False``: the rule's own search must
        answer."""
        buf, base = self._buf, self._base
        at = self._pos[index] - base
        if self._needed[index].search(buf, at) is not None:  # type: ignore[union-attr]
            return False
        if final:
            self._hold[index] = self._pos[index] = end
            return True
        if detector.tail is None or not (buf.isascii() or buf[at:].isascii()):
            return False
        m = detector.tail.search(buf, at)
        self._hold[index] = self._pos[index] = end if m is None else m.start() + base
        return True

    def _partial(self, pattern: regex.Pattern[str], low: int, high: int) -> int | None:
        """The first position in ``[low, high)``, before a complete match at ``high``, where
        a match could start once more text comes (``regex`` reports the complete match rather
        than an earlier partial one, so each position is asked on its own; none of them starts
        a complete match). A position found dead stays dead: its attempt failed before the
        end."""
        base, buf = self._base, self._buf
        for position in range(low, high):
            m = pattern.match(buf, position - base, partial=True)
            if m is not None and m.partial:
                return position
        return None

    def _merge(self, hold: int) -> list[Finding]:
        ready: list[Finding] = []
        for decided in self._decided:
            keep = 0
            while keep < len(decided) and decided[keep].start < hold:
                keep += 1
            ready += decided[:keep]
            del decided[:keep]
        self._waiting -= len(ready)
        ranks = self._ranks
        ready.sort(key=lambda f: (f.start, ranks[f.rule], f.start - f.end, f.rule))
        kept = []
        for finding in ready:
            if finding.end <= self._covered:
                continue  # inside one kept before it
            if finding.start < self._covered:  # overlapping: its rest is still a match
                finding = Finding(self._covered, finding.end, finding.rule, finding.text)
            kept.append(finding)
            self._covered = finding.end
        return kept


@dataclass(frozen=True, slots=True)
class _Quick:
    """The searches deciding prose for the gated and needing rules at once (``_quickly``)."""

    trigger: re.Pattern[str]  # any literal, start character, needed literal or non-ASCII
    # the literals compared ignoring case, lowered: searched in the lowered text (ASCII, as
    # ``trigger`` found none other), where ``re`` compares each character once
    lowered: re.Pattern[str] | None
    longest: int  # the longest literal's length (0: no literal gate)
    # where the needing rules' partial matches start in ASCII text, one pattern per set of
    # characters such a match consists of (widest first), and whether that set lies within
    # the first one's: then its run ending the text starts no earlier than the first's
    tails: tuple[tuple[re.Pattern[str], str, bool], ...]


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a scanner derives from its rules alone, shared by every scanner of those rules."""

    detectors: tuple[Detector, ...]  # the literals' rules, the first characters', the others
    order: tuple[int, ...]  # each one's index among the rules as given
    ranks: tuple[int, ...]  # by the index as given
    gate: Prefilter
    chars: FirstChars
    needing: tuple[int, ...]  # the rules with a needed pattern and a tail
    alone: tuple[int, ...]  # the rules nothing but their own search decides
    needed: tuple[re.Pattern[str] | None, ...]  # each rule's ``needs``, compiled
    quick: _Quick | None
    count: int  # the rules ``quick`` decides: the gates' and the needing ones
    context: int


@functools.lru_cache(maxsize=256)
def _plan(rules: tuple[Detector, ...]) -> _Plan:
    """The gates over ``rules`` put in an order where each gate's rules are consecutive, so a
    gate that decides them all updates a slice of the scanner's lists, not each rule."""
    gate, chars = _gates(rules)
    gated = [*gate.rules, *chars.rules]
    rest = sorted(set(range(len(rules))) - set(gated))
    needing = [i for i in rest if rules[i].needs and rules[i].tail is not None]
    order = (*gated, *needing, *(i for i in rest if i not in needing))
    ordered = tuple(rules[i] for i in order)
    gate, chars = _gates(ordered)
    assert [*gate.rules, *chars.rules] == list(range(len(gated))), "a gate's rules moved"
    count = len(gated) + len(needing)
    context = max([CONTEXT, *(d.behind for d in rules)])
    return _Plan(ordered, order, tuple(d.rank for d in rules), gate, chars,
                 tuple(range(len(gated), count)), tuple(range(count, len(rules))),
                 tuple(_needed(d) if d.needs else None for d in ordered),
                 _quick(gate, chars, ordered[len(gated) : count]) if count else None, count,
                 context)  # fmt: skip


def _quick(gate: Prefilter, chars: FirstChars, needing: Sequence[Detector]) -> _Quick | None:
    """The one search for anything the gated and needing rules could act on, and their tails;
    ``None`` where a literal is not ASCII (its gate searches with ``regex``)."""
    literals = gate.literals() if gate.rules else ([], [])
    if literals is None:
        return None
    plain, folded = literals
    gate_literals = [*plain, *folded]
    plain += [n for d in needing if not d.needs_folded for n in d.needs]
    folded += [n.lower() for d in needing if d.needs_folded for n in d.needs]
    anything = [trie(plain)] if plain else []
    anything.append(chars.source if chars.rules else r"[^\x00-\x7f]")
    return _Quick(re.compile("|".join(f"(?:{part})" for part in anything)),
                  re.compile(trie(folded)) if folded else None,
                  max(map(len, gate_literals), default=0), _tails(needing))  # fmt: skip


def _tails(needing: Sequence[Detector]) -> tuple[tuple[re.Pattern[str], str, bool], ...]:
    """The needing rules' tails, one alternation per set of characters (its leftmost match is
    the least of theirs), the widest set first: the hold it gives lets the others skip their
    search; a set within it skips even finding its run."""
    by_chars: dict[str, list[str]] = {}
    for d in needing:
        if d.tail is not None:
            by_chars.setdefault("".join(sorted(set(d.tail_chars))), []).append(d.tail.pattern)
    ordered = sorted(by_chars, key=lambda chars: (chars == "", -len(chars)))
    widest = set(ordered[0]) if ordered and ordered[0] else set()
    return tuple((re.compile("|".join(f"(?:{t})" for t in by_chars[chars])), chars,
                  i > 0 and chars != "" and set(chars) <= widest)
                 for i, chars in enumerate(ordered))  # fmt: skip


def _needed(detector: Detector) -> re.Pattern[str]:
    flags = re.IGNORECASE if detector.needs_folded else 0
    return re.compile("|".join(re.escape(n) for n in detector.needs), flags)


def _gates(rules: tuple[Detector, ...]) -> tuple[Prefilter, FirstChars]:
    gate = Prefilter(rules)
    # a rule with a needed literal is decided as cheaply on its own (``_without_needed``)
    chars = FirstChars(rules, exclude=[*gate.rules, *(i for i, d in enumerate(rules) if d.needs)])
    return gate, chars


def _undecided(detector: Detector, start: int, stop: int, end: int) -> bool:
    """Whether more text could still change a complete match at ``start``-``stop``."""
    if detector.settle is not None:
        return stop + detector.settle > end
    return start + detector.window > end
