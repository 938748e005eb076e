"""Client disconnects and the streaming response.

``DisconnectWatcher`` is one task per request that waits on ``receive()`` (the body has been
read by then) and cancels the request's task the moment ``http.disconnect`` arrives: while
it waits for the upstream's first token, and while it relays (a hidden-reasoning client may
see no byte for minutes). Disconnects cancel, never poll. Whoever catches the cancellation
asks ``watcher.claim(exc)``: if it was the watcher's, it is taken back (``Task.uncancel``) and
the request ends quietly; any other cancellation (server shutdown) propagates.

``RelayResponse`` streams an async iterator of bytes and, whatever happens, calls
``cleanup(disconnected)`` once at the end, even when the body never started (a generator's
own ``finally`` does not run then).

Plain asyncio on purpose: an anyio task group and cancel scope per request cost more CPU than
the rest of the request's handling on Python 3.11 (each asks for the current task, a
``getpid()`` system call there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class DisconnectWatcher:
    def __init__(self, receive: Receive) -> None:
        self.disconnected = False
        self._owner = asyncio.current_task()
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        if self._owner is not None:
            self._owner.cancel()

    def claim(self, exc: asyncio.CancelledError) -> None:
        """Swallow ``exc`` if the watcher caused it, else re-raise it."""
        if not self.disconnected or self._owner is None:
            raise exc
        self._owner.uncancel()

    def stop(self) -> None:
        self._task.cancel()


class RelayResponse(Response):
    """A ``Response`` only so that frameworks pass it through untouched."""

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[bytes],
        watcher: DisconnectWatcher,
        cleanup: Callable[[bool], Awaitable[None]],
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            *((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers),
        ]
        self._body = body
        self._watcher = watcher
        self._cleanup = cleanup
        self._completed = False  # the whole body went out; a disconnect after it is normal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = False
        try:
            await self._stream(send)
        except asyncio.CancelledError as exc:
            self._watcher.claim(exc)
            disconnected = True
        except OSError:  # the server reports a closed connection this way (ASGI 2.4)
            disconnected = True
        finally:
            self._watcher.stop()
            await asyncio.shield(self._cleanup(disconnected and not self._completed))

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            async for chunk in self._body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            aclose = getattr(self._body, "aclose", None)
            if aclose is not None:
                await aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._completed = True
