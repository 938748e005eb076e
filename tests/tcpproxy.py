"""A TCP proxy a test can cut and restore: how a real database "goes away" mid-run.

``stop()`` closes the listener and resets every live connection (the client sees what it would
see if PostgreSQL died or the network dropped); ``refuse_new()`` closes only the listener;
``start()`` listens again on the same port; ``tell_clients(data)`` sends every connected client
bytes of the server's making (a message PostgreSQL sends unasked, as it does when it stops).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import socket
import struct
import termios

import psutil

from tests.waiting import eventually


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a polite FIN: the peer sees the connection die."""
    if writer.transport.is_closing():
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _sockets(addresses: set[tuple[str, int]]) -> list[int]:
    """This process's TCP sockets bound to one of ``addresses`` (the clients' ends)."""
    return [c.fd for c in psutil.Process().net_connections("tcp")
            if c.laddr and (c.laddr.ip, c.laddr.port) in addresses and c.fd >= 0]  # fmt: skip


def _unread(fd: int) -> int:
    """Bytes received on socket ``fd`` that its owner has not read yet (``FIONREAD``)."""
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


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
        self._clients: set[asyncio.StreamWriter] = set()
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

    async def tell_clients(self, data: bytes) -> None:
        """Send ``data`` to every connected client, as if the server had sent it; return once
        each client of this process has read it (its socket holds no unread byte), so that a
        client that was idle took it while idle."""
        peers = set()
        for writer in list(self._clients):
            writer.write(data)
            await writer.drain()
            peers.add(tuple(writer.get_extra_info("peername")[:2]))
        await eventually(lambda: not any(_unread(fd) for fd in _sockets(peers)), within_s=5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio's own connection task ends at once; the relay is a task this proxy owns.
        relay = asyncio.create_task(self._relay(reader, writer))
        self._relays.add(relay)
        relay.add_done_callback(self._relays.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._live.add(writer)
        self._clients.add(writer)
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
            self._clients.discard(writer)
            writer.close()
