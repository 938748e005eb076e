"""The simulator's KV events, published as vLLM publishes them (``vllm.distributed.kv_events``).

A ZMQ PUB socket bound at ``--kv-events`` sends ``(topic, sequence, payload)``: the topic empty,
the sequence 8 bytes big-endian from 0, the payload msgpack ``[ts, events, 0]`` with vLLM 0.32's
event maps (``gateway.side.sim.prefix``). A ROUTER socket bound at ``--kv-events-replay``
answers a request ``(identity, "", start)`` with every buffered batch from ``start`` and an end
marker of sequence -1, as vLLM's does. A ``:0`` port binds any free one; ``sources()`` says
which, in the shape of vLLM's ``GET /kv_event_sources``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from typing import Any

import msgpack
import zmq
import zmq.asyncio

END = (-1).to_bytes(8, "big", signed=True)
BUFFER_STEPS = 10_000


class EventPublisher:
    def __init__(self, endpoint: str, replay: str | None = None) -> None:
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self.endpoint = _bind(self._pub, endpoint)
        self._router = None
        self.replay_endpoint = None
        if replay is not None:
            self._router = self._context.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self.replay_endpoint = _bind(self._router, replay)
        self._sequence = itertools.count()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=BUFFER_STEPS)
        self._replaying: asyncio.Task[None] | None = None

    def sources(self) -> dict[str, Any]:
        return {"0": {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                      "buffer_steps": BUFFER_STEPS, "hwm": 100_000, "topic": ""}}  # fmt: skip

    def publish(self, events: list[dict[str, Any]]) -> None:
        """One batch, now (a PUB socket never blocks: past its high-water mark it drops)."""
        if not events:
            return
        if self._router is not None and self._replaying is None:
            self._replaying = asyncio.get_running_loop().create_task(self._serve_replays())
        sequence = next(self._sequence)
        payload = msgpack.packb([time.time(), events, 0])
        self._buffer.append((sequence, payload))
        self._pub.send_multipart([b"", sequence.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)

    async def _serve_replays(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                continue
            who, _, start = frames
            first = int.from_bytes(start, "big")
            for sequence, payload in list(self._buffer):
                if sequence >= first:
                    await self._router.send_multipart(
                        [who, b"", b"", sequence.to_bytes(8, "big"), payload]
                    )
            await self._router.send_multipart([who, b"", b"", END, b""])

    async def aclose(self) -> None:
        if self._replaying is not None:
            self._replaying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replaying
        self._context.destroy(linger=0)


def _bind(socket: zmq.asyncio.Socket, endpoint: str) -> str:
    """Bind; a ``:0`` port takes any free one, and the endpoint then names it."""
    if endpoint.endswith(":0"):
        port = socket.bind_to_random_port(endpoint[: -len(":0")])
        return f"{endpoint[: -len(':0')]}:{port}"
    socket.bind(endpoint)
    return endpoint
