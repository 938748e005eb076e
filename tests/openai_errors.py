"""One check of the OpenAI error object for every test that expects one (the API, the audit
API, hostile clients, fuzzing): ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any, Protocol

import orjson


class Reply(Protocol):
    status_code: int
    content: bytes

    @property
    def headers(self) -> Any: ...


def assert_openai_error(
    reply: Reply, status: int | None = None, code: str | None = None, *,
    hidden: tuple[str, ...] = (), request_id: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """The error object of ``reply`` (with this ``status`` and ``code`` when given), carrying an
    ``x-request-id`` (unless ``request_id`` is false) and echoing none of ``hidden``."""
    if status is not None:
        assert reply.status_code == status, (reply.status_code, reply.content[:300])
    if request_id:
        assert reply.headers["x-request-id"]
    body = orjson.loads(reply.content)
    assert list(body) == ["error"], body
    error = body["error"]
    assert sorted(error) == ["code", "message", "param", "type"], error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    if code is not None:
        assert error["code"] == code, error
    for text in hidden:
        assert text.encode() not in reply.content, text
    return dict(error)
