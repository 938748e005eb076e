"""A request body as the JSON object every API here takes (sans-I/O), with an error that says
what is wrong with it: not UTF-8 (Latin-1 bytes, a lone surrogate escape), a byte order mark
(RFC 8259 §8.1: never sent), not JSON, or JSON that is not an object."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest

_BOM = b"\xef\xbb\xbf"


def json_object(raw: bytes) -> dict[str, Any]:
    """The decoded object; ``InvalidRequest`` naming the problem otherwise."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(_why(raw, str(exc))) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


def _why(raw: bytes, detail: str) -> str:
    if raw.startswith(_BOM):
        return "The request body starts with a byte order mark: send UTF-8 without one."
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"The request body is not valid UTF-8 (byte {exc.start})."
    if "surrogate" in detail.lower():
        return "The request body is not valid UTF-8: it escapes a lone surrogate (\\ud800-\\udfff)."
    return "The request body is not valid JSON."
