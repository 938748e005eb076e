"""``python -m bench.pump --port P --upstream HOST:PORT``: the cheapest possible proxy.

A byte pump on uvloop protocols: each accepted connection gets one upstream connection, and
every read on one side is one write on the other, with no parsing at all. It is the floor of
any Python proxy on this machine: one ``read`` and one ``write`` system call per relayed read,
plus the event loop's wake-ups. The gateway's CPU per chunk is quoted against it.

Back-pressure: a side whose write buffer fills pauses reading on the other side (the
transports' flow-control callbacks), so a slow reader cannot make the pump buffer unboundedly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence
from typing import cast

import uvloop


class _Side(asyncio.Protocol):
    """One end of a pumped connection; ``peer`` is the other end's transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self._pending.append(data)  # the upstream connection is still being opened

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def pair(self, peer: _Side) -> None:
        self.peer, peer.peer = peer, self
        if peer.transport is not None:
            for data in self._pending:
                peer.transport.write(data)
        self._pending.clear()


async def serve(port: int, upstream_host: str, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()  # the loop keeps only weak references

    def accept() -> _Side:
        client = _Side()
        task = loop.create_task(_connect(client))
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    async def _connect(client: _Side) -> None:
        try:
            _, upstream = await loop.create_connection(_Side, upstream_host, upstream_port)
        except OSError:
            if client.transport is not None:
                client.transport.close()
            return
        client.pair(upstream)

    server = await loop.create_server(accept, "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pump", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, metavar="HOST:PORT")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.port, host, int(port)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
