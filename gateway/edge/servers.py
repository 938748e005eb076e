"""Serving an ASGI app from inside a running event loop (the demo simulator, tests).

The listening socket is bound and put in listening state *before* uvicorn starts, so the port
is known at once and early connections wait in the kernel's backlog instead of being refused:
no start-up polling is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp


class _EmbeddedServer(uvicorn.Server):
    """Leaves signal handling to whoever owns the process (a test runner, the outer server)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class BackgroundServer:
    """``async with BackgroundServer(app) as server: server.url``; stopped on exit."""

    def __init__(
        self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0, *, reuse_port: bool = False
    ) -> None:
        """``reuse_port``: several processes may listen on the one port (each ``--workers``
        process serves the metrics port; the kernel spreads connections between them)."""
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the
        # listener says it is TCP; without it Nagle and delayed ACKs add ~40 ms per response.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._sock.bind((host, port))
        self._sock.listen(2048)
        self._sock.setblocking(False)
        self.host, self.port = self._sock.getsockname()[:2]
        # log_config=None: an embedded server must not reconfigure the process's logging.
        config = uvicorn.Config(
            app, log_config=None, lifespan="on", access_log=False, timeout_graceful_shutdown=2
        )
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def open_connections(self) -> int:
        """Client connections open right now (keep-alive ones included)."""
        return len(self._server.server_state.connections)

    async def __aenter__(self) -> BackgroundServer:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self._sock.close()
