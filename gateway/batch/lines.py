"""A batch's requests, read and checked before anything runs (sans-I/O).

- ``check_jsonl(data)``: an uploaded ``purpose=batch`` file, line by line: each line a JSON
  object with ``custom_id`` (a non-empty string), ``method`` ``POST``, ``url`` one of
  ``ENDPOINTS`` and a ``body`` object; blank lines are skipped. ``BadLine`` names the first bad
  line (1-based) and what is wrong with it, the upload's 400.
- ``openai_lines(data, endpoint)``: the requests of a batch over ``endpoint``: the same checks,
  and each line's ``url`` must be the batch's endpoint; ``custom_id`` unique.
- ``anthropic_lines(requests)``: the ``requests`` of a Message Batch (``custom_id`` of 1-64
  characters ``[A-Za-z0-9_-]``, unique; ``params`` an object).

A line may not stream (``stream: true``) or run in the background: a batch line's answer is
one object. The body is otherwise the endpoint's to judge when the line runs (as it would judge
the same request sent alone); its refusal is the line's error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/embeddings")
MESSAGES = "/v1/messages"
_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CUSTOM_ID = 512


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of a batch: its client's id for it, the path it goes to, its body."""

    custom_id: str
    url: str
    body: dict[str, Any]


class BadLine(ValueError):
    """What is wrong with the input, and where: ``line`` (1-based) for a file, ``index``
    (0-based) for Message Batches' ``requests``; ``param`` the field."""

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        index: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.line, self.index, self.param = line, index, param


def _numbered(data: bytes) -> Iterator[tuple[int, bytes]]:
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            yield number, raw


def _checked(number: int, raw: bytes) -> BatchLine:
    def bad(what: str, param: str | None = None) -> BadLine:
        return BadLine(f"Line {number}: {what}", line=number, param=param)

    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad("not valid JSON.") from None
    if not isinstance(item, dict):
        raise bad("not a JSON object.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        raise bad(f"'custom_id' must be a string of 1 to {MAX_CUSTOM_ID} characters.", "custom_id")
    if item.get("method") != "POST":
        raise bad("'method' must be 'POST'.", "method")
    url = item.get("url")
    if url not in ENDPOINTS:
        raise bad(f"'url' must be one of {', '.join(ENDPOINTS)}.", "url")
    body = item.get("body")
    if not isinstance(body, dict):
        raise bad("'body' must be a JSON object.", "body")
    _one_object(body, lambda what, param: bad(what, f"body.{param}"))
    return BatchLine(custom_id, url, body)


def _one_object(body: dict[str, Any], bad: Any) -> None:
    if body.get("stream") is True:
        raise bad("a batch line cannot stream: its answer is one object.", "stream")
    if body.get("background") is True:
        raise bad("a batch line cannot run in the background: it already does.", "background")


def check_jsonl(data: bytes) -> int:
    """How many requests the file holds; ``BadLine`` at the first bad one."""
    if not data.strip():
        raise BadLine("The file is empty.", line=1)
    try:
        data.decode()
    except UnicodeDecodeError:
        raise BadLine("The file is not UTF-8 text.", line=None) from None
    return len([_checked(number, raw) for number, raw in _numbered(data)])


def openai_lines(data: bytes, endpoint: str, max_lines: int) -> list[BatchLine]:
    """The batch's requests from its input file; ``BadLine`` at the first that cannot be
    part of a batch over ``endpoint``."""
    found: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in _numbered(data):
        line = _checked(number, raw)
        if line.url != endpoint:
            raise BadLine(
                f"Line {number}: its 'url' {line.url} is not the batch's endpoint {endpoint}.",
                line=number,
                param="url",
            )
        if line.custom_id in seen:
            raise BadLine(
                f"Line {number}: the 'custom_id' {line.custom_id!r} is used twice.",
                line=number,
                param="custom_id",
            )
        seen.add(line.custom_id)
        found.append(line)
        if len(found) > max_lines:
            raise BadLine(f"The file holds more than {max_lines} requests.", line=number)
    if not found:
        raise BadLine("The file holds no request.", line=1)
    return found


def anthropic_lines(requests: Any, max_lines: int) -> list[BatchLine]:
    """A Message Batch's ``requests``; ``BadLine`` (with ``index`` and ``param``) at the first
    bad one."""
    if not isinstance(requests, list) or not requests:
        raise BadLine("'requests' must be a non-empty list.", param="requests")
    if len(requests) > max_lines:
        raise BadLine(f"'requests' holds more than {max_lines} requests.", param="requests")
    found: list[BatchLine] = []
    seen: set[str] = set()
    for index, item in enumerate(requests):

        def bad(what: str, param: str, at: int = index) -> BadLine:
            return BadLine(f"requests[{at}]: {what}", index=at, param=f"requests.{at}.{param}")

        if not isinstance(item, dict):
            raise bad("must be an object.", "")
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            raise bad(
                "'custom_id' must be 1 to 64 characters of letters, digits, '_' or '-'.",
                "custom_id",
            )
        if custom_id in seen:
            raise bad(f"the custom_id {custom_id!r} is used twice.", "custom_id")
        seen.add(custom_id)
        params = item.get("params")
        if not isinstance(params, dict):
            raise bad("'params' must be an object.", "params")
        _one_object(params, lambda what, param, at=index: bad(what, f"params.{param}", at))
        found.append(BatchLine(custom_id, MESSAGES, params))
    return found


def encode_lines(lines: Sequence[BatchLine]) -> list[bytes]:
    """Each line as stored (sealed): its custom id, path and body."""
    return [orjson.dumps({"custom_id": x.custom_id, "url": x.url, "body": x.body}) for x in lines]


def decode_line(data: bytes) -> BatchLine:
    item = orjson.loads(data)
    return BatchLine(item["custom_id"], item["url"], item["body"])


ORIGIN = "thinkgate.batch"  # the ASGI scope key of a batch line's origin (set in process only)


@dataclass(frozen=True, slots=True)
class BatchOrigin:
    """What the pipeline takes from a batch line run in process (``gateway.batch.runner``)
    instead of an HTTP request's headers and body: the key whose request it is (looked up
    again, so a revoked key stops its batches), the batch and line it belongs to, its body."""

    key_id: str
    batch_id: str
    custom_id: str
    body: bytes
