"""What a guardrail policy looks for: validated formats, secret-key shapes and regexes (sans-I/O).

A ``Detector`` is a bounded pattern (``regex``, for its partial matching: see
``gateway.guard.scanner``), a validator run on each candidate, and the label a redaction puts
in its place. Every pattern is bounded: ``window`` is the most characters a match and the
look-ahead that decides it can span, so a scanner never holds more than that back. The
built-ins end in a look-ahead that any longer match would fail (an email cannot go on past
a character that is neither a word character, a dash nor a dot before one): a match of theirs is
decided as soon as ``settle`` characters (2) follow it, so the text after it is not held.

Built-ins (``BUILTIN``):

- ``email``: local part up to 64 characters, ``@``, a domain of dot-separated labels ending in
  a 2-24 letter top-level label;
- ``phone``: a run of 7-15 digits with the usual separators (``+``, spaces, dots, dashes,
  parentheses), kept only when libphonenumber (``phonenumbers``) finds it a valid number:
  international (``+``) as such, national numbers in the detector's ``region`` (default
  ``US``);
- ``credit_card``: 13-19 digits, optionally grouped by spaces or dashes, starting 2-6 (the
  card networks' ranges), kept only when the Luhn checksum holds;
- ``iban``: two letters, two check digits, 11-30 letters or digits (spaces allowed in groups),
  kept only when the ISO 13616 mod-97 check gives 1;
- ``us_ssn``: ``AAA-GG-SSSS`` without the never-issued areas (000, 666, 9xx), group 00 or
  serial 0000 (dashes required: nine bare digits are too common to call one);
- ``secret_key``: the shapes of common credentials: AWS access key ids, GitHub tokens,
  OpenAI/Anthropic-style ``sk-`` keys, Stripe keys, Slack tokens, Google API keys, JWTs and
  PEM private-key headers.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import phonenumbers
import regex

# How much of a candidate is the value: its length, a shorter prefix (a phone number with a
# stray group of digits after it), or 0 (not one).
Validator = Callable[[str], int]


def _always(text: str) -> int:
    return len(text)


def _whole(check: Callable[[str], bool]) -> Validator:
    return lambda text: len(text) if check(text) else 0


@dataclass(frozen=True, slots=True)
class Detector:
    name: str  # as the policy file names it (``regex`` for a pattern of the file's own)
    label: str  # what a redaction writes in place of the match
    pattern: regex.Pattern[str]
    window: int  # the most characters a match and what decides it can span
    valid: Validator = _always  # how much of a candidate is the value (0: none)
    # Built-ins end in a look-ahead that no longer match can pass: one is decided once this
    # many characters follow it. ``None`` (a file's own regex): once ``window`` from its start.
    settle: int | None = None
    # Two matches from one position: the more specific detector's wins (lower first): a
    # file's own regex, then secret keys, cards, IBANs, SSNs, emails, and phone numbers last
    # (a card or an SSN also reads as a phone number).
    rank: int = 0
    behind: int = 0  # the longest look-behind: characters kept before a scan's position


def luhn(text: str) -> bool:
    digits = [int(c) for c in text if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, digit in enumerate(reversed(digits)):
        if i % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


_IBAN_VALUES = {c: str(i) for i, c in enumerate(string.digits + string.ascii_uppercase)}


def iban(text: str) -> bool:
    compact = text.replace(" ", "")
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(_IBAN_VALUES[c] for c in moved)) % 97 == 1


def phone_validator(region: str) -> Validator:
    def number(text: str) -> bool:
        if sum(c.isdigit() for c in text) < 7:
            return False
        try:
            parsed = phonenumbers.parse(text, None if text.startswith("+") else region)
        except phonenumbers.NumberParseException:
            return False
        return bool(phonenumbers.is_valid_number(parsed))

    def valid(text: str) -> int:
        """The longest valid number the candidate starts with, cut at a separator."""
        while text:
            if number(text):
                return len(text)
            cut = max(text.rfind(" "), text.rfind("-"), text.rfind("."))
            text = text[:cut] if cut > 0 else ""
        return 0

    return valid


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_EMAIL = (
    r"(?<![\w.%+-])[\w.%+-]{1,64}@" + _LABEL + r"(?:\." + _LABEL + r"){0,3}"
    r"\.[A-Za-z]{2,24}(?![\w-]|\.[A-Za-z0-9])"
)
_PHONE = (
    r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{1,5}){1,5}(?![\w])"
)
# 13-19 digits together, or grouped 4-4-4-(1-4) or 4-6-5 (Amex) by one separator kind
_CARD = (
    r"(?<![\w-])(?:[2-6]\d{12,18}|[2-6]\d{3}([ -])\d{4}\1\d{4}\1\d{1,4}"
    r"|3\d{3}([ -])\d{6}\2\d{5})(?![\w])"
)
# together, or in groups of four by single spaces (the last one shorter)
_IBAN = (
    r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{4}){2,7}(?: [A-Z0-9]{1,3})?)"
    r"(?![A-Za-z0-9])"
)
_SSN = r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])"
_SECRET = (
    r"(?<![A-Za-z0-9_-])(?:"
    r"(?:AKIA|ASIA)[A-Z0-9]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{36,80}"
    r"|github_pat_[A-Za-z0-9_]{40,100}"
    r"|sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,120}"
    r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,99}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,80}"
    r"|AIza[A-Za-z0-9_-]{35}"
    r"|eyJ[A-Za-z0-9_-]{8,200}\.eyJ[A-Za-z0-9_-]{8,400}\.[A-Za-z0-9_-]{8,200}"
    r")(?![A-Za-z0-9_-])"
    r"|-----BEGIN (?:[A-Z]{2,10} )?PRIVATE KEY-----"
)


_RANKS = ("secret_key", "credit_card", "iban", "us_ssn", "email", "phone")


def widths(pattern: str) -> tuple[int, int, int]:
    """``(longest match, longest look-behind, longest look-ahead)`` of a pattern in Python's
    ``re`` syntax, in characters; ``PatternError`` when one has no upper bound or ``re``
    cannot read the pattern."""
    try:
        parsed = re._parser.parse(pattern)  # type: ignore[attr-defined]
    except re.error as exc:
        raise PatternError(f"is not a pattern Python's re module reads: {exc}") from None
    longest = parsed.getwidth()[1]
    behind, ahead = _assertions(parsed)
    if max(longest, ahead) >= _UNBOUNDED:
        raise PatternError("has no upper bound on its length (a +, * or {n,}): bound it, as "
                           "in [0-9]{1,12}")  # fmt: skip
    return longest, behind, ahead


_UNBOUNDED = 1 << 16  # re's MAXREPEAT and beyond


def _assertions(parsed: Any) -> tuple[int, int]:
    """The widest look-behind and look-ahead anywhere in a parsed pattern."""
    behind = ahead = 0
    for op, argument in parsed:
        if op in (re._constants.ASSERT, re._constants.ASSERT_NOT):  # type: ignore[attr-defined]
            direction, inner = argument
            width = inner.getwidth()[1]
            behind, ahead = (max(behind, width), ahead) if direction < 0 else \
                (behind, max(ahead, width))  # fmt: skip
        for sub in _subpatterns(argument):
            b, a = _assertions(sub)
            behind, ahead = max(behind, b), max(ahead, a)
    return behind, ahead


def _subpatterns(argument: Any) -> list[Any]:
    found: list[Any] = []
    if isinstance(argument, re._parser.SubPattern):  # type: ignore[attr-defined]
        return [argument]
    if isinstance(argument, (list, tuple)):
        for part in argument:
            found += _subpatterns(part)
    return found


LOOKAHEAD = 2  # the most characters past a built-in's match its closing look-ahead reads


def _builtin(name: str, label: str, pattern: str, valid: Validator) -> Detector:
    rank = _RANKS.index(name) + 1
    longest, behind, ahead = widths(pattern)
    window = longest + max(ahead, LOOKAHEAD)
    return Detector(name, label, regex.compile(pattern), window, valid, LOOKAHEAD, rank, behind)


def builtin(name: str, *, region: str = "US") -> Detector:
    """The built-in detector ``name``; ``KeyError`` for an unknown one."""
    if name == "phone":
        return _builtin("phone", "[PHONE]", _PHONE, phone_validator(region))
    return BUILTIN[name]


BUILTIN: dict[str, Detector] = {
    "email": _builtin("email", "[EMAIL]", _EMAIL, _always),
    "phone": _builtin("phone", "[PHONE]", _PHONE, phone_validator("US")),
    "credit_card": _builtin("credit_card", "[CREDIT_CARD]", _CARD, _whole(luhn)),
    "iban": _builtin("iban", "[IBAN]", _IBAN, _whole(iban)),
    "us_ssn": _builtin("us_ssn", "[US_SSN]", _SSN, _always),
    "secret_key": _builtin("secret_key", "[SECRET_KEY]", _SECRET, _always),
}


class PatternError(ValueError):
    """A policy file's own regex cannot be used (it does not compile, or matches nothing)."""


def custom(pattern: str, *, label: str = "[REDACTED]", max_length: int = 256) -> Detector:
    """A detector for a regex of the policy file's own, in Python's ``re`` syntax, whose
    matches are at most ``max_length`` characters long (refused otherwise: a match the
    scanner had to cut would let its tail through)."""
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise PatternError(f"does not compile: {exc}") from None
    if compiled.fullmatch("") is not None:
        raise PatternError("matches the empty string")
    longest, behind, ahead = widths(pattern)
    if longest > max_length:
        raise PatternError(f"may match {longest} characters, more than max_length "
                           f"({max_length}): raise max_length or bound the pattern")  # fmt: skip
    # decided once the longest match and its look-ahead could be present
    return Detector("regex", label, compiled, max_length + ahead + 1, behind=behind)
