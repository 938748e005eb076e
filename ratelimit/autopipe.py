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
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.asyncio import Redis

Command = tuple[Any, ...]


class AutoPipeline:
    def __init__(self, client: Redis) -> None:
        self.client = client
        self.round_trips = 0
        self._pending: list[tuple[Command, asyncio.Future[Any]]] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._closed = False

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return await self._queue(("EVALSHA", sha, numkeys, *keys_and_args))

    async def ping(self) -> Any:
        return await self._queue(("PING",))

    async def script_load(self, source: str) -> Any:
        return await self._queue(("SCRIPT LOAD", source))

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
            async with self.client.pipeline(transaction=False) as pipe:
                for command, _ in batch:
                    pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
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

    async def aclose(self) -> None:
        """Let the flushes in flight finish, then close the client; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._flushes, return_exceptions=True)
        await self.client.aclose()
