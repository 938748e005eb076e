"""The wire client (``gateway/upstream/wire.py``) against a server whose bytes each test
writes itself: the three body framings, keep-alive reuse and its limits, the errors of a
broken response, pushing with backpressure, and TLS."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.upstream.wire import WireError, WirePool, WireResponse
from tests.tls import self_signed
from tests.waiting import eventually

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK_CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


class Server:
    """A TCP server running ``handler`` per connection; counts connections."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler, self.tls = handler, tls
        self.connections = 0
        self.requests: list[bytes] = []
        self.go = asyncio.Event()

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))  # fmt: skip
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


async def whole(response: WireResponse) -> bytes:
    parts = []
    while part := await response.read():
        parts.append(part)
    return b"".join(parts)


async def post(pool: WirePool, server: Server, body: bytes = b"{}") -> WireResponse:
    headers = [(b"content-type", b"application/json")]
    return await pool.post("http", "127.0.0.1", server.port, "/v1/chat/completions", headers,
                           body, 5.0)  # fmt: skip


@pytest.fixture
async def keepalive_server() -> AsyncIterator[Server]:
    """Answers every request on a connection with two chunks, until the client leaves; the
    second once ``server.go`` is set."""
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await server.request(reader)
            writer.write(OK_CHUNKED + chunk(b"data: " + body + b"\n\n"))
            await writer.drain()
            await server.go.wait()
            writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()

    async with Server(handler) as server:
        server.go = asyncio.Event()
        server.go.set()
        yield server


async def test_a_chunked_stream_is_read_and_its_connection_reused(
    keepalive_server: Server,
) -> None:
    pool = WirePool(4)
    for n in range(3):
        response = await post(pool, keepalive_server, b'{"n":%d}' % n)
        assert response.status == 200 and response.header(b"content-type") == b"text/event-stream"
        assert await whole(response) == b'data: {"n":%d}\n\ndata: [DONE]\n\n' % n
        assert response.complete
        response.release()
    assert keepalive_server.connections == 1
    request = keepalive_server.requests[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"content-length: 7\r\n" in request and request.endswith(b'\r\n\r\n{"n":0}')
    pool.close()


async def test_a_stream_cut_short_closes_its_connection(keepalive_server: Server) -> None:
    pool = WirePool(4)
    keepalive_server.go.clear()
    first = await post(pool, keepalive_server)
    assert await first.read()
    first.release()  # not read to its end, not ending: the engine must hear it stop
    keepalive_server.go.set()
    second = await post(pool, keepalive_server)
    await whole(second)
    second.release()
    assert keepalive_server.connections == 2
    pool.close()


async def test_released_when_done_it_waits_for_the_framing_and_is_reused() -> None:
    server: Server
    framing = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.request(reader)
            writer.write(OK_CHUNKED + chunk(b"data: [DONE]\n\n"))
            await writer.drain()
            await framing.wait()  # the last chunk's terminator comes after the release
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with Server(handler) as server:
        pool = WirePool(4)
        response = await post(pool, server)
        assert await response.read() == b"data: [DONE]\n\n"
        response.release(ending=True)
        framing.set()
        await eventually(lambda: response.complete, within_s=5)
        again = await post(pool, server)
        assert await again.read() == b"data: [DONE]\n\n"
        assert server.connections == 1
        pool.close()


async def test_content_length_and_until_close_bodies() -> None:
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (body := await server.request(reader)) != b"close":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
            await writer.drain()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\nuntil ")
        await writer.drain()
        writer.write(b"close")
        await writer.drain()

    async with Server(handler) as server:
        pool = WirePool(4)
        response = await post(pool, server, b"hello")
        assert await whole(response) == b"hello"
        response.release()
        response = await post(pool, server, b"again")  # kept alive: on the same connection
        assert await whole(response) == b"again"
        response.release()
        assert server.connections == 1
        response = await post(pool, server, b"close")
        assert await whole(response) == b"until close" and response.complete
        response.release()
        pool.close()


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab", id="lost-mid-body"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", id="bad-chunk-size"
        ),
        pytest.param(b"HTCPCP/1.0 418\r\n\r\n", id="not-http"),
        pytest.param(b"", id="closed-before-answering"),
    ],
)
async def test_a_broken_response_is_a_wire_error(reply: bytes) -> None:
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(reply)
        await writer.drain()

    async with Server(handler) as server:
        pool = WirePool(4)
        with pytest.raises(WireError):
            await whole(await post(pool, server))
        await eventually(lambda: not pool._open, within_s=5)  # the connection was dropped
        pool.close()


async def test_an_idle_connection_the_engine_closed_is_replaced_transparently() -> None:
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()  # and closes at once, but said keep-alive

    async with Server(handler) as server:
        pool = WirePool(4)
        for _ in range(3):
            response = await post(pool, server)
            assert await whole(response) == b"ok"
            response.release()
        assert server.connections == 3
        pool.close()


async def test_the_connection_limit_makes_a_request_wait_for_a_slot(
    keepalive_server: Server,
) -> None:
    pool = WirePool(1)
    first = await post(pool, keepalive_server)
    waiting = asyncio.create_task(post(pool, keepalive_server))
    await asyncio.sleep(0)
    assert not waiting.done()
    with pytest.raises(TimeoutError):
        await pool.post("http", "127.0.0.1", keepalive_server.port, "/", [], b"", 0.05)
    await whole(first)
    first.release()  # a request waits: the connection is closed, its slot given up
    second = await asyncio.wait_for(waiting, 5)
    assert await whole(second)
    second.release()
    assert keepalive_server.connections == 2
    assert len(pool._open) == 1  # nobody waits now: kept alive
    pool.close()


class Collect:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.ended: list[BaseException | None] = []

    def data(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def end(self, error: BaseException | None) -> None:
        self.ended.append(error)


async def test_pushing_hands_every_chunk_to_the_sink_and_pauses_on_request() -> None:
    server: Server
    sent = asyncio.Event()
    more = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(OK_CHUNKED + chunk(b"one"))
        await writer.drain()
        writer.write(chunk(b"two"))
        await writer.drain()
        await more.wait()
        writer.write(chunk(b"three") + b"0\r\n\r\n")
        await writer.drain()
        sent.set()
        await reader.read()

    async with Server(handler) as server:
        pool = WirePool(4)
        response = await post(pool, server)
        first = await response.read()
        response.unread(first)  # an opener's look at the first bytes is given back
        sink = Collect()
        response.push(sink)
        await eventually(lambda: b"".join(sink.chunks) == b"onetwo", within_s=5)
        response.pause()
        more.set()
        await asyncio.wait_for(sent.wait(), 5)
        await asyncio.sleep(0.05)  # what is measured: nothing arrives while paused
        assert b"".join(sink.chunks) == b"onetwo" and sink.ended == []
        response.resume()
        await eventually(lambda: sink.ended == [None], within_s=5)
        assert b"".join(sink.chunks) == b"onetwothree"
        response.release()
        pool.close()


async def test_a_push_is_ended_with_the_error_that_cut_it() -> None:
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(OK_CHUNKED + chunk(b"one"))
        await writer.drain()

    async with Server(handler) as server:
        pool = WirePool(4)
        response = await post(pool, server)
        sink = Collect()
        response.push(sink)
        await eventually(lambda: sink.ended, within_s=5)
        assert sink.chunks == [b"one"] and isinstance(sink.ended[0], WireError)
        pool.close()


def _self_signed(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    served = self_signed(tmp, "localhost")
    trusting = ssl.create_default_context(cafile=str(tmp / "cert.pem"))
    return served, trusting


async def test_https_engines_are_spoken_to_over_tls_and_verified(tmp_path: Path) -> None:
    served, trusting = _self_signed(tmp_path)
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.request(reader)
        writer.write(OK_CHUNKED + chunk(b"secret") + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with Server(handler, tls=served) as server:
        pool = WirePool(4, tls=trusting)
        response = await pool.post("https", "localhost", server.port, "/v1/x", [], b"{}", 5.0)
        assert await whole(response) == b"secret"
        response.release()
        pool.close()
        untrusting = WirePool(4)  # the system's trust store knows no such certificate
        with pytest.raises(ssl.SSLCertVerificationError):
            await untrusting.post("https", "localhost", server.port, "/v1/x", [], b"{}", 5.0)
        untrusting.close()


async def test_an_ipv6_engine_gets_a_bracketed_host() -> None:
    requests: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "::1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        pool = WirePool(4)
        response = await pool.post("http", "::1", port, "/v1/x", [], b"{}", 5.0)
        assert await whole(response) == b"ok"
        assert b"\r\nhost: [::1]:%d\r\n" % port in requests[0]
        pool.close()
    finally:
        server.close()


async def test_sent_runs_once_the_request_is_on_its_way_and_what_it_raises_closes_it() -> None:
    """The caller's work runs while the engine already has the request (here the server
    receives it while ``sent`` still runs), once, even when a stale connection makes the
    request go again; an error from it ends the request and closes the connection."""
    server: Server
    answered = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = server.connections == 1
        await server.request(reader)
        await answered.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        if first:  # the next request on it is read and not answered: a stale connection
            await server.request(reader)

    async with Server(handler) as server:
        pool = WirePool(4)
        runs: list[int] = []

        async def sent() -> None:
            await eventually(lambda: len(server.requests) > len(runs), within_s=5)
            runs.append(len(server.requests))
            answered.set()

        for _ in range(2):
            response = await pool.post("http", "127.0.0.1", server.port, "/v1/chat/completions",
                                       [], b"{}", 5.0, sent=sent)  # fmt: skip
            assert await whole(response) == b"ok"
            response.release()
        assert runs == [1, 2]  # the second request went twice (stale, then new): one run
        assert len(server.requests) == 3 and server.connections == 2

        class Refused(Exception):
            pass

        async def refuses() -> None:
            raise Refused

        answered.clear()
        with pytest.raises(Refused):
            await pool.post("http", "127.0.0.1", server.port, "/v1/chat/completions", [],
                            b"{}", 5.0, sent=refuses)  # fmt: skip
        await eventually(lambda: not pool._open, within_s=5)  # closed: the engine stops
        pool.close()
