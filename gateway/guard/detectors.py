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
  a 2-24 letter top-level label; internationalised domains in Unicode (``пример.рф``) or in
  punycode (``xn--d1acufc.xn--p1ai``) alike;
- ``phone``: a run of 7-15 digits with the usual separators (``+``, spaces, dots, dashes,
  parentheses), kept only when libphonenumber (``phonenumbers``) finds it a valid number:
  international (``+``) as such, national numbers in any of the detector's ``regions``
  (default ``US``);
- ``credit_card``: 13-19 digits, optionally grouped by spaces or dashes, starting 2-6 (the
  card networks' ranges), or 15 together starting with 1 (UATP), kept only when the Luhn
  checksum holds;
- ``iban``: two letters, two check digits, 11-30 letters or digits, together or in groups of
  four by spaces or by dashes, kept only when valid by the ISO 13616 registry (python-stdnum:
  the country's length and BBAN format, and the mod-97 check); a stray group after a valid
  one is cut off;
- ``us_ssn``: ``AAA-GG-SSSS`` (or with spaces or dots, the same separator twice) without the
  never-issued areas (000, 666, 9xx), group 00 or serial 0000; nine bare digits only with
  ``bare`` and a context word just before them (``SSN``, ``social security number``: ``SSN:
  078051120``), as nine digits alone are too common to call one;
- ``secret_key``: the shapes of common credentials: AWS access key ids, GitHub tokens,
  OpenAI/Anthropic-style ``sk-`` keys, Stripe keys, Slack tokens, Google API keys, Hugging
  Face and npm tokens, JWTs and PEM private-key headers; a policy naming ``secret_key`` gets
  the maintained rule set's rules beside these (``gateway.guard.secrets``).
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import regex

from gateway.guard.literals import first_chars, never_after_alnum, starts

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
    # The literals every match starts with, for the scanner's shared prefilter
    # (``gateway.guard.prefilter``; ``()``: none known), compared ignoring case when folded.
    starts: tuple[str, ...] = ()
    starts_folded: bool = False
    # The ASCII characters every match starts with, when few (``literals.first_chars``; ``""``:
    # unknown), for the scanner's first-character gate (``gateway.guard.prefilter``).
    first: str = ""
    # Whether a match may start right after an ASCII letter or digit (``False``: a leading
    # look-behind refuses them, ``literals.never_after_alnum``), for the same gate.
    after_alnum: bool = True
    # Literals every complete match holds one of (an email's ``@``; a few keywords, compared
    # ignoring case when folded), and, for ASCII text without any, an ``re`` pattern that finds
    # where a partial match starts (searched from the rule's position; none: no partial
    # match). The scanner then answers without the rule's own partial-mode search
    # (``ChannelScanner._scan``). Case ignored, ``re`` finds them in at least the texts
    # ``regex`` would ("K", the Kelvin sign, for "k").
    needs: tuple[str, ...] = ()
    needs_folded: bool = False
    tail: re.Pattern[str] | None = None
    # The ASCII characters a match of ``tail`` consists of (more will do; ``""``: unknown): it
    # can start no earlier than the run of them that ends the text, so the scanner skips its
    # search when that run starts past a hold it has already (``ChannelScanner._quickly``).
    tail_chars: str = ""


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


def iban(text: str) -> bool:
    """Valid by the ISO 13616 registry: its country's length and BBAN format, and mod-97. Not
    python-stdnum's national checks (a bank code looked up in its list of a country's banks:
    a real account at a bank missing from that list, Presidio's ``BE68539007547034``, would
    go unredacted)."""
    from stdnum import iban as iso13616  # loaded at the first candidate, not with the module
    from stdnum.exceptions import ValidationError

    compact = text.replace(" ", "").replace("-", "")
    if not 15 <= len(compact) <= 34:
        return False
    try:
        iso13616.validate(compact, check_country=False)
    except ValidationError:
        return False
    return True


def _longest(check: Callable[[str], bool]) -> Validator:
    def valid(text: str) -> int:
        """The longest valid value the candidate starts with, cut at a separator."""
        while text:
            if check(text):
                return len(text)
            cut = max(text.rfind(" "), text.rfind("-"), text.rfind("."))
            text = text[:cut] if cut > 0 else ""
        return 0

    return valid


def phone_validator(*regions: str) -> Validator:
    """A number valid as international (``+``), or as national in any of ``regions``."""
    regions = regions or ("US",)

    def number(text: str) -> bool:
        import phonenumbers  # loaded at the first candidate, not with the module

        if sum(c.isdigit() for c in text) < 7:
            return False
        for region in (None,) if text.startswith("+") else regions:
            try:
                parsed = phonenumbers.parse(text, region)
            except phonenumbers.NumberParseException:
                continue
            if phonenumbers.is_valid_number(parsed):
                return True
        return False

    return _longest(number)


# a domain label: letters (any script) and digits, dashes inside; the top-level label is
# letters, or punycode (xn--...)
_LABEL = r"[^\W_](?:[^\W_]|-){0,62}(?<!-)"
_LOCAL_PART = r"(?<![\w.%+-])[\w.%+-]{1,64}"
_EMAIL = (
    _LOCAL_PART + "@" + _LABEL + r"(?:\." + _LABEL + r"){0,3}"
    r"\.(?:[^\W\d_]{2,24}|xn--[A-Za-z0-9]{1,59})(?![\w-]|\.[^\W_])"
)
# never from a digit inside a run of them (``is415-555-0132``: not ``555-0132``, a valid German
# number); a ``+`` or ``(`` starts one anywhere
_PHONE = (
    r"(?<![\w+])(?!(?<=\d[ .-])\d)"
    r"(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{1,5}){1,5}(?![\w])"
)
# 13-19 digits together (15 starting with 1: UATP), or grouped 4-4-4-(1-4) or 4-6-5 (Amex)
# by one separator kind
_CARD = (
    r"(?<![\w-])(?:[2-6]\d{12,18}|1\d{14}|[2-6]\d{3}([ -])\d{4}\1\d{4}\1\d{1,4}"
    r"|3\d{3}([ -])\d{6}\2\d{5})(?![\w])"
)
# together, or in groups of four by single spaces or single dashes (the last one may be
# shorter, or a stray group the validator cuts off)
_IBAN = (
    r"(?<![A-Za-z0-9-])[A-Z]{2}\d{2}"
    r"(?:[A-Z0-9]{11,30}|([ -])[A-Z0-9]{4}(?:\1[A-Z0-9]{4}){1,6}(?:\1[A-Z0-9]{1,4})?)"
    r"(?![A-Za-z0-9]|-[A-Za-z0-9])"
)
_SSN = (
    r"(?<![\w.-])(?!000|666|9\d\d)\d{3}(?P<s>[- .])(?!00)\d{2}(?P=s)(?!0000)\d{4}"
    r"(?![\w-]|\.\d)"
)
# nine bare digits right after a context word: "SSN: 078051120", "social security no. ..."
_SSN_BARE = (
    r"(?<=(?i:\bssn|\bsocial[ -]security(?:[ -](?:number|no\.?|#))?)[\s:#.=-]{0,3}"
    r"(?:(?i:is|was|number|no\.?)[\s:#.=-]{1,3})?)"
    r"(?!000|666|9\d\d)\d{3}(?P<b>[- .]?)(?!00)\d{2}(?P=b)(?!0000)\d{4}(?![\w-]|\.\d)"
)
_SECRET = (
    r"(?<![A-Za-z0-9_-])(?:"
    r"(?:AKIA|ASIA)[A-Z0-9]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{36,80}"
    r"|github_pat_[A-Za-z0-9_]{40,100}"
    r"|sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,120}"
    r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,99}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,80}"
    r"|AIza[A-Za-z0-9_-]{35}"
    r"|hf_[A-Za-z0-9]{34,40}"
    r"|npm_[A-Za-z0-9]{36}"
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


def rank_of(name: str) -> int:
    """A built-in's rank among detectors matching from one position (lower wins)."""
    return _RANKS.index(name) + 1


def _builtin(name: str, label: str, pattern: str, valid: Validator) -> Detector:
    rank = rank_of(name)
    longest, behind, ahead = widths(pattern)
    window = longest + max(ahead, LOOKAHEAD)
    literals, folded = starts(pattern)  # secret keys' prefixes; the others start too widely
    return Detector(name, label, regex.compile(pattern), window, valid, LOOKAHEAD, rank, behind,
                    literals, folded, first_chars(pattern),
                    not never_after_alnum(pattern))  # fmt: skip


def builtin(name: str, *, regions: tuple[str, ...] = ("US",), bare: bool = False) -> Detector:
    """The built-in detector ``name``; ``KeyError`` for an unknown one. ``regions``: where a
    phone number without ``+`` may be national; ``bare``: an SSN of nine bare digits after a
    context word counts too."""
    if name == "phone" and regions != ("US",):
        return _builtin("phone", "[PHONE]", _PHONE, phone_validator(*regions))
    if name == "us_ssn" and bare:
        return _builtin("us_ssn", "[US_SSN]", _SSN + "|" + _SSN_BARE, _always)
    return BUILTIN[name]


BUILTIN: dict[str, Detector] = {
    "email": dataclasses.replace(
        _builtin("email", "[EMAIL]", _EMAIL, _always),
        needs=("@",),
        tail=re.compile(_LOCAL_PART + r"\Z"),  # a local part that reaches the end
        tail_chars=string.ascii_letters + string.digits + "_.%+-",
    ),
    "phone": _builtin("phone", "[PHONE]", _PHONE, phone_validator("US")),
    "credit_card": _builtin("credit_card", "[CREDIT_CARD]", _CARD, _whole(luhn)),
    "iban": _builtin("iban", "[IBAN]", _IBAN, _longest(iban)),
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
    literals, folded = starts(pattern)
    return Detector("regex", label, compiled, max_length + ahead + 1, behind=behind,
                    starts=literals, starts_folded=folded, first=first_chars(pattern),
                    after_alnum=not never_after_alnum(pattern))  # fmt: skip
