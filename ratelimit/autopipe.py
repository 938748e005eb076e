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
  run on the server (as with any client).
- ``round_trips`` counts flushes: tests and benchmarks read it.
- One timeout (``timeout_s``) bounds a whole exchange: a Redis that hangs costs a request
  half a second, not one socket timeout per reply. A connection that failed mid-exchange is
  closed, never reused (its next reply would belong to another batch). Nothing is retried: a
  script whose reply was lost may have run, and the caller's fallback policy decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ResponseError

Command = tuple[Any, ...]


class AutoPipeline:
    def __init__(self, client: Redis, *, timeout_s: float = 0.5) -> None:
        self.client = client
        self._timeout_s = timeout_s
        self.round_trips = 0
        self._pending: list[tuple[Command, asyncio.Future[Any]]] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._closed = False

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return await self._queue(("EVALSHA", sha, numkeys, *keys_and_args))

    async def ping(self) -> Any:
        return await self._queue(("PING",))

    async def script_load(self, source: str) -> Any:
        return await self._queue(("SCRIPT", "LOAD", source))

    def _queue(self, command: Command) -> asyncio.Future[Any]:
        if self._closed:
            raise RuntimeError("the Redis client is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((command, future))
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._send(batch))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _send(self, batch: list[tuple[Command, asyncio.Future[Any]]]) -> None:
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
            await connection.send_packed_command(payload, check_health=False)
            return [await _reply(connection) for _ in range(count)]
        except BaseException:
            await connection.disconnect()  # half-read: its next reply would be someone else's
            raise
        finally:
            await pool.release(connection)

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


async def _reply(connection: AbstractConnection) -> Any:
    """The next reply; an error reply is returned (it is that command's), not raised. No
    timeout per reply (``math.inf``): the whole exchange has one."""
    try:
        return await connection.read_response(timeout=math.inf)
    except ResponseError as error:
        return error
