"""KV block accounting (pure) and the admission queue of ``SimState`` built on it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.side.sim.config import SimConfig
from gateway.side.sim.kv import KvBlocks
from gateway.side.sim.state import SimState


def test_reservations_are_whole_blocks() -> None:
    kv = KvBlocks(capacity_tokens=64, block_size=16)
    kv.reserve(1, 17)
    assert kv.used_blocks == 2
    assert kv.used_tokens == 32
    assert kv.usage == 0.5
    assert kv.grow(1, 32)
    assert kv.used_blocks == 2
    assert kv.grow(1, 33)
    assert kv.used_tokens == 48


def test_growth_beyond_free_blocks_is_refused_without_change() -> None:
    kv = KvBlocks(capacity_tokens=32, block_size=16)
    kv.reserve(1, 16)
    kv.reserve(2, 16)
    assert not kv.fits(1)
    assert not kv.grow(1, 17)
    assert kv.used_blocks == 2
    with pytest.raises(ValueError, match="cannot reserve"):
        kv.reserve(3, 1)


def test_a_request_larger_than_the_cache_runs_alone() -> None:
    kv = KvBlocks(capacity_tokens=32, block_size=16)
    assert kv.fits(1000)
    kv.reserve(1, 1000)
    assert kv.grow(1, 2000)
    assert kv.usage == 1.0
    assert not kv.fits(1)


def test_release_frees_blocks_once() -> None:
    kv = KvBlocks(capacity_tokens=32, block_size=16)
    kv.reserve(1, 20)
    assert kv.release(1)
    assert not kv.release(1)
    assert kv.used_blocks == 0
    assert kv.running == 0


def small_state(blocks: int) -> SimState:
    return SimState(SimConfig(kv_capacity_tokens=16 * blocks, block_size=16))


@pytest.mark.asyncio
async def test_requests_wait_in_fifo_order_until_blocks_free() -> None:
    state = small_state(1)
    first, second, third = [await state.open_request(10) for _ in range(3)]
    await state.admit(first, 10)
    waiting = [asyncio.create_task(state.admit(rid, 10)) for rid in (second, third)]
    await state.wait_for(lambda s: s.waiting == 2, timeout=2)
    await state.close_request(first, "completed")
    await waiting[0]
    assert state.running == 1
    assert state.waiting == 1
    await state.close_request(second, "completed")
    await waiting[1]
    assert (state.running, state.waiting, state.completed) == (1, 0, 2)


@pytest.mark.asyncio
async def test_a_request_that_cannot_grow_is_preempted_and_readmitted_first() -> None:
    state = small_state(2)
    grower, other, late = [await state.open_request(16) for _ in range(3)]
    await state.admit(grower, 16)
    await state.admit(other, 16)
    growing = asyncio.create_task(state.advance(grower, 17, 1))
    await state.wait_for(lambda s: s.preemptions_total == 1 and s.waiting == 1, timeout=2)
    late_admit = asyncio.create_task(state.admit(late, 16))
    await state.wait_for(lambda s: s.waiting == 2, timeout=2)
    await state.close_request(other, "completed")
    await growing
    assert state.kv_tokens_in_use == 32
    assert state.generation_tokens_total == 1
    assert not late_admit.done()
    late_admit.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late_admit
    assert state.waiting == 0


@pytest.mark.asyncio
async def test_cancelled_requests_are_counted_with_a_timestamp() -> None:
    state = small_state(4)
    rid = await state.open_request(5)
    await state.admit(rid, 5)
    await state.close_request(rid, "cancelled")
    assert state.cancelled == 1
    assert state.last_cancel_monotonic is not None
    assert state.kv_tokens_in_use == 0


@pytest.mark.asyncio
async def test_wait_for_times_out() -> None:
    state = small_state(1)
    with pytest.raises(TimeoutError):
        await state.wait_for(lambda s: s.completed == 1, timeout=0.01)


def test_fault_rates_are_seeded() -> None:
    config = SimConfig(error_rate=0.3, drop_rate=0.3, seed=5)
    rolls = [SimState(config).roll_fault() for _ in range(2)]
    assert rolls[0] == rolls[1]
    state = SimState(config)
    seen = {state.roll_fault() for _ in range(200)}
    assert seen == {"error", "drop", None}
    assert SimState(SimConfig()).roll_fault() is None
