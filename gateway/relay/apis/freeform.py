"""A custom tool's free-form input, decoded from the function arguments that carry it as they
stream in (sans-I/O, h11 style).

A custom (free-form) tool reaches the engine as a function with one string parameter
(``gateway.api.tools``), so the engine's call arrives as JSON text, ``{"input": "..."}``, in
pieces. ``InputDecoder.feed(text) -> str`` returns the input's characters that became known
(for ``response.custom_tool_call_input.delta``); ``close() -> str`` what is still due;
``input`` is then the whole input. A whole call is ``feed(all) + close()``: one code path.

Rules:

- The arguments are expected to open with ``{``, ``"input"``, ``:`` and the string's opening
  quote, whitespace allowed between. From there each character is released once decoded; an
  escape sequence is held until complete (``\\uXXXX``, and a surrogate pair whole; a lone
  surrogate becomes U+FFFD). The string's closing quote ends the input: what follows (the
  closing brace, keys the model added) is not the input.
- Arguments that open any other way (another key first, not an object) release nothing while
  they stream; at ``close`` they are read whole: their ``input`` when it is a string, else the
  arguments text itself, which is what the model wrote where its input was asked. A string
  cut short (the output limit) is the input as far as it got.
- The concatenation of everything ``feed`` and ``close`` returned equals ``input``. Held text
  is bounded: the opening (at most ``MAX_OPENING`` characters) and one escape sequence.
"""

from __future__ import annotations

import re
from typing import Literal

import orjson

from gateway.errors import LocalProtocolError

MAX_OPENING = 256
_OPENING = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_COMPACT_OPENING = '{"input":"'
_SPACE = re.compile(r"\s+")
_SPECIAL = re.compile(r'["\\]')
_HEX = re.compile(r"[0-9a-fA-F]{4}")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
Stage = Literal["opening", "string", "after", "other", "closed"]


class InputDecoder:
    def __init__(self) -> None:
        self.stage: Stage = "opening"
        self._held = ""  # the opening so far, or an escape sequence not yet complete
        self._raw: list[str] = []  # every piece fed, for arguments read whole at close
        self._input: list[str] = []

    @property
    def input(self) -> str:
        """The input decoded so far (all of it once closed)."""
        return "".join(self._input)

    def feed(self, text: str) -> str:
        if self.stage == "closed":
            raise LocalProtocolError("InputDecoder fed after close()")
        self._raw.append(text)
        if self.stage == "opening":
            text = self._opening(text)
        if self.stage != "string" or not text:
            return ""
        out = self._string(self._held + text)
        self._input.append(out)
        return out

    def close(self) -> str:
        """What is still due; nothing may be fed after."""
        stage, self.stage = self.stage, "closed"
        if stage not in ("opening", "other"):
            return ""  # a string: released as it came (a held escape cut short is lost)
        whole = "".join(self._raw)
        try:
            parsed = orjson.loads(whole)
        except orjson.JSONDecodeError:
            parsed = None
        value = parsed.get("input") if isinstance(parsed, dict) else None
        out = value if isinstance(value, str) else whole
        self._input = [out]
        return out

    def _opening(self, text: str) -> str:
        """Text after the opening once it is complete (the stage becomes ``string``)."""
        held = self._held + text
        found = _OPENING.match(held)
        if found is not None:
            self.stage, self._held = "string", ""
            return held[found.end() :]
        compact = _SPACE.sub("", held)
        if len(held) > MAX_OPENING or not _COMPACT_OPENING.startswith(compact):
            self.stage, self._held = "other", ""
        else:
            self._held = held
        return ""

    def _string(self, text: str) -> str:
        """Decode string characters up to the closing quote; hold an incomplete escape."""
        out: list[str] = []
        i, end = 0, len(text)
        while i < end:
            stop = _next_special(text, i)
            out.append(text[i:stop])
            if stop == end:
                break
            if text[stop] == '"':
                self.stage = "after"
                break
            decoded, used = _escape(text, stop)
            if used == 0:
                self._held = text[stop:]
                return "".join(out)
            out.append(decoded)
            i = stop + used
        self._held = ""
        return "".join(out)


def _next_special(text: str, start: int) -> int:
    """The index of the next quote or backslash at or after ``start`` (``len(text)``: none)."""
    found = _SPECIAL.search(text, start)
    return found.start() if found is not None else len(text)


def _escape(text: str, at: int) -> tuple[str, int]:
    """The escape sequence at ``text[at]`` (a backslash): ``(decoded, characters used)``;
    ``used == 0`` while it is incomplete."""
    if at + 1 >= len(text):
        return "", 0
    kind = text[at + 1]
    if kind != "u":
        return _ESCAPES.get(kind, kind), 2
    if len(text) < at + 6:
        return "", 0
    unit = _hex(text, at + 2)
    if unit is None:
        return kind, 2  # not an escape JSON knows: its letter, as written
    if 0xDC00 <= unit <= 0xDFFF:
        return "\ufffd", 6
    if 0xD800 <= unit <= 0xDBFF:
        return _pair(text, at, unit)
    return chr(unit), 6


def _pair(text: str, at: int, high: int) -> tuple[str, int]:
    """A high surrogate's character, once its low half is known (U+FFFD when it has none)."""
    follow = text[at + 6 : at + 8]
    if follow != "\\u"[: len(follow)]:
        return "\ufffd", 6  # something else follows: a lone surrogate
    if len(text) < at + 12:
        return "", 0
    low = _hex(text, at + 8)
    if low is None or not 0xDC00 <= low <= 0xDFFF:
        return "\ufffd", 6
    return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)), 12


def _hex(text: str, at: int) -> int | None:
    digits = text[at : at + 4]
    return int(digits, 16) if _HEX.fullmatch(digits) else None
