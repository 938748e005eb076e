"""Auto-pipelining for the Redis scripts of the request path.

Every command issued during one turn of the event loop goes out in one pipeline: one write and
one round trip for all of them, like ioredis's ``enableAutoPipelining``. A request's rate-limit
script and its KV-budget script, issued together, cost one round trip; so do its refund and its
release; and under load, the commands of many concurrent requests share round trips (fewer
system calls, and Redis reads them in one go).

Rules:

- A pipeline here is not a transaction: each script is atomic by itself, and nothing else is
  promised about commands that happen to share a flush.
- Each command gets its own reply or its own error (``NOSCRIPT`` included, so
  ``ratelimit.luascript`` can load the script and retry that command alone). A failure of the
  whole pipeline (connection lost) is every waiting command's error.
- A caller cancelled while its command is in flight just stops waiting; the command may still
  run on the server (as with any client); ``drained`` waits until it has.
- ``round_trips`` counts flushes (a batch sent again counts once), ``retries`` the batches sent
  again: tests and benchmarks read them.
- One timeout (``timeout_s``) bounds a whole exchange, a retry included: a Redis that hangs
  costs a request half a second, not one socket timeout per reply. A connection that failed
  mid-exchange is closed, never reused (its next reply would belong to another batch).

Retry: a batch is sent again, once, on a newly made connection, when all of these hold: its
connection came from the pool already connected (the socket carried an earlier exchange: it was
not made for this one), the connection was lost (redis-py's ``ConnectionError`` itself or an
``OSError``: not a timeout, and not an error reply such as ``LOADING``), and no reply of the
batch had been read. That is a pooled socket whose server went away while it sat idle: a Redis
restart, or a server or proxy that closed an idle connection. redis-py's pool looks for a
closed socket when it hands one out (how depends on its version and on what it negotiated with
the server: some skip the check with maintenance notifications on), but a socket whose server
is gone behind a proxy, a NAT or a load balancer that kept it open looks alive at checkout and
is found dead only by using it; without the retry each one failed a batch, and tripped the
circuit (``gateway.admission.circuit``) again after Redis was back.

Why a script cannot run twice in that case: the server the stale socket talked to is gone, so
the batch never reached it (or, if it died between running the batch and replying, its effects
died with it: a restarted Redis without persistence starts empty); the batch runs once, on the
server that answers now. What remains possible otherwise: when a connection to a live server
is cut after the batch reached it (``CLIENT KILL``, a proxy, a server that persisted the
batch's writes and then died), the batch runs twice, as with any client that retries. The
scripts keep that harmless or bounded: a KV admission with the same lease id does not book
twice, releases and renewals are idempotent, a refund never fills a bucket beyond full, and a
rate-limit reservation counts one request twice. Never retried: a timeout (the server may be
running the batch right now), a batch some of whose replies were read (the rest may have run
too), a batch on a socket made for it (a server that accepts and then fails is a real outage).

A socket found dead means its server is gone, and most likely so is the server of every socket
made before it: those are made again at their next checkout rather than each failing a batch in
turn (closing the pool's idle sockets at once instead would race with a checkout in progress:
a batch already sent on one could then be retried after reaching a live server).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import weakref
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

Command = tuple[Any, ...]


@dataclass(slots=True)
class _Socket:
    """What this pipeline knows of a connection's current socket."""

    epoch: int  # the pipeline's epoch when it was made (see ``AutoPipeline._epoch``)
    used: bool = False  # it carried an exchange already: it came from the pool connected


class AutoPipeline:
    def __init__(self, client: Redis, *, timeout_s: float = 0.5) -> None:
        self.client = client
        self._timeout_s = timeout_s
        self.round_trips = 0
        self.retries = 0
        # Bumped whenever a pooled socket is found dead: sockets made in an earlier epoch are
        # made again before their next use (they most likely talk to the same dead server).
        self._epoch = 0
        self._sockets: weakref.WeakKeyDictionary[AbstractConnection, _Socket] = (
            weakref.WeakKeyDictionary()
        )
        self._pending: list[tuple[Command, asyncio.Future[Any]]] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._closed = False

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return await self._queue(("EVALSHA", sha, numkeys, *keys_and_args))

    async def ping(self) -> Any:
        return await self._queue(("PING",))

    async def script_load(self, source: str) -> Any:
        return await self._queue(("SCRIPT", "LOAD", source))

    async def drained(self) -> None:
        """Until every command queued so far has had its reply (or its batch failed): a
        caller cancelled while its command was in flight learns when it has run. (A ``PING``
        rides in the batch not sent yet; the batches in flight are awaited.)"""
        waiting: list[Any] = list(self._flushes)
        if self._pending:
            waiting.append(self._queue(("PING",)))
        await asyncio.gather(*waiting, return_exceptions=True)

    def _queue(self, command: Command) -> asyncio.Future[Any]:
        if self._closed:
            raise RuntimeError("the Redis client is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self._pending:  # the flush: its task's first step runs on the loop's next turn
            task = asyncio.ensure_future(self._send())
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        self._pending.append((command, future))
        return future

    async def _send(self) -> None:
        """Send what was queued until this task's first step (the loop's turn after the
        first command of the batch): one write, one round trip."""
        batch, self._pending = self._pending, []
        self.round_trips += 1
        try:
            async with asyncio.timeout(self._timeout_s):
                replies = await self._exchange(b"".join(pack(c) for c, _ in batch), len(batch))
        except Exception as exc:  # the whole batch failed: each caller gets the error
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:  # cancelled (shutdown): so are its callers
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _exchange(self, payload: bytes, count: int) -> list[Any]:
        """One write, ``count`` replies, on a pooled connection (redis-py's: it connects,
        authenticates, selects the database and speaks TLS; hiredis parses)."""
        pool = self.client.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            return await self._exchange_on(connection, payload, count)
        except BaseException:
            await connection.disconnect()  # half-read: its next reply would be someone else's
            raise
        finally:
            await pool.release(connection)

    async def _exchange_on(
        self, connection: AbstractConnection, payload: bytes, count: int
    ) -> list[Any]:
        """The exchange, sent again once on a new socket when the rule of the module
        docstring allows it."""
        pooled = await self._checked_out(connection)
        replies: list[Any] = []
        try:
            await _round_trip(connection, payload, count, replies)
        except Exception as exc:
            if pooled is None or replies or not _lost(exc):
                raise
            self.retries += 1
            if pooled.epoch == self._epoch:  # its server is gone: so is every older socket's
                self._epoch += 1
            await _reconnect(connection)
            self._sockets[connection].used = True
            await _round_trip(connection, payload, count, replies)
        return replies

    async def _checked_out(self, connection: AbstractConnection) -> _Socket | None:
        """``connection``'s socket if it came from the pool already connected (it carried an
        earlier exchange here), ``None`` if it was made for this one; a socket older than the
        last one found dead is made again first."""
        socket = self._sockets.get(connection)
        if socket is None:  # first seen: the pool made it for this checkout
            connection.register_connect_callback(self._connected)  # type: ignore[no-untyped-call]
            socket = self._sockets[connection] = _Socket(self._epoch)
        elif socket.epoch < self._epoch:
            await _reconnect(connection)
            socket = self._sockets[connection]
        pooled = socket.used
        socket.used = True
        return socket if pooled else None

    def _connected(self, connection: AbstractConnection) -> None:
        """redis-py's connect callback: a new socket (the pool's, a reconnect's)."""
        self._sockets[connection] = _Socket(self._epoch)

    async def aclose(self) -> None:
        """Let the flushes in flight finish, then close the client; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._flushes, return_exceptions=True)
        await self.client.aclose()


def pack(command: Command) -> bytes:
    """A command in RESP, the Redis protocol: ``*<n>`` then ``$<len>`` and the bytes of each
    argument. (redis-py's general packer spent ~50 µs a script call here: most of the client's
    CPU per request.)"""
    out = [b"*%d\r\n" % len(command)]
    for arg in command:
        kind = type(arg)
        if kind is str:
            data = arg.encode()
        elif kind is bytes:
            data = arg
        elif kind is int:
            data = b"%d" % arg
        else:
            raise TypeError(f"a Redis argument must be bytes, str or int, not {kind.__name__}")
        out += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(out)


async def _round_trip(
    connection: AbstractConnection, payload: bytes, count: int, replies: list[Any]
) -> None:
    """Write ``payload``, then read ``count`` replies into ``replies`` as they come (what was
    read before a failure is what decides a retry)."""
    await connection.send_packed_command(payload, check_health=False)
    for _ in range(count):
        replies.append(await _reply(connection))


async def _reconnect(connection: AbstractConnection) -> None:
    """A new socket for ``connection`` (handshake included)."""
    await connection.disconnect()
    await connection.connect()  # type: ignore[no-untyped-call]


def _lost(exc: Exception) -> bool:
    """Whether ``exc`` says the connection was lost: redis-py's ``ConnectionError`` itself
    (its subclasses are error replies of a live server: ``LOADING``, authentication) or an
    ``OSError`` that is not a timeout."""
    if type(exc) is RedisConnectionError:
        return True
    return isinstance(exc, OSError) and not isinstance(exc, TimeoutError)


async def _reply(connection: AbstractConnection) -> Any:
    """The next reply; an error reply is returned (it is that command's), not raised. No
    timeout per reply (``math.inf``): the whole exchange has one."""
    try:
        return await connection.read_response(timeout=math.inf)
    except ResponseError as error:
        return error
