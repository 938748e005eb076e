"""Destroying keys is a barrier (``audit.datakeys``): a cached sealing key lives
``ACTIVE_TTL_S`` from the moment the read that found it began, a caller never joins a read
that began longer ago, and ``shred``/``destroy`` return only once that time has passed since
they committed. The clock and the sleep are the test's, so nothing here waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from audit import migrate
from audit.crypto import FileKeyProvider
from audit.datakeys import ACTIVE_TTL_S, BARRIER_MARGIN_S, DataKeys
from gateway.db import create_engine
from tests.clock import FakeClock
from tests.waiting import eventually

DAY = 1_767_225_600.0  # 2026-01-01, the wall clock of every record here


class Keys:
    """``DataKeys`` on a fresh SQLite database, its clock, its sleeps, and its reads counted
    (``slow_s``: how far the clock moves while a read runs; ``gate``: a read waits for it)."""

    def __init__(self, engine: Any, key_file: Path) -> None:
        self.clock = FakeClock(0.0)
        self.slept: list[float] = []
        self.reads = 0
        self.slow_s = 0.0
        self.gate: asyncio.Event | None = None
        self.keys = DataKeys(engine, FileKeyProvider.load(key_file), clock=self.clock,
                             wall=lambda: DAY, sleep=self._sleep)  # fmt: skip
        real = self.keys._load_or_create

        async def counted(tenant: str, period: str) -> tuple[str, bytes]:
            self.reads += 1
            self.clock.now += self.slow_s  # the read takes this long
            if self.gate is not None:
                await self.gate.wait()
            return await real(tenant, period)

        self.keys._load_or_create = counted  # type: ignore[method-assign]

    async def _sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.now += seconds


@pytest.fixture
async def keys(tmp_path: Path) -> AsyncIterator[Keys]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'k.db'}")
    try:
        await migrate.upgrade(engine)
        FileKeyProvider.create(tmp_path / "keys.json")
        yield Keys(engine, tmp_path / "keys.json")
    finally:
        await engine.dispose()


async def test_a_cached_key_lives_from_when_its_read_began_not_when_it_ended(keys: Keys) -> None:
    keys.slow_s = 0.8  # a slow database: the answer comes 0.8 s after the read began
    first = await keys.keys.for_sealing("acme")
    keys.slow_s = 0.0
    keys.clock.now += ACTIVE_TTL_S - 0.8 - 0.01
    assert await keys.keys.for_sealing("acme") == first and keys.reads == 1  # still young
    keys.clock.now += 0.02  # ACTIVE_TTL_S since the read began (not since it ended)
    assert await keys.keys.for_sealing("acme") == first  # the same live key, read again
    assert keys.reads == 2


async def test_a_caller_never_joins_a_read_that_began_too_long_ago(keys: Keys) -> None:
    existing, _ = await keys.keys.for_sealing("acme")  # the tenant's key, made
    keys.clock.now += ACTIVE_TTL_S  # and no longer cached
    keys.gate = asyncio.Event()  # the next read hangs on the database
    old = asyncio.ensure_future(keys.keys.for_sealing("acme"))
    await eventually(lambda: keys.reads == 2)  # it began
    joined = asyncio.ensure_future(keys.keys.for_sealing("acme"))
    keys.clock.now += ACTIVE_TTL_S - 0.01
    also = asyncio.ensure_future(keys.keys.for_sealing("acme"))
    keys.clock.now += 0.01
    fresh = asyncio.ensure_future(keys.keys.for_sealing("acme"))
    await eventually(lambda: keys.reads == 3)  # too old to join: a read of its own
    assert not joined.done() and not also.done()
    keys.gate.set()
    assert {(await t)[0] for t in (old, joined, also, fresh)} == {existing}
    assert keys.reads == 3  # the burst before the new read shared the old one


async def test_a_shred_returns_once_no_cached_key_can_be_used_and_new_records_get_a_new_key(
    keys: Keys,
) -> None:
    before, _ = await keys.keys.for_sealing("acme")
    assert await keys.keys.shred("acme", DAY) == 1
    assert keys.slept == [pytest.approx(ACTIVE_TTL_S + BARRIER_MARGIN_S)]
    after, _ = await keys.keys.for_sealing("acme")
    assert after != before and await keys.keys.opening(before) is None
    assert await keys.keys.opening(after) is not None
    assert await keys.keys.shred("nobody", DAY) == 0 and len(keys.slept) == 1  # no wait


async def test_retention_destroying_keys_waits_too_and_drops_them_from_the_cache(
    keys: Keys,
) -> None:
    dek_id, _ = await keys.keys.for_sealing("acme")
    assert await keys.keys.destroy([dek_id], DAY) == [dek_id]
    assert keys.slept == [pytest.approx(ACTIVE_TTL_S + BARRIER_MARGIN_S)]
    assert (await keys.keys.for_sealing("acme"))[0] != dek_id
    assert await keys.keys.destroy([dek_id], DAY) == [] and len(keys.slept) == 1
