"""A prefilter shared by a scanner's rules that start with known literals (sans-I/O).

``Prefilter(detectors)`` takes the rules whose every match starts with one of their ``starts``
literals (``gateway.guard.detectors.Detector``); ``Prefilter.first(buf, low, final)`` answers, with
one search per text for all of them, where each such rule's first literal occurrence lies at or
after ``low``. No match of a rule, complete or partial, can start before its first occurrence,
so the scanner resumes the rule there, or not at all when there is none: what the rule would
find is unchanged, and a text without any of the literals costs one search instead of one per
rule.

- A literal cut by the end of the text (``AKI`` of ``AKIA``, more text to come) counts as an
  occurrence of every literal it starts, as the rules' own partial matching would hold there.
- Literals of several rules may start at one position; the search reports the longest, and
  the owners of each literal include those of every shorter literal it starts with.
- Literals compared ignoring case are searched apart from the others.
- Below ``MIN_GATED`` such rules the prefilter stays off: one search of its own costs more
  than the one or two rules' searches it would save (measured: the six built-ins alone,
  ``secret_key`` gated, scanned 11 % slower).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import regex

from gateway.guard.detectors import Detector

MIN_GATED = 3  # fewer rules with literals: their own searches cost less than the prefilter's


class Prefilter:
    def __init__(self, detectors: Sequence[Detector]) -> None:
        gated = [i for i, d in enumerate(detectors) if d.starts]
        self.rules = gated if len(gated) >= MIN_GATED else []
        self._searches: list[_Search] = []
        for folded in (False, True):
            owners: dict[str, set[int]] = {}
            for i in self.rules:
                d = detectors[i]
                if d.starts_folded == folded:
                    for literal in d.starts:
                        owners.setdefault(literal, set()).add(i)
            if owners:
                self._searches.append(_Search.of(owners, folded))

    def first(self, buf: str, since: dict[int, int], final: bool) -> dict[int, int]:
        """Each gated rule's first literal occurrence in ``buf`` at or after the offset
        ``since`` gives it; a rule absent has none."""
        found: dict[int, int] = {}
        low = min(since.values())
        for search in self._searches:
            for m in search.pattern.finditer(buf, low, overlapped=True):
                text = m.group().lower() if search.folded else m.group()
                _note(found, since, search.owners[text], m.start())
            if final:
                continue
            for at in range(max(low, len(buf) - search.longest + 1), len(buf)):
                tail = buf[at:].lower() if search.folded else buf[at:]
                _note(found, since, search.started.get(tail, ()), at)
        return found


def _note(found: dict[int, int], since: dict[int, int], rules: Iterable[int], at: int) -> None:
    for rule in rules:
        if at >= since[rule] and at < found.get(rule, at + 1):
            found[rule] = at


@dataclass(frozen=True, slots=True)
class _Search:
    pattern: regex.Pattern[str]  # the literals, the longest first
    owners: dict[str, frozenset[int]]  # a literal found -> its rules and those of its prefixes
    started: dict[str, frozenset[int]]  # a literal's start cut by the end -> the rules
    longest: int
    folded: bool

    @classmethod
    def of(cls, owners: dict[str, set[int]], folded: bool) -> _Search:
        closed = {lit: frozenset(r for other, rs in owners.items() if lit.startswith(other)
                                 for r in rs) for lit in owners}  # fmt: skip
        started: dict[str, set[int]] = {}
        for literal, rules in owners.items():
            for cut in range(1, len(literal)):
                started.setdefault(literal[:cut], set()).update(rules)
        ordered = sorted(owners, key=len, reverse=True)
        pattern = regex.compile("|".join(map(regex.escape, ordered)),
                                regex.IGNORECASE if folded else 0)  # fmt: skip
        return cls(pattern, closed, {k: frozenset(v) for k, v in started.items()},
                   len(ordered[0]), folded)  # fmt: skip
