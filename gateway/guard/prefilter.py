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

import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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

    def any(self, buf: str, low: int, final: bool) -> bool:
        """Whether any literal occurs in ``buf`` at or after ``low`` (or, more text to come,
        starts in its last characters): one search per text in the common case of none."""
        for search in self._searches:
            if search.pattern.search(buf, low) is not None:
                return True
            if not final and search.cut.search(buf, max(low, len(buf) - search.longest + 1)):
                return True
        return False

    def cut_before(self, buf: str, low: int, high: int) -> bool:
        """Whether a literal's start ends ``buf`` at a position in ``[low, high)``."""
        for search in self._searches:
            start = max(low, len(buf) - search.longest + 1)
            m = search.cut.search(buf, start) if start < high else None
            if m is not None and m.start() < high:
                return True
        return False

    def literals(self) -> tuple[list[str], list[str]] | None:
        """The literals compared as they are, and those compared ignoring case (lowered), for
        a search that looks for any of them with other things; ``None`` where one is not
        ASCII."""
        found: tuple[list[str], list[str]] = ([], [])
        for search in self._searches:
            if not all(literal.isascii() for literal in search.owners):
                return None
            found[search.folded].extend(lit.lower() if search.folded else lit
                                        for lit in search.owners)  # fmt: skip
        return found

    def first(self, buf: str, since: dict[int, int], final: bool) -> dict[int, int]:
        """Each gated rule's first literal occurrence in ``buf`` at or after the offset
        ``since`` gives it; a rule absent has none."""
        found: dict[int, int] = {}
        low = min(since.values())
        for search in self._searches:
            for m in search.pattern.finditer(buf, low):  # every start, overlapping ones too
                text = m.group(1).lower() if search.folded else m.group(1)
                _note(found, since, search.owners[text], m.start())
            if final:
                continue
            for at in range(max(low, len(buf) - search.longest + 1), len(buf)):
                tail = buf[at:].lower() if search.folded else buf[at:]
                _note(found, since, search.started.get(tail, ()), at)
        return found


class FirstChars:
    """The gate of rules whose every match starts with one of a few ASCII characters, none a
    lowercase letter (``Detector.first``: digits for phone numbers, cards and SSNs, capitals
    for IBANs), or with any non-ASCII one: ``first(buf, since)`` answers, with one search of
    Python's ``re`` for all of them, where each rule's first such character lies at or after
    its offset in ``since``. As for the literals above, no match, complete or partial, can
    start before it, so the scanner resumes the rule there or decides it to the end. Prose is
    mostly lowercase letters and spaces: a token of it costs one ``re`` search (about a tenth
    of a microsecond) instead of one partial-mode ``regex`` search per rule (a few each).
    Rules gated by the literals (``exclude``) are left to them."""

    def __init__(self, detectors: Sequence[Detector], exclude: Iterable[int] = ()) -> None:
        skip = set(exclude)
        self.rules = [i for i, d in enumerate(detectors) if i not in skip and d.first
                      and not any(ch.islower() for ch in d.first)]  # fmt: skip
        self._owners: dict[str, list[int]] = {}
        for i in self.rules:
            for ch in detectors[i].first:
                self._owners.setdefault(ch, []).append(i)
        # rules whose look-behind refuses an ASCII letter or digit before their start: their
        # start characters count only after anything else (" 42", not "thought42")
        self._strict = {i for i in self.rules if not detectors[i].after_alnum}
        strict = {ch for i in self._strict for ch in detectors[i].first}
        loose = {ch for i in self.rules if i not in self._strict for ch in detectors[i].first}
        # one class of every start character, so ``re`` skips prose at its class-scanning
        # speed; then the character must be a loose one, or come after no ASCII letter or digit
        # (a lookbehind over it and the one before: the text's start counts as neither)
        anywhere = _class(loose) + _NON_ASCII
        self._pattern = re.compile(
            f"[{_class(strict | loose)}{_NON_ASCII}](?:(?<=[{anywhere}])|(?<![A-Za-z0-9].))"
            if strict else f"[{anywhere}]"
        )  # fmt: skip

    @property
    def source(self) -> str:
        """The start characters' ``re`` pattern, to search for with other things."""
        return self._pattern.pattern

    def any(self, buf: str, low: int, final: bool = False) -> bool:
        """Whether any of the rules' start characters occurs in ``buf`` at or after ``low``
        (``final``: as for the literals; a single character cannot be cut by the end)."""
        return self._pattern.search(buf, low) is not None

    def first(self, buf: str, since: dict[int, int], final: bool = False) -> dict[int, int]:
        """Each rule's first start character in ``buf`` at or after ``since[rule]``; a rule
        absent has none."""
        found: dict[int, int] = {}
        wanted = len(self.rules)
        owners, every, strict = self._owners, self.rules, self._strict
        for m in self._pattern.finditer(buf, min(since.values())):
            at = m.start()
            after = at > 0 and buf[at - 1] in _ALNUM
            for rule in owners.get(buf[at], every):  # a non-ASCII character: every rule
                if rule not in found and at >= since[rule] and not (after and rule in strict):
                    found[rule] = at
            if len(found) == wanted:
                break
        return found


_ALNUM = frozenset(string.ascii_letters + string.digits)
_NON_ASCII = "\\x80-\\U0010ffff"  # in a class: every character outside ASCII


def _class(chars: Iterable[str]) -> str:
    return "".join(re.escape(ch) for ch in sorted(chars))


def _note(found: dict[int, int], since: dict[int, int], rules: Iterable[int], at: int) -> None:
    for rule in rules:
        if at >= since[rule] and at < found.get(rule, at + 1):
            found[rule] = at


def trie(words: Iterable[str]) -> str:
    """``words`` as one alternation factored by their common prefixes: ``re`` tries every
    alternative at each position, and a trie's branches part on one character, so a search
    costs a third of the flat alternation's (a half with case ignored); where several words
    match, the longest is taken (each optional rest is greedy)."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}
    return _branches(root)


def _branches(node: dict[str, Any]) -> str:
    parts = [re.escape(ch) + _branches(rest) for ch, rest in sorted(node.items()) if ch]
    if not parts:
        return ""
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    return f"(?:{body})?" if "" in node else body  # a word may end here


@dataclass(frozen=True, slots=True)
class _Search:
    # ``(?=(literal|...))`` as a trie, the longest first: a zero-width match at every position
    # where one starts, so overlapping occurrences are all found; Python's ``re`` where the
    # literals are ASCII (a search costs a tenth of ``regex``'s), else ``regex``
    pattern: re.Pattern[str] | regex.Pattern[str]
    owners: dict[str, frozenset[int]]  # a literal found -> its rules and those of its prefixes
    started: dict[str, frozenset[int]]  # a literal's start cut by the end -> the rules
    # any of ``started`` ending the text: one search for "a literal may be cut here" (with
    # case ignored, ``re`` may say so of a few more characters, as "ſ" for "s": never fewer)
    cut: re.Pattern[str] | regex.Pattern[str]
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
        ahead = "(?=(" + trie(ordered) + "))"
        ends = "(?:" + trie(started) + r")\Z"
        engine: Any = re if all(literal.isascii() for literal in ordered) else regex
        flags = engine.IGNORECASE if folded else 0
        return cls(engine.compile(ahead, flags), closed,
                   {k: frozenset(v) for k, v in started.items()},
                   engine.compile(ends if started else r"(?!)", flags), len(ordered[0]),
                   folded)  # fmt: skip
