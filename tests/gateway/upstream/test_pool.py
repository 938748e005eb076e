"""The httpx/wire/OS exception boundary is complete: every library error becomes an
``UpstreamError`` with the right kind, before and after the response started."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from gateway.upstream.pool import translate
from gateway.upstream.wire import WireError


def subclasses(cls: type[Any]) -> list[type[Any]]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(subclasses(sub))
    return found


def make(cls: type[BaseException]) -> BaseException | None:
    request = httpx.Request("POST", "http://upstream/v1/chat/completions")
    for args, kwargs in (((), {}), (("boom",), {}), (("boom",), {"request": request})):
        try:
            return cls(*args, **kwargs)
        except TypeError:
            continue
    return None


HTTPX = [c for c in subclasses(httpx.HTTPError) if c.__module__.startswith("httpx")]
WIRE = [WireError, *subclasses(WireError)]


@pytest.mark.parametrize("cls", HTTPX + WIRE, ids=lambda c: c.__name__)
@pytest.mark.parametrize("started", [False, True])
def test_every_library_error_is_translated(cls: type[BaseException], started: bool) -> None:
    exc = make(cls)
    if exc is None:
        exc = cls.__new__(cls)  # constructors with required context: the type is what matters
    assert isinstance(translate(exc, started=started), UpstreamError)


@pytest.mark.parametrize(
    ("exc", "started", "kind"),
    [
        (httpx.ConnectError("refused"), False, UpstreamConnectError),
        (httpx.ConnectTimeout("slow"), False, UpstreamConnectError),
        (ConnectionRefusedError(), False, UpstreamConnectError),
        (httpx.ReadTimeout("idle"), True, UpstreamTimeout),
        (TimeoutError(), False, UpstreamTimeout),
        (httpx.RemoteProtocolError("eof"), True, UpstreamProtocolError),
        (httpx.ReadError("reset"), True, UpstreamProtocolError),
        (ConnectionResetError(), True, UpstreamProtocolError),
    ],
)
def test_kinds(exc: BaseException, started: bool, kind: type[UpstreamError]) -> None:
    assert type(translate(exc, started=started)) is kind


def test_only_upstream_errors_before_the_response_are_retryable() -> None:
    assert translate(httpx.ConnectError("x"), started=False).retryable
    assert not translate(httpx.ReadError("x"), started=True).retryable


def test_programming_errors_are_not_swallowed() -> None:
    with pytest.raises(KeyError):
        translate(KeyError("bug"), started=True)


@pytest.mark.parametrize("wire", [True, False])
async def test_post_raw_gives_a_200s_bytes_and_none_otherwise(wire: bool) -> None:
    """``post_raw`` (the router's ``/tokenize``), on the wire client and on httpx: the answer's
    bytes as sent, ``None`` for another status or an engine that is not there, and the
    engine's requests in flight counted back."""
    from gateway.edge.servers import BackgroundServer
    from gateway.settings import Settings
    from gateway.upstream.pool import UpstreamPool, create_transport

    async def engine(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        found = scope["path"] == "/tokenize"
        await send({"type": "http.response.start", "status": 200 if found else 404,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b'{"tokens": [1, 2]}'})

    async with BackgroundServer(engine) as server:
        settings = Settings(upstreams=(f"{server.url}/v1", "http://127.0.0.1:9/v1"),
                            http_transport="wire" if wire else "httpx")  # fmt: skip
        transport = create_transport(settings.upstream)
        pool = UpstreamPool(transport, settings.upstream)
        try:
            there, gone = pool.upstreams
            assert await pool.post_raw(there, "/tokenize", b"{}") == b'{"tokens": [1, 2]}'
            assert await pool.post_raw(there, "/nothing", b"{}") is None
            assert await pool.post_raw(gone, "/tokenize", b"{}") is None
            assert there.in_flight == gone.in_flight == 0
        finally:
            pool.close()
            await transport.aclose()
