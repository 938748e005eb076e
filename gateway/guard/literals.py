"""The literals every match of a pattern starts with (sans-I/O), for the scanner's shared
prefilter (``gateway.guard.prefilter``): ``starts(pattern) -> (literals, folded)``.

Read from the pattern's parse (Python's ``re`` parser): literals and small classes grow the
prefixes, alternatives and groups branch them, look-arounds and anchors (zero-width) are
passed over, a repeat contributes its first copies; anything that may start with many
characters (``\\w``, a wide class, ``.``) stops a prefix where it is. Every match starts with
one of the literals found, or none are given (too short to say much, or too many).
"""

from __future__ import annotations

import re
import string
from typing import Any

MIN_START = 2  # a literal shorter than this says too little to be worth a prefilter
_MOST_STARTS = 64


def starts(pattern: str, length: int = 3) -> tuple[tuple[str, ...], bool]:
    """The literals (``MIN_START`` to ``length`` characters) every match of ``pattern`` starts
    with, and whether they are compared ignoring case; ``()`` when they cannot be told (a
    match may start with any of many characters) or are too many."""
    parsed = re._parser.parse(pattern)  # type: ignore[attr-defined]
    ignoring = bool(parsed.state.flags & re.IGNORECASE)  # a global (?i)
    try:
        found = _extend({("", ignoring)}, list(parsed), length)
    except _Unknown:
        return (), False
    if not found or any(len(text) < MIN_START for text, _ in found):
        return (), False
    folded = any(ci for _, ci in found)
    return tuple(sorted({t.lower() if folded else t for t, _ in found})), folded


class _Unknown(Exception):
    """Too many literals to tell."""


def _extend(prefixes: set[tuple[str, bool]], items: list[Any], length: int
            ) -> set[tuple[str, bool]]:  # fmt: skip
    """``prefixes`` grown by what ``items`` (a parsed sequence) match first, up to ``length``
    characters; stopped as they are at an item that may start with too many characters."""
    if not items or all(len(text) >= length for text, _ in prefixes):
        return prefixes
    c = re._constants  # type: ignore[attr-defined]
    (op, arg), rest = items[0], items[1:]
    if op == c.LITERAL:
        return _extend({(t + chr(arg), ci) for t, ci in prefixes}, rest, length)
    if op == c.IN and (chars := _chars(arg)) is not None:
        grown = {(t + ch, ci) for t, ci in prefixes for ch in chars}
        return prefixes if len(grown) > _MOST_STARTS else _extend(grown, rest, length)
    if op == c.BRANCH:
        found: set[tuple[str, bool]] = set()
        for alternative in arg[1]:
            found |= _extend(prefixes, list(alternative) + rest, length)
        if len(found) > _MOST_STARTS:
            raise _Unknown
        return found
    if op == c.SUBPATTERN:
        ignoring = bool(arg[1] & re.IGNORECASE)
        return _extend({(t, ci or ignoring) for t, ci in prefixes}, list(arg[3]) + rest, length)
    if op in (c.ASSERT, c.ASSERT_NOT, c.AT):  # zero-width: the match starts after them
        return _extend(prefixes, rest, length)
    if op in (c.MAX_REPEAT, c.MIN_REPEAT) and arg[0] >= 1:  # its first copies, then stop
        return _extend(prefixes, list(arg[2]) * min(arg[0], length), length)
    return prefixes


def _chars(members: Any) -> list[str] | None:
    """The few characters a class holds (``None``: negated, wide or a category)."""
    c = re._constants  # type: ignore[attr-defined]
    found: list[str] = []
    for op, arg in members:
        if op == c.LITERAL:
            found.append(chr(arg))
        elif op == c.RANGE and arg[1] - arg[0] < 8:
            found += [chr(x) for x in range(arg[0], arg[1] + 1)]
        else:
            return None
    return found


def first_chars(pattern: str) -> str:
    """The ASCII characters a match of ``pattern`` can start with, when they are few enough to
    gate on (``""``: any, or too many to tell). A match may also start with any non-ASCII
    character: the gate counts those always (``re``'s and ``regex``'s Unicode tables need not
    agree on what ``\\d`` holds beyond ASCII)."""
    parsed = re._parser.parse(pattern)  # type: ignore[attr-defined]
    folded = bool(parsed.state.flags & re.IGNORECASE)
    try:
        chars, nullable = _first(list(parsed), folded)
    except _Unknown:
        return ""
    if nullable or not chars or len(chars) > _MOST_FIRST:
        return ""
    return "".join(sorted(chars))


_MOST_FIRST = 40  # more first characters than this: prose hits them too often to gate on


def _first(items: list[Any], folded: bool) -> tuple[set[str], bool]:
    """The ASCII characters ``items`` (a parsed sequence) can start with, and whether they can
    match the empty string (then what follows them can start the match too)."""
    found: set[str] = set()
    for op, arg in items:
        chars, empty = _item(op, arg, folded)
        found |= chars
        if not empty:
            return found, False
    return found, True


def _item(op: Any, arg: Any, folded: bool) -> tuple[set[str], bool]:
    """One parsed item's start characters, and whether it can match the empty string."""
    c = re._constants  # type: ignore[attr-defined]
    if op in (c.ASSERT, c.ASSERT_NOT, c.AT):  # zero-width
        return set(), True
    if op == c.LITERAL:
        return _cased(chr(arg), folded), False
    if op == c.IN:
        return _class(arg, folded), False
    if op == c.BRANCH:
        found: set[str] = set()
        nullable = False
        for alternative in arg[1]:
            chars, empty = _first(list(alternative), folded)
            found |= chars
            nullable = nullable or empty
        return found, nullable
    if op == c.SUBPATTERN:
        return _first(list(arg[3]), folded or bool(arg[1] & re.IGNORECASE))
    if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
        chars, empty = _first(list(arg[2]), folded)
        return chars, empty or arg[0] == 0
    raise _Unknown  # a back-reference, ``.``, anything else: too wide to tell


def _cased(char: str, folded: bool) -> set[str]:
    if not char.isascii():
        return set()  # counted always
    return {char.lower(), char.upper()} if folded else {char}


def _class(members: Any, folded: bool) -> set[str]:
    c = re._constants  # type: ignore[attr-defined]
    found: set[str] = set()
    for op, arg in members:
        if op == c.NEGATE:
            raise _Unknown
        if op == c.LITERAL:
            found |= _cased(chr(arg), folded)
        elif op == c.RANGE:
            for code in range(arg[0], min(arg[1], 127) + 1):
                found |= _cased(chr(code), folded)
        elif op == c.CATEGORY and arg == c.CATEGORY_DIGIT:
            found |= set("0123456789")
        else:
            raise _Unknown  # \w, \s and the like: too wide
    return found


def never_after_alnum(pattern: str) -> bool:
    """Whether no match of ``pattern`` can start right after an ASCII letter or digit: every
    way into it passes a look-behind that refuses them first (``(?<![\\w+])`` of the phone
    numbers, ``(?<![A-Za-z0-9-])`` of IBANs), before it consumes anything."""
    parsed = re._parser.parse(pattern)  # type: ignore[attr-defined]
    return _guarded(list(parsed))


def _guarded(items: list[Any]) -> bool:
    c = re._constants  # type: ignore[attr-defined]
    for index, (op, arg) in enumerate(items):
        if op == c.ASSERT_NOT and arg[0] == -1 and _refuses_alnum(list(arg[1])):
            return True
        if op in (c.ASSERT, c.ASSERT_NOT, c.AT):  # another zero-width item: look further
            continue
        rest = items[index + 1 :]
        if op == c.BRANCH:
            return all(_guarded(list(alternative) + rest) for alternative in arg[1])
        if op == c.SUBPATTERN:
            return _guarded(list(arg[3]) + rest)
        return False
    return False


def _refuses_alnum(items: list[Any]) -> bool:
    """A look-behind's body that is one class holding every ASCII letter and digit."""
    c = re._constants  # type: ignore[attr-defined]
    if len(items) != 1 or items[0][0] != c.IN:
        return False
    held: set[str] = set()
    for op, arg in items[0][1]:
        if op == c.NEGATE:
            return False
        if op == c.CATEGORY and arg == c.CATEGORY_WORD:
            return True
        if op == c.CATEGORY and arg == c.CATEGORY_DIGIT:
            held |= set("0123456789")
        elif op == c.RANGE:
            held |= {chr(x) for x in range(arg[0], min(arg[1], 127) + 1)}
        elif op == c.LITERAL:
            held.add(chr(arg))
    return set(string.ascii_letters + string.digits) <= held
