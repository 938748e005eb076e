"""A streaming ASGI response that races the body against the client's disconnect.

The body generator is cancelled the moment ``http.disconnect`` arrives, even while it waits
on the upstream and sends nothing (a hidden-reasoning client may see no byte for minutes),
so the upstream request is closed promptly: disconnects cancel, never poll. Whatever happens,
``cleanup(disconnected)`` runs once at the end, shielded, even if the body never started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class RelayResponse(Response):
    """A ``Response`` only so that FastAPI passes it through untouched."""

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[bytes],
        headers: Mapping[str, str],
        cleanup: Callable[[bool], Awaitable[None]],
    ) -> None:
        self.status_code = 200
        self.background = None
        self._body = body
        self._cleanup = cleanup
        self._start_headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
        ]
        self._start_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
        self.disconnected = False
        self._completed = False  # the whole body went out; a disconnect after it is normal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch, receive, group.cancel_scope)
                try:
                    await self._stream(send)
                except OSError:  # the server reports a closed connection this way (ASGI 2.4)
                    self.disconnected = True
                group.cancel_scope.cancel()
        finally:
            # Runs even when the body generator never started (its own ``finally`` would not).
            with anyio.CancelScope(shield=True):
                await self._cleanup(self.disconnected and not self._completed)

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self._start_headers})
        try:
            async for chunk in self._body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await self._aclose_body()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._completed = True

    async def _aclose_body(self) -> None:
        aclose = getattr(self._body, "aclose", None)
        if aclose is not None:
            with anyio.CancelScope(shield=True):
                await aclose()

    async def _watch(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                scope.cancel()
                return
