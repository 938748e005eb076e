"""A request body as the JSON object every API here takes (sans-I/O), with an error that says
what is wrong with it: not UTF-8 (Latin-1 bytes, a lone surrogate escape), a byte order mark
(RFC 8259 §8.1: never sent), not JSON, JSON that is not an object, or JSON nested deeper than
``MAX_DEPTH``.

Why a depth bound: every body is later written again, into the upstream request and into the
ledger record (``audit.record.Body``), by orjson, whose writer stops at 254 levels while its
reader takes 1,024. A body between the two was read, sent to the engine, and then could not be
recorded: an answer without its record. ``MAX_DEPTH`` (64) is far below what any layer takes
(the record adds two levels, a translated API a few more) and far above what real requests nest
(a tool's JSON schema of twenty levels is 45 here). Size is bounded before this, by
``MAX_BODY_BYTES`` at the edge (``gateway.edge.body``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest

_BOM = b"\xef\xbb\xbf"
MAX_DEPTH = 64  # the body object itself is level 1


def json_object(raw: bytes) -> dict[str, Any]:
    """The decoded object; ``InvalidRequest`` naming the problem otherwise."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(_why(raw, str(exc))) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    # A body can nest no deeper than it has brackets: counting them spares a small request
    # any more. Counting costs 0.7 µs a kB, orjson's writer 0.25 (an agent's context holds a
    # thousand brackets anyway): a larger body goes to the writer at once. The walk runs only
    # to name the field of a body past the limit.
    small = len(raw) <= _COUNTED_BYTES
    if (not small or raw.count(b"[") + raw.count(b"{") > MAX_DEPTH) and not _shallow(body):
        _check_depth(body)
    return body


_COUNTED_BYTES = 8 << 10  # up to this size, brackets are counted before orjson is asked


def _nested(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


def _writable_depth() -> int:
    """The deepest nesting orjson writes (254 in orjson 3; every container counts, an empty
    one too), found once by asking it."""
    low, high = 1, 1024
    while low < high:
        middle = (low + high + 1) // 2
        try:
            orjson.dumps(_nested([], middle - 1))
        except TypeError:  # orjson.JSONEncodeError
            high = middle - 1
        else:
            low = middle
    return low


# A body wrapped in this many lists is written by orjson if and only if it nests no deeper
# than MAX_DEPTH.
_WRAP = _writable_depth() - MAX_DEPTH


def _shallow(body: dict[str, Any]) -> bool:
    """Whether ``body`` nests no deeper than ``MAX_DEPTH``, asked of orjson's writer: one
    encoding in C (37 µs for an agent's 158 kB context of 1,224 brackets) where the walk
    costs 270. ``False`` when orjson cannot say (nor write it for any other reason): the walk
    decides then."""
    if _WRAP < 1:
        return False
    try:
        orjson.dumps(_nested(body, _WRAP))
    except TypeError:
        return False
    return True


def _check_depth(body: dict[str, Any]) -> None:
    """``InvalidRequest`` naming the top-level field whose value nests past ``MAX_DEPTH``.
    Iterative: a recursive walk would meet Python's own recursion limit first."""
    for name, value in body.items():
        if type(value) is not dict and type(value) is not list:
            continue
        pending: list[tuple[Any, int]] = [(value, 2)]
        while pending:
            node, depth = pending.pop()
            if depth > MAX_DEPTH:
                raise InvalidRequest(
                    f"'{name}' nests JSON deeper than {MAX_DEPTH} levels, the limit for any "
                    "request body.", param=name,
                )  # fmt: skip
            children = node.values() if type(node) is dict else node
            pending += [(child, depth + 1) for child in children
                        if type(child) is dict or type(child) is list]  # fmt: skip


def _why(raw: bytes, detail: str) -> str:
    if raw.startswith(_BOM):
        return "The request body starts with a byte order mark: send UTF-8 without one."
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"The request body is not valid UTF-8 (byte {exc.start})."
    if "surrogate" in detail.lower():
        return "The request body is not valid UTF-8: it escapes a lone surrogate (\\ud800-\\udfff)."
    if "depth limit" in detail.lower():
        return f"The request body nests JSON deeper than {MAX_DEPTH} levels, the limit."
    return "The request body is not valid JSON."
