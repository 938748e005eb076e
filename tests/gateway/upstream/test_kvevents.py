"""The KV event feed over real ZMQ sockets, against the simulator's publisher (vLLM's wire
format): a subscriber that joins late catches up by replay, a restarted publisher (its count
back at 0) drops the engine's index."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import zmq.asyncio

from gateway.cache.blocks import prompt_keys
from gateway.cache.index import PrefixIndex
from gateway.cache.sources import Source
from gateway.side.sim.events import EventPublisher
from gateway.side.sim.prefix import PrefixCache
from gateway.upstream.kvevents import EventFeed
from tests.waiting import eventually

ENGINE = "http://engine:8000/v1"


def _store(cache: PrefixCache, ids: list[int]) -> list[dict[str, object]]:
    found = cache.lookup(ids, None)
    events = cache.acquire(found, ids, None)
    cache.release(found)
    return events


@contextlib.asynccontextmanager
async def _feed(publisher: EventPublisher, index: PrefixIndex) -> AsyncIterator[EventFeed]:
    context = zmq.asyncio.Context()
    source = Source(ENGINE, publisher.endpoint, publisher.replay_endpoint)
    feed = EventFeed(source, index, context)
    task = asyncio.create_task(feed.run())
    try:
        yield feed
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        context.destroy(linger=0)


async def test_a_late_subscriber_catches_up_by_replay() -> None:
    publisher = EventPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    cache, index = PrefixCache(1000, 4), PrefixIndex()
    early = list(range(40))
    try:
        publisher.publish(_store(cache, early))  # before anyone listens: only a replay has it
        async with _feed(publisher, index) as feed:
            later = [*early, *range(100, 120)]
            # the SUB socket joins asynchronously: publish until one batch gets through
            await eventually(lambda: _published(publisher, cache, later) or feed.batches >= 2)
            assert index.matched(ENGINE, prompt_keys(early, 4)) == 10  # from the replay
            assert index.engines[ENGINE].orphans == 0
    finally:
        await publisher.aclose()


def _published(publisher: EventPublisher, cache: PrefixCache, ids: list[int]) -> bool:
    publisher.publish(_store(cache, ids) or [{"type": "BlockRemoved", "block_hashes": [],
                                             "medium": "GPU"}])  # fmt: skip
    return False


async def test_a_publisher_counting_from_zero_again_drops_the_engines_index() -> None:
    """The engine restarts at the same address: its new count cannot continue the old one, so
    the old blocks go and the new ones are indexed."""
    first = EventPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    endpoint = first.endpoint
    cache, index = PrefixCache(1000, 4), PrefixIndex()
    old = list(range(8))
    async with _feed(first, index) as feed:
        await eventually(lambda: _published(first, cache, old) or feed.batches >= 2)
        assert index.matched(ENGINE, prompt_keys(old, 4)) == 2
        await first.aclose()  # the engine dies; a new one binds the same address
        second, fresh, new = EventPublisher(endpoint), PrefixCache(1000, 4), iter(range(10**6))
        stored: list[list[int]] = []

        def new_blocks_indexed() -> bool:
            if any(index.matched(ENGINE, prompt_keys(ids, 4)) == 1 for ids in stored):
                return True
            stored.append([next(new)] * 4)  # a prompt of its own each time: a new block
            second.publish(_store(fresh, stored[-1]))
            return False

        try:
            await eventually(new_blocks_indexed, within_s=20)
            assert index.matched(ENGINE, prompt_keys(old, 4)) == 0  # dropped
        finally:
            await second.aclose()


@pytest.mark.parametrize("frames", [[b"only"], [b"", b"\x00", b""], [b"", b"\x00" * 8, b"\xc1"]])
async def test_unreadable_messages_are_counted_and_skipped(frames: list[bytes]) -> None:
    index, context = PrefixIndex(), zmq.asyncio.Context()
    try:
        feed = EventFeed(Source(ENGINE, "tcp://127.0.0.1:1"), index, context)
        await feed.take(frames)
    finally:
        context.destroy(linger=0)
    assert feed.bad == 1 and index.size(ENGINE) == 0
