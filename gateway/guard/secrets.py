"""Secret rules from the field's maintained rule set: detect-secrets' plugins (Yelp), read from
the installed package, compiled to the scanner's bounded, chunk-exact form.

Why detect-secrets rather than gitleaks' default configuration: it is a Python package on PyPI,
so the rules come in as a locked dependency whose version every policy load records
(``RULESET``), with no copy of ours to keep current by hand; and its patterns are Python's own
regex syntax, where gitleaks' are Go's RE2 and rely on its keyword, entropy and allowlist
semantics besides. What the choice leaves out is in docs/guardrails.md (gitleaks keeps far more
rules, Hugging Face tokens among them, which the built-in shapes add).

``secret_rules() -> dict[str, Detector]``, one detector per plugin, named by its module
(``github_token``, ``aws``, ``basic_auth`` ...). A policy names them all (``secret_rules``) or
some (``{secret_key: {rules: [github_token, aws, builtin]}}``, ``builtin`` being the shapes
of ``secret_key``). They are not part of ``secret_key`` itself: scanning prose one token at a
time, the 23 rules add 1.5 times what the six built-ins cost (3 times without the scanner's
shared prefilter, ``gateway.guard.prefilter``, which skips the 17 rules whose matches start
with a literal while none is in sight: ``starts``); measured 2026-12-05, docs/guardrails.md.
Each plugin's ``denylist`` patterns become one alternation, then:

- **Bounded**: an unbounded repeat (``*``, ``+``, ``{n,}``) gets an upper bound (``CAP``
  more characters; a group ``GROUP_CAP`` more times), so the scanner never holds back more
  than a rule's ``window`` (``bound``); a lazy or possessive suffix is kept, but for a lazy
  repeat ending the pattern (it would take nothing, and a redaction must take the whole
  token: a JWT's signature).
- **Chunk-exact anchors**: detect-secrets scans line by line; here text streams, so ``^`` and
  ``$`` become "after a newline or at the start" and "before a newline or at the end", which
  the scanner decides with the look-behind context it keeps, however the text was cut.
- **Flags** the plugin compiled its pattern with (``IGNORECASE``, ``VERBOSE``) are kept as
  scoped flags.

Not imported, with the reason (``LEFT_OUT``): the public-IPv4 plugin (an address is no
credential), the keyword and high-entropy plugins (they are not patterns: they judge quoted
strings by the file's language and their randomness, which in prose would take hashes, ids and
UUIDs for secrets).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
import string
from collections.abc import Callable
from importlib.metadata import version
from typing import Any, NamedTuple

import regex

from gateway.guard.detectors import Detector, PatternError, Validator, rank_of, widths
from gateway.guard.literals import first_chars, never_after_alnum, starts
from gateway.guard.prefilter import trie

CAP = 128  # the most characters an unbounded repeat may take
GROUP_CAP = 4  # the most times an unbounded repeat of a group may repeat it
LABEL = "[SECRET_KEY]"
LEFT_OUT = {
    "ip_public": "a public IPv4 address is no credential",
    "keyword": "not a pattern: judges `password = ...` assignments by the file's language",
    "high_entropy_strings": "not a pattern: flags any random-looking quoted string (hashes, "
    "ids and UUIDs in prose alike)",
}


def _version() -> str:
    return version("detect-secrets")


RULESET = ("detect-secrets", _version())

_QUANTIFIER = re.compile(r"\{(\d+),\}")


def bound(pattern: str, cap: int = CAP) -> str:
    """``pattern`` with every unbounded repeat bounded (``+`` -> ``{1,cap}``, ``*`` ->
    ``{0,cap}``, a group's ``GROUP_CAP`` times, ``{n,}`` -> ``{n,n+cap}``) and ``^``/``$`` as
    line anchors that hold under any chunking; classes and escapes are left as they are."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        token, i = _token(pattern, i)
        out.append(_bounded(token, out[-1] if out else "", cap))
    if len(out) > 1 and out[-1] == "?" and out[-2].endswith("}"):
        out.pop()  # a lazy repeat at the end takes nothing: greedy, a redaction takes it all
    return "".join(out)


def _token(pattern: str, i: int) -> tuple[str, int]:
    """The token at ``i``: an escape, a whole class, a ``{n,}`` repeat or one character."""
    if pattern[i] == "\\":
        return pattern[i : i + 2], i + 2
    if pattern[i] == "[":
        j = i + 1
        j += pattern[j] == "^"
        j += pattern[j] == "]"  # a ] first in a class is a character
        while pattern[j] != "]":
            j += 2 if pattern[j] == "\\" else 1
        return pattern[i : j + 1], j + 1
    repeat = _QUANTIFIER.match(pattern, i)
    if repeat:
        return repeat.group(), repeat.end()
    return pattern[i], i + 1


def _bounded(token: str, before: str, cap: int) -> str:
    if (repeat := _QUANTIFIER.fullmatch(token)) is not None:
        low = int(repeat.group(1))
        return f"{{{low},{low + cap}}}"
    # after "(" or "?" (a group's "(?", a lazy "?") or a repeat's "}", it is no repeat
    if token in "*+" and before and before[-1] not in "(?}":
        most = GROUP_CAP if before == ")" else cap
        return f"{{{0 if token == '*' else 1},{most}}}"
    return {"^": r"(?<![^\n])", "$": r"(?![^\n])"}.get(token, token)


# Rules whose every match holds a match of an ``re`` pattern (``Detector.needs``, as an email's
# "@"), with the ``re`` pattern that finds, in ASCII text without one, where a partial match
# starts: the scanner then decides them without their own partial-mode search while prose has
# none of it (without these, each costs one ``regex`` search per piece). Each was written for
# the bounded pattern beside it and is used only while the installed rule set compiles to that
# pattern: an upgrade that changes one runs its own search until this is brought up to date.
_SEP = ("_", "-", "")
_LINE_OR_NON_WORD = r"(?:(?<=\W)|(?<![^\n]))"  # the IBM rules' leading look-behind, in ``re``


def _closure(slots: tuple[tuple[str, ...], ...]) -> str:
    """Every prefix (the empty one too) of a string made of one choice from each slot in
    turn, as an ``re`` alternation: P(S1 S2 ...) is P(S1) or S1 P(S2 ...)."""
    if not slots:
        return ""
    first, rest = slots[0], slots[1:]
    prefixes = {word[:cut] for word in first for cut in range(1, len(word) + 1)}
    choice = "|".join(re.escape(word) for word in first)
    return f"(?:{trie(prefixes)}|(?:{choice}){_closure(rest)}|)"


def _keyword_tail(*slots: tuple[str, ...]) -> str:
    """Where a partial match of an IBM rule starts when none of its keywords (the last slot)
    is in the text: after a non-word character or at a line start, a prefix of the
    bracket, quote, name, separators and keyword it opens with, reaching the end."""
    return f"(?i:{_LINE_OR_NON_WORD}{_closure(slots)})\\Z"


_IAM_NAMES = tuple(
    [f"ibm{a}cloud{b}iam" for a in _SEP for b in _SEP] + [f"cloud{a}iam" for a in _SEP]
    + [f"ibm{a}cloud" for a in _SEP] + [f"ibm{a}iam" for a in _SEP] + ["ibm", "iam", "cloud", ""]
)  # fmt: skip
_COS_NAMES = (*(f"{ibm}{a}cos{b}{hmac}" for ibm in ("ibm", "") for a in _SEP for b in _SEP
                for hmac in ("hmac", "")), "")  # fmt: skip
_BRACKET, _QUOTE = ("[", ""), ('"', "'", "")

_LOWER_DIGITS = string.ascii_lowercase + string.digits
_KEYWORD_CHARS = string.ascii_letters + "[\"'_-"  # the IBM rules' names, keywords, brackets


class Needed(NamedTuple):
    needs: tuple[str, ...]  # literals every match holds one of
    folded: bool  # compared ignoring case
    tail: str  # ``re``: where a partial match starts in ASCII text without any of them
    chars: str  # the characters of a tail's match
    pattern: str  # the bounded pattern this was written for


NEEDS: dict[str, Needed] = {
    # "AKC"/"AP" after a space, "=", ":", '"' or a line start: without an "A", only that
    # one character can have begun a match (regex's \s, ASCII: no \x1c-\x1f)
    "artifactory": Needed(
        ("A",),
        False,
        r'[\t\n\x0b\x0c\r =:"]\Z',
        '\t\n\x0b\x0c\r =:"',
        r'(?:(?:\s|=|:|"|(?<![^\n]))AKC[a-zA-Z0-9]{10,138}(?:\s|"|(?![^\n])))|'
        r'(?:(?:\s|=|:|"|(?<![^\n]))AP[\dABCDEF][a-zA-Z0-9]{8,136}'
        r'(?:\s|"|(?![^\n])))',
    ),
    # 32 of [0-9a-z] then "-us": the run's last 32, or 32 and a cut "-us"
    "mailchimp": Needed(
        ("-us",),
        False,
        r"(?:[0-9a-z]{32}-u?|[0-9a-z]{1,32})\Z",
        _LOWER_DIGITS + "-",
        r"(?:[0-9a-z]{32}-us[0-9]{1,2})",
    ),
    # 8-10 digits then ":": the run's last 10 digits at most
    "telegram_token": Needed(
        (":",), False, r"\d{1,10}\Z", string.digits, r"(?:\d{8,10}:[0-9A-Za-z_-]{35})"
    ),
    # a keyword (``password`` starts with ``pass``) after an optional bracket, quote, name
    # and separators, every one of them bounded
    "ibm_cloud_iam": Needed(
        ("key", "pwd", "pass", "token"),
        True,
        _keyword_tail(
            _BRACKET, _QUOTE, _IAM_NAMES, _SEP, ("api", ""), _SEP, ("key", "pwd", "pass", "token")
        ),
        _KEYWORD_CHARS,
        r"""(?i:(?:(?<=\W)|(?<=(?<![^\n])))(?:\[|)(?:"|\'|)(?:ibm(?:_|-|)cloud(?:_|-|)iam|"""
        r"""cloud(?:_|-|)iam|ibm(?:_|-|)cloud|ibm(?:_|-|)iam|ibm|iam|cloud|)(?:_|-|)(?:api|)"""
        r"""(?:_|-|)(?:key|pwd|password|pass|token)(?:"|\'|)(?:\]|)(?: {0,128})"""
        r"""(?:=|:|:=|=>| {1,128}|::)(?: {0,128})(?:"|\'|)([a-zA-Z0-9_\-]{44}"""
        r"""(?![a-zA-Z0-9_\-]))(?:"|\'|))""",
    ),
    # "secret" after an optional bracket, quote, name and separator
    "ibm_cos_hmac": Needed(
        ("secret",),
        True,
        _keyword_tail(_BRACKET, _QUOTE, _COS_NAMES, _SEP, ("secret",)),
        _KEYWORD_CHARS,
        r"""(?i:(?:(?<=\W)|(?<=(?<![^\n])))(?:\[|)(?:"|\'|)(?:(?:ibm)?[-_]?cos[-_]?(?:hmac)?|)"""
        r"""(?:_|-|)(?:secret[-_]?(?:access)?[-_]?key)(?:"|\'|)(?:\]|)(?: {0,128})"""
        r"""(?:=|:|:=|=>| {1,128}|::)(?: {0,128})(?:"|\'|)([a-f0-9]{48}(?![a-f0-9]))(?:"|\'|))""",
    ),
}


@functools.cache
def secret_rules() -> dict[str, Detector]:
    """The rule set's rules, by name, in the order of its plugins."""
    import detect_secrets.plugins as plugins
    from detect_secrets.plugins.base import RegexBasedDetector

    found: dict[str, Detector] = {}
    for module in pkgutil.iter_modules(plugins.__path__):
        if module.name in LEFT_OUT or module.name == "base":
            continue
        loaded = importlib.import_module(f"{plugins.__name__}.{module.name}")
        for value in vars(loaded).values():
            if (isinstance(value, type) and issubclass(value, RegexBasedDetector)
                    and value.__module__ == loaded.__name__):  # fmt: skip
                checks = getattr(value, "is_formally_valid", None)  # the JWT plugin's
                found[module.name] = _needing(
                    module.name, _detector(module.name, value().denylist, checks)
                )
    return found


def _needing(name: str, rule: Detector) -> Detector:
    """``rule`` with its needed literal (``NEEDS``) while its pattern is the one written for."""
    needed = NEEDS.get(name)
    if needed is None or rule.pattern.pattern != needed.pattern:
        return rule
    return dataclasses.replace(rule, needs=needed.needs, needs_folded=needed.folded,
                               tail=re.compile(needed.tail), tail_chars=needed.chars)  # fmt: skip


def _formally(checks: Callable[[str], bool]) -> Validator:
    """A plugin's own check of a match (JWT: each part base64url, the first two JSON) as the
    scanner's validator: all of the candidate or none of it."""

    def valid(text: str) -> int:
        return len(text) if checks(text) else 0

    return valid


def _detector(name: str, denylist: Any, checks: Callable[[str], bool] | None = None) -> Detector:
    parts = []
    for compiled in denylist:
        flags = ("i" if compiled.flags & re.IGNORECASE else "") + (
            "x" if compiled.flags & re.VERBOSE else ""
        )
        body = bound(compiled.pattern)
        parts.append(f"(?{flags}:{body})" if flags else f"(?:{body})")
    pattern = "|".join(parts)
    try:
        longest, behind, ahead = widths(pattern)
    except PatternError as exc:
        raise PatternError(f"secret rule {name} {exc}") from None
    literals, folded = starts(pattern)
    made = Detector("secret_key", LABEL, regex.compile(pattern), longest + ahead + 1,
                    rank=rank_of("secret_key"), behind=behind, starts=literals,
                    starts_folded=folded, first=first_chars(pattern),
                    after_alnum=not never_after_alnum(pattern))  # fmt: skip
    return made if checks is None else dataclasses.replace(made, valid=_formally(checks))
