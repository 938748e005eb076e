"""Serving an ASGI app from inside a running event loop (the demo simulator, tests).

The listening socket is bound and put in listening state *before* uvicorn starts, so the port
is known at once and early connections wait in the kernel's backlog instead of being refused:
no start-up polling is needed.

An embedded server says nothing below a warning on uvicorn's logger (its "Started server
process", "Application startup complete", "Uvicorn running on" lines): they would repeat the
outer server's with the same PID and no label. Whoever embeds it logs what it is and where it
listens (the demo: "demo simulator (the upstream) on ..."). Its warnings and errors still pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
from collections.abc import Iterator
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp

_EMBEDDED: contextvars.ContextVar[bool] = contextvars.ContextVar("embedded", default=False)


class _QuietWhenEmbedded(logging.Filter):
    """Drops uvicorn's info lines logged from inside an embedded server's tasks."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not _EMBEDDED.get()


def _quiet_uvicorn() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietWhenEmbedded) for f in logger.filters):
        logger.addFilter(_QuietWhenEmbedded())


class _EmbeddedServer(uvicorn.Server):
    """Leaves signal handling to whoever owns the process (a test runner, the outer server),
    and stops as soon as it is asked.

    uvicorn's own server notices ``should_exit`` at its next tick (every 0.1 s), then waits
    0.1 s after asking its connections to close and looks again every 0.1 s: about 0.2 s for
    an idle server, 0.3 s for a test's gateway and simulator stopped one after the other,
    most of a short test. Here ``stop()`` wakes the loop at once, and the shutdown waits for
    the connections and tasks themselves, with uvicorn's steps in uvicorn's order (stop
    listening, shut each connection, wait for them within the graceful timeout, cancel what
    is left, then the lifespan's shutdown).
    """

    POLL_S = 0.005  # how often the shutdown looks at what is still open

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self.should_exit = True
        self._stopping.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # the date header, once a second
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await self._stopping.wait()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                while state.connections or state.tasks:  # noqa: ASYNC110 (no event: uvicorn's sets)
                    await asyncio.sleep(self.POLL_S)
                for server in self.servers:
                    await server.wait_closed()
        except TimeoutError:
            logging.getLogger("uvicorn.error").error(
                "Cancel %s running task(s), timeout graceful shutdown exceeded", len(state.tasks)
            )
            for task in state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()


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
        _quiet_uvicorn()
        context = contextvars.copy_context()
        context.run(_EMBEDDED.set, True)  # the server's tasks (lifespan too) inherit it
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), context=context)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stop()
        if self._task is not None:
            await self._task
        self._sock.close()
