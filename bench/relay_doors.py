"""The relay of ``bench.frontdoors`` behind Granian's RSGI and behind a protocol of its own.

Imports only aiohttp and httptools, so that the benchmark environment (``.venv-bench``) that
holds Granian can serve it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp
import httptools

KEY = "frontdoor-bench-key"
_DROP = {"host", "content-length", "connection", "authorization", "accept-encoding"}


class Upstream:
    """The relay's whole work: one aiohttp session, a request forwarded, reads relayed."""

    def __init__(self, upstream: str) -> None:
        self.base = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def open(self, method: str, path: str, headers: dict[str, str],
                   body: bytes) -> aiohttp.ClientResponse:  # fmt: skip
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
            )
        forward = {k: v for k, v in headers.items() if k not in _DROP}
        url = self.base + path.removeprefix("/v1")
        return await self.session.request(method, url, data=body or None, headers=forward)


class Rsgi:
    """Granian's RSGI interface: ``__rsgi__(scope, protocol)``."""

    def __init__(self) -> None:
        self.upstream = Upstream(os.environ["FRONTDOOR_UPSTREAM"])
        self.auth = f"Bearer {KEY}"

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        headers = dict(scope.headers.items())
        if headers.get("authorization") != self.auth and scope.path != "/health":
            protocol.response_empty(401, [])
            return
        body = await protocol()
        async with await self.upstream.open(scope.method, scope.path, headers, body) as up:
            kept = [("content-type", up.headers.get("content-type", "application/json"))]
            out = protocol.response_stream(up.status, kept)
            async for chunk in up.content.iter_any():
                await out.send_bytes(chunk)


def rsgi_app() -> Rsgi:
    """``granian --factory bench.relay_doors:rsgi_app``."""
    return Rsgi()


class _Connection(asyncio.Protocol):
    """One client connection: httptools parses, a task per complete request answers it."""

    def __init__(self, upstream: Upstream, auth: bytes) -> None:
        self.upstream, self.auth = upstream, auth
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers: dict[str, str] = {}
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode()
        headers, path, body = self.headers, self.url.decode(), b"".join(self.body)
        self.headers, self.url, self.body = {}, b"", []
        asyncio.get_running_loop().create_task(self.answer(method, path, headers, body))

    async def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        transport = self.transport
        assert transport is not None
        if headers.get("authorization") != self.auth.decode() and path != "/health":
            transport.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
            return
        async with await self.upstream.open(method, path, headers, body) as up:
            kind = up.headers.get("content-type", "application/json").encode()
            transport.write(b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\n"
                            b"transfer-encoding: chunked\r\n\r\n" % (up.status, kind))  # fmt: skip
            async for chunk in up.content.iter_any():
                transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        transport.write(b"0\r\n\r\n")


async def serve_protocol(port: int, upstream: str) -> None:
    shared = Upstream(upstream)
    auth = f"Bearer {KEY}".encode()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(shared, auth), "127.0.0.1", port,
                                      backlog=2048)  # fmt: skip
    try:
        async with server:
            await server.serve_forever()
    finally:
        if shared.session is not None:
            await shared.session.close()
