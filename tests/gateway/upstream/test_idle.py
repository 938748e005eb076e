"""``IdleWatch``: the idle timeout counts only the time a stream waits for its next read, with
one timer per stream rather than one per read."""

from __future__ import annotations

import asyncio

from gateway.upstream.wire import IdleWatch
from tests.waiting import eventually


async def test_time_spent_writing_to_the_client_is_not_idle_time() -> None:
    aborted: list[int] = []
    watch = IdleWatch(0.05, lambda: aborted.append(1))
    watch.waiting()
    watch.since = None  # the read came at once
    await asyncio.sleep(0.12)  # what is measured: the relay busy elsewhere, past idle_s
    assert not watch.fired and aborted == []
    watch.waiting()  # now a wait that lasts
    await eventually(lambda: watch.fired, within_s=2)
    assert aborted == [1]


async def test_reads_that_keep_coming_never_fire_and_cost_one_timer() -> None:
    aborted: list[int] = []
    watch = IdleWatch(0.2, lambda: aborted.append(1))
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.5
    timers = set()
    while loop.time() < end:  # a read every 10 ms, for longer than idle_s
        watch.waiting()
        timers.add(id(watch._timer))
        await asyncio.sleep(0.01)
        watch.since = None
    assert not watch.fired and aborted == []
    assert len(timers) <= 4  # re-armed about once per idle_s, not once per read
    watch.cancel()
