"""thinkgate's own HTTP/1.1 client for upstream streams: the path every token takes.

Why not aiohttp here: its per-read path (parser → ``StreamReader.feed_data`` → a waiter future
→ a task step → ``readany``) costs as much CPU as everything else a bare relay does per token
(``bench/RESULTS.md``, "Protocol-level relay"). This client parses with ``httptools`` (the
parser uvicorn serves with) inside the connection's ``data_received`` and offers the body two
ways:

- ``read()``: pull, one awaitable per read, which returns everything that came meanwhile
  (the whole-response assembly, a client not served by uvicorn);
- ``push(sink)``: the body bytes of each socket read (however many chunks they frame) go to
  ``sink.data(chunk)`` from the read callback itself, and ``sink.end(error)`` once at the
  end: no task wakes per read. ``pause()``/``resume()``
  hold the upstream socket back while the client is slow (TCP backpressure to the engine).

What it does, and no more:

- ``POST`` with a ``content-length`` body; responses framed by ``content-length``, ``chunked``
  or the connection's end.
- Keep-alive connections reused per origin (scheme, host, port), at most ``limit`` open at
  once: a request waits for a slot under its connect timeout, and while one waits, a
  connection given back is closed to free its slot.
- A request sent on a reused connection that the engine had closed meanwhile is sent once
  more on a new one (nothing of it was answered).
- TLS for ``https`` engines, with the system's trust store.
- No redirects, cookies, proxies or compression: an engine gets none of them from a gateway.
- Errors are ``WireError`` (a malformed response, a connection lost before its end) and the
  ``OSError`` of connecting; ``gateway.upstream.pool.translate`` turns them into
  ``UpstreamError``.

``IdleWatch`` keeps ``IDLE_TIMEOUT_S`` per stream with one timer, not one per read.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, cast

import httptools

Headers = Sequence[tuple[bytes, bytes]]
_HIGH_WATER = 64 * 1024  # pull mode: bytes queued before the socket is paused
LINGER_S = 1.0  # a released response's last bytes, awaited before its connection is reused


class WireError(Exception):
    """The engine's response broke HTTP/1.1, or its connection ended before the response did."""


class Sink(Protocol):
    def data(self, chunk: bytes) -> None: ...

    def end(self, error: BaseException | None) -> None: ...


class IdleWatch:
    """``IDLE_TIMEOUT_S`` while a stream waits for the engine, without a timer per read. One
    timer per stream, due ``idle_s`` after the wait it was set for began; when it fires and the
    current wait is younger, it is set again for that wait; when the wait is as old as
    ``idle_s``, ``abort`` runs. ``since`` is when the current wait began, ``None`` while the
    gateway holds the engine back (a slow client): only waiting for the engine counts."""

    __slots__ = ("_abort", "_idle", "_loop", "_timer", "fired", "since")

    def __init__(self, idle_s: float, abort: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle = idle_s
        self._abort = abort
        self._timer: asyncio.TimerHandle | None = None
        self.since: float | None = None
        self.fired = False

    def waiting(self) -> None:
        self.since = now = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(now + self._idle, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.since is None:
            return  # not waiting now: the next wait sets the timer again
        due = self.since + self._idle
        if self._loop.time() >= due:
            self.fired = True
            self._abort()
        else:
            self._timer = self._loop.call_at(due, self._check)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine; one response at a time."""

    def __init__(self, pool: WirePool, origin: tuple[str, str, int]) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.response: WireResponse | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        response.received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost ends the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.forget(self)
        response, self.response = self.response, None
        if response is not None:
            response.connection_lost(exc)
            response.detach()

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.close()


class WireResponse:
    """The engine's response on one connection: status and headers first (``started``), then
    the body by ``read()`` or ``push(sink)``."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self._loop = asyncio.get_running_loop()
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._until_close = False
        self._keep_alive = False
        self.answered = False  # a byte of the response came
        self.complete = False  # the whole response came
        self.error: BaseException | None = None
        self._ended = False
        self._queued: collections.deque[bytes] = collections.deque()
        self._queued_bytes = 0
        self._batch: list[bytes] = []  # body chunks of the read being parsed, for the sink
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self.watch: IdleWatch | None = None
        self.started: asyncio.Future[None] = self._loop.create_future()
        self._released = False
        self._linger: asyncio.TimerHandle | None = None

    # -- the connection's callbacks ----------------------------------------------------------

    def received(self, data: bytes) -> None:
        self.answered = True
        watch = self.watch
        if watch is not None and watch.since is not None:
            watch.since = self._loop.time()
        parser = self._parser
        if parser is None:  # the response is over: bytes after it cannot be trusted
            self._connection.close()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # the sink's own failure
            self._fail(exc.__context__ or exc)
        except httptools.HttpParserError as exc:
            self._fail(WireError(f"the model server sent a malformed response ({exc})"))
        if self._batch:
            self._flush()  # one read, one hand-over: however many chunks it carried

    def detach(self) -> None:
        """Its connection is gone: the parser (which holds this response's callbacks) too."""
        self._parser = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.complete:
            return
        if self.started.done() and self._until_close:
            self.on_message_complete()  # the connection's end was the body's end
            return
        self._fail(WireError("the model server closed the connection unexpectedly"))

    # -- httptools' callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # a response whose connection is gone parses nothing more
        self.status = parser.get_status_code()
        names = {name for name, _ in self.headers}
        self._until_close = b"content-length" not in names and b"transfer-encoding" not in names
        self._keep_alive = parser.should_keep_alive()  # llhttp forgets it at the end
        if not self.started.done():
            self.started.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._sink is not None:
            self._batch.append(body)  # handed over once the read is parsed (``_flush``)
            return
        self._queued.append(body)
        self._queued_bytes += len(body)
        if self._queued_bytes > _HIGH_WATER and not self._paused:
            self.pause()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._end(None)
        if self._linger is not None:  # released while its end was on the way
            self._linger.cancel()
            self._dispose()

    # -- the body ----------------------------------------------------------------------------

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes:
        """The next body bytes as they came, ``b""`` at the end; raises what cut it short."""
        while not self._queued:
            if self._ended:
                if self.error is not None:
                    raise self.error
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._take_queued()
        if self._paused:
            self.resume()
        return chunk

    def unread(self, chunk: bytes) -> None:
        """Put ``chunk`` back in front of the body (the first bytes an opener looked at)."""
        self._queued.appendleft(chunk)
        self._queued_bytes += len(chunk)

    def push(self, sink: Sink) -> None:
        """From now on the body of every read goes to ``sink.data`` as it arrives (what was
        queued first, at once) and the end to ``sink.end``; ``unhook`` stops it."""
        self._sink = sink
        if self._queued:
            sink.data(self._take_queued())
        if self._sink is sink and self._ended:
            sink.end(self.error)
        elif self._paused and self._sink is sink:
            self.resume()

    def unhook(self) -> None:
        """Back to queueing: what comes after is kept for ``read()`` (or dropped at release)."""
        self._sink = None

    def abort(self, error: BaseException) -> None:
        """End the response with ``error`` and drop its connection."""
        self._fail(error)

    def release(self, ending: bool = False) -> None:
        """Idempotent: the connection back to its pool if the response was read to its end and
        the engine keeps it alive, else closed. ``ending``: the caller saw the body's last
        event (``[DONE]``), so only its framing is still on the way: the connection waits up
        to ``LINGER_S`` for it and then goes back to the pool (closing it instead would cost
        every stream a new connection; a stream cut short is closed at once, which tells the
        engine to stop generating)."""
        if self._released:
            return
        self._released = True
        self._sink = None
        self._unwatch()
        if self._paused:
            self.resume()
        if ending and not self._ended:
            self._linger = self._loop.call_later(LINGER_S, self._connection.close)
            return
        self._dispose()

    def _dispose(self) -> None:
        connection = self._connection
        connection.response = None
        self._parser = None  # it holds this response's callbacks: no cycle left to collect
        if self.complete and self._keep_alive and not self._until_close:
            connection.pool.put(connection)
        else:
            connection.close()

    # -- inside ------------------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        if self._ended:
            return
        self.error = error
        self._connection.close()
        if not self.started.done():
            self.started.set_exception(error)
            self.started.exception()  # retrieved: the opener may be gone (a timeout)
        self._end(error)

    def _take_queued(self) -> bytes:
        """Everything queued, as one piece (one read for the reader, one hand-over for a sink)."""
        queued = self._queued
        chunk = queued.popleft() if len(queued) == 1 else b"".join(queued)
        queued.clear()
        self._queued_bytes = 0
        return chunk

    def _flush(self) -> None:
        batch = self._batch
        chunk = batch[0] if len(batch) == 1 else b"".join(batch)
        batch.clear()
        if self._sink is not None:
            self._sink.data(chunk)
        else:  # unhooked meanwhile: kept for ``read()``
            self._queued.append(chunk)
            self._queued_bytes += len(chunk)

    def _end(self, error: BaseException | None) -> None:
        if self._ended:
            return
        if self._batch:
            self._flush()  # the body's last bytes before its end
        self._ended = True
        self._unwatch()
        sink = self._sink
        if sink is not None:
            self._sink = None
            sink.end(error)
        self._wake()

    def _unwatch(self) -> None:
        """The idle watch over: cancelled and dropped (its abort holds this response)."""
        watch, self.watch = self.watch, None
        if watch is not None:
            watch.cancel()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def pause(self) -> None:
        """Hold the engine back (a slow client, a full queue): not its idle time."""
        transport = self._connection.transport
        if not self._paused and transport is not None and not transport.is_closing():
            transport.pause_reading()
        self._paused = True
        if self.watch is not None:
            self.watch.since = None  # held back by the gateway: not the engine's idle time

    def resume(self) -> None:
        transport = self._connection.transport
        self._paused = False
        if transport is not None and not transport.is_closing():
            transport.resume_reading()
        if self.watch is not None and not self._ended:
            self.watch.waiting()


def _authority(scheme: str, host: str, port: int) -> bytes:
    """The ``host`` header: an IPv6 literal in brackets, the port unless the scheme's own."""
    name = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    return (name if port == default else f"{name}:{port}").encode("idna")


class WirePool:
    """Keep-alive connections per origin, at most ``limit`` open at once."""

    def __init__(self, limit: int, tls: ssl.SSLContext | None = None) -> None:
        """``tls``: the context for ``https`` engines (default: the system's trust store)."""
        self._slots = asyncio.Semaphore(limit)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._waiting = 0  # requests waiting for a slot
        self._tls = tls

    async def post(
        self, scheme: str, host: str, port: int, target: str, headers: Headers, body: bytes,
        connect_s: float, *, method: bytes = b"POST",
        sent: Callable[[], Awaitable[None]] | None = None,
    ) -> WireResponse:  # fmt: skip
        """Send the request (``method``: POST, or GET for a probe); return once the
        response's status and headers are in. ``connect_s`` bounds the wait for a slot and
        the connection. ``sent``: awaited once the request is first written, before its
        head is awaited (what it raises closes the connection)."""
        origin = (scheme, host, port)
        head = b"".join((
            method, b" ", target.encode("ascii"), b" HTTP/1.1\r\nhost: ",
            _authority(scheme, host, port), b"\r\n",
            *(b"%b: %b\r\n" % pair for pair in headers),
            b"content-length: %d\r\n\r\n" % len(body),
        ))  # fmt: skip
        request = head + body
        while True:
            connection = self._idle_connection(origin)
            reused = connection is not None
            if connection is None:
                async with asyncio.timeout(connect_s):
                    connection = await self._new_connection(origin)
            response = WireResponse(connection)
            connection.response = response
            assert connection.transport is not None
            connection.transport.write(request)
            try:
                if sent is not None:  # once, though a stale connection sends it again
                    step, sent = sent, None
                    await step()
                await response.started
            except WireError:
                response.release()
                if reused and not response.answered:
                    continue  # the engine closed it while it was idle: a new connection
                raise
            except BaseException:  # cancelled, timed out: the connection cannot be reused
                response.release()
                raise
            return response

    def _idle_connection(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            transport = connection.transport
            if not connection.lost and transport is not None and not transport.is_closing():
                return connection
        return None

    async def _new_connection(self, origin: tuple[str, str, int]) -> _Connection:
        if self._slots.locked():
            for others in self._idle.values():  # an idle connection elsewhere gives its slot
                if others:
                    others.pop(0).close()
                    break
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        scheme, host, port = origin
        tls = self._tls_context() if scheme == "https" else None
        connection = _Connection(self, origin)
        try:
            await asyncio.get_running_loop().create_connection(
                lambda: connection, host, port, ssl=tls, server_hostname=host if tls else None
            )
        except BaseException:
            self._slots.release()
            raise
        self._open.add(connection)
        return connection

    def put(self, connection: _Connection) -> None:
        if connection.lost:
            return
        if self._waiting:  # a request waits for a slot: this connection's is given up to it
            connection.close()
            return
        self._idle.setdefault(connection.origin, []).append(connection)

    def forget(self, connection: _Connection) -> None:
        """The connection is gone: its slot is free."""
        if connection in self._open:
            self._open.discard(connection)
            self._slots.release()
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)

    def close(self) -> None:
        for connection in list(self._open):
            connection.close()

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
