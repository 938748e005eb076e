"""Applying an API's field policy (``gateway.api.fields``) to a request body, before its parser
reads it (sans-I/O).

``screen(body, table, unknown)`` returns the body the parser goes on with and the names of the
fields no reference has (``Screened``):

- an ``ignored`` field, and a ``refused`` one whose value asks for nothing (``null`` or one of
  its ``inert`` values), leave the body: nothing downstream sees them, the engine included;
- a ``refused`` field with any other value is a 400 naming it, and why;
- ``honoured`` and ``mapped`` fields stay, for the parser;
- a field no row names is ``UNKNOWN_FIELDS``' business: ``refuse``, a 400 naming it;
  ``ignore``, kept when ``forward_unknown`` (the body goes on to the engine's API of the same
  name, whose extras vLLM reads: chat, completions, embeddings) and dropped otherwise (the
  translated APIs), and named in ``Screened.unknown`` for the route to log, count and name in
  the ``x-thinkgate-ignored`` response header (``IGNORED_HEADER``).

Names are only ever reported as the client sent them, and bounded: a body of a thousand junk
fields is not a header of a thousand names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.api.fields import IGNORED_HEADER, FieldRule, UnknownFields
from gateway.errors import InvalidRequest

__all__ = ["IGNORED_HEADER", "Screened", "ignored_header", "screen"]

MAX_NAMED = 16  # unknown fields named in the header and the log, at most
MAX_NAME = 64  # characters of a name that are shown


@dataclass(frozen=True, slots=True)
class Screened:
    body: dict[str, Any]
    unknown: tuple[str, ...] = ()  # accepted under UNKNOWN_FIELDS=ignore, for the route to report


def screen(
    body: dict[str, Any], table: Mapping[str, FieldRule], unknown: UnknownFields = "ignore",
    *, forward_unknown: bool = False,
) -> Screened:  # fmt: skip
    """The body with the policy applied; ``InvalidRequest`` for a field it refuses."""
    kept: dict[str, Any] = {}
    strangers: list[str] = []
    for name, value in body.items():
        rule = table.get(name)
        if rule is None:
            if unknown == "refuse":
                raise InvalidRequest(f"Unknown parameter: '{_shown(name)}'.", param=_shown(name))
            strangers.append(name)
            if forward_unknown:
                kept[name] = value
        elif rule.policy in ("honoured", "mapped"):
            kept[name] = value
        elif rule.policy == "refused" and not _inert(value, rule):
            raise InvalidRequest(f"'{name}' is not supported by this gateway: {rule.why}.",
                                 param=name)  # fmt: skip
    return Screened(kept, tuple(_shown(n) for n in strangers[:MAX_NAMED]))


def ignored_header(unknown: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The response header naming the unknown fields accepted (none when there were none).
    Header values are Latin-1: a name outside it is shown with its characters escaped."""
    if not unknown:
        return ()
    names = ", ".join(n.encode("ascii", "backslashreplace").decode() for n in unknown)
    return ((IGNORED_HEADER, names),)


def _inert(value: Any, rule: FieldRule) -> bool:
    return value is None or any(value == inert for inert in rule.inert)


def _shown(name: str) -> str:
    printable = "".join(c if c.isprintable() else "?" for c in name[:MAX_NAME])
    return printable + ("…" if len(name) > MAX_NAME else "")
