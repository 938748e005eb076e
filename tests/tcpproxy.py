"""A TCP proxy a test can cut and restore: how a real database "goes away" mid-run.

``stop()`` closes the listener and resets every live connection (the client sees what it would
see if PostgreSQL died or the network dropped); ``refuse_new()`` closes only the listener;
``start()`` listens again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a polite FIN: the peer sees the connection die."""
    if writer.transport.is_closing():
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()


class TcpProxy:
    """Relays 127.0.0.1:``port`` to ``upstream``; ``stop``/``start`` take the database away
    and bring it back on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._live: set[asyncio.StreamWriter] = set()
        self._relays: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        assert self._server is None, "already listening"
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def __aenter__(self) -> TcpProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.running:
            await self.stop()

    async def refuse_new(self) -> None:
        """Close the listener only: live connections go on working (a database at its
        connection limit, or a network that drops new connections)."""
        server, self._server = self._server, None
        assert server is not None, "not listening"
        server.close()
        await server.wait_closed()

    async def stop(self) -> None:
        """Refuse new connections and reset every live one, in both directions."""
        await self.refuse_new()
        for writer in list(self._live):
            _reset(writer)
        relays = list(self._relays)
        for relay in relays:
            relay.cancel()
        await asyncio.gather(*relays, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio's own connection task ends at once; the relay is a task this proxy owns.
        relay = asyncio.create_task(self._relay(reader, writer))
        self._relays.add(relay)
        relay.add_done_callback(self._relays.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._live.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self._upstream)
            except OSError:
                return
            self._live.add(up_writer)
            pumps = [
                asyncio.create_task(_pump(reader, up_writer)),
                asyncio.create_task(_pump(up_reader, writer)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                self._live.discard(up_writer)
                up_writer.close()
        finally:
            self._live.discard(writer)
            writer.close()
