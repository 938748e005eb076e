"""Each engine's KV events, subscribed to (the I/O of ``gateway.cache``).

Where an engine publishes: ``UPSTREAM_KV_EVENTS`` when it names endpoints, else the engine's
own answer to ``GET /kv_event_sources`` (vLLM 0.32: its publisher's configuration per data
parallel rank, the endpoint as the engine bound it). A ``*`` (or ``0.0.0.0``) host in a bound
endpoint is the engine's host as ``UPSTREAMS`` names it; a named host (vLLM resolves
``tcp://*:0`` to the node's address and the port it got) is subscribed to as named. vLLM's
connect mode (the engine connects to a consumer that binds) is not supported: every gateway
replica must receive every event, and one address cannot be bound by them all
(docs/routing.md).

One ``EventFeed`` per source: a ZMQ SUB socket, the sequence kept in order
(``gateway.cache.sequence``), a gap filled from the replay endpoint (a DEALER socket asking
from the first missing number; vLLM answers every batch it still holds from there and an end
marker), a restart (the count going back) dropping the engine's part of the index. ZMQ
reconnects by itself when an engine comes back at the same address.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from gateway.cache.events import END_OF_REPLAY, BadEvents, decode, sequence_of
from gateway.cache.index import PrefixIndex
from gateway.cache.sequence import EventOrder
from gateway.cache.sources import Source

log = logging.getLogger("thinkgate")

REPLAY_TIMEOUT_S = 2.0  # the longest wait for a replay's next message


@dataclass(slots=True)
class EventFeed:
    source: Source
    index: PrefixIndex
    context: zmq.asyncio.Context
    clock: Callable[[], float] = time.monotonic
    order: EventOrder = field(default_factory=EventOrder)
    last_event_at: float = field(default=0.0)
    batches: int = 0  # applied
    bad: int = 0  # messages that could not be read

    async def run(self) -> None:
        sub = self.context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic)
        sub.connect(self.source.endpoint)
        self.last_event_at = self.clock()
        try:
            while True:
                await self.take(await sub.recv_multipart())
        finally:
            sub.close(0)

    async def take(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self.bad += 1
            return
        try:
            sequence = sequence_of(frames[1])
        except BadEvents:
            self.bad += 1
            return
        step = self.order.step(sequence)
        if step == "old":
            return
        if step == "restart":
            log.info("the KV events of %s started again: its index is dropped", self.source.engine)
            self.forget()
            step = self.order.step(sequence)
        if step == "replay":
            await self._catch_up()
            if self.order.last is not None and sequence <= self.order.last:
                return
        self.apply(sequence, frames[2])

    async def _catch_up(self) -> None:
        """Fill the gap before a message; when it cannot be filled (no replay endpoint, no
        answer, the engine's buffer moved on, or it restarted and counts again), what the
        index holds may no longer be so: start over from what comes."""
        start, joining = self.order.missing_from(), self.order.last is None
        first = await self.replay(start)
        if first != start and not joining:
            log.warning("a gap in the KV events of %s could not be filled: its index is "
                        "dropped and built again from what comes", self.source.engine)  # fmt: skip
            self.forget()

    def forget(self) -> None:
        """Drop the engine's index and the count (it restarted, or left rotation)."""
        self.index.drop(self.source.engine)
        self.order.reset()

    def apply(self, sequence: int, payload: bytes, *, replay: bool = False) -> None:
        try:
            events = decode(payload)
        except BadEvents:
            self.bad += 1
            self.index.drop(self.source.engine)  # what follows may hang off lost blocks
        else:
            self.index.apply(self.source.engine, events)
            self.batches += 1
        self.order.applied(sequence, replay=replay)
        self.last_event_at = self.clock()

    async def replay(self, start: int) -> int | None:
        """Apply what the engine still holds from ``start`` on; the first number it sent
        (``None``: nothing, or no replay endpoint)."""
        first = None
        if self.source.replay is None:
            return first
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.source.replay)
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                async with asyncio.timeout(REPLAY_TIMEOUT_S):
                    frames = await dealer.recv_multipart()
                if len(frames) != 4:
                    self.bad += 1
                    continue
                sequence = sequence_of(frames[2])
                if sequence == END_OF_REPLAY:
                    return first
                first = sequence if first is None else first
                if self.order.last is None or sequence > self.order.last:
                    self.apply(sequence, frames[3], replay=True)
        except (TimeoutError, BadEvents, zmq.ZMQError) as exc:
            log.warning("the KV events replay of %s failed (%s): blocks stored meanwhile are "
                        "not indexed", self.source.engine, type(exc).__name__)  # fmt: skip
        finally:
            dealer.close(0)
        return first
