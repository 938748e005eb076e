"""The export's cursor and lease (gateway/side/siem/cursor.py) on SQLite and PostgreSQL: one holder
at a time, takeover once a lease expires, a cursor only its holder moves, and only forward."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db import create_engine, upgrade_schema
from gateway.side.siem.cursor import ExportCursor
from tests.clock import FakeClock

LEASE_S = 30.0


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    made = create_engine(database_url)
    await upgrade_schema(made)
    try:
        yield made
    finally:
        await made.dispose()


def replica(engine: AsyncEngine, name: str, clock: FakeClock) -> ExportCursor:
    return ExportCursor(engine, name, LEASE_S, clock=clock)


async def test_the_first_claim_starts_at_zero_and_excludes_other_replicas(
    engine: AsyncEngine,
) -> None:
    clock = FakeClock()
    a, b = replica(engine, "a", clock), replica(engine, "b", clock)
    assert await a.position() is None
    assert await a.claim() == 0
    assert await b.claim() is None
    clock.now += LEASE_S - 1
    assert await a.claim() == 0  # renewed: a holds it until now + LEASE_S
    clock.now += LEASE_S - 1
    assert await b.claim() is None
    assert await a.position() == (0, "a", clock.now + 1)


async def test_an_expired_lease_is_taken_over_where_the_cursor_stands(engine: AsyncEngine) -> None:
    clock = FakeClock()
    a, b = replica(engine, "a", clock), replica(engine, "b", clock)
    assert await a.claim() == 0
    assert await a.advance(0, 500)
    clock.now += LEASE_S + 0.5  # a stalled (or died) without renewing
    assert await b.claim() == 500
    assert not await a.advance(500, 1000)  # the stalled holder can no longer move it
    assert await a.claim() is None
    assert await b.advance(500, 1000)
    assert (await b.position() or (0,))[0] == 1000


async def test_the_cursor_moves_only_from_where_it_is(engine: AsyncEngine) -> None:
    a = replica(engine, "a", FakeClock())
    assert await a.claim() == 0
    assert await a.advance(0, 10)
    assert not await a.advance(0, 20)  # a stale view of the cursor
    assert await a.advance(10, 20)
    assert await a.claim() == 20


async def test_a_released_lease_is_free_at_once(engine: AsyncEngine) -> None:
    clock = FakeClock()
    a, b = replica(engine, "a", clock), replica(engine, "b", clock)
    assert await a.claim() == 0
    await a.advance(0, 7)
    await b.release()  # not the holder: changes nothing
    assert await b.claim() is None
    await a.release()
    assert await b.claim() == 7
    assert await a.claim() is None


async def test_replicas_racing_for_a_new_export_elect_exactly_one(engine: AsyncEngine) -> None:
    clock = FakeClock()
    cursors = [replica(engine, f"r{i}", clock) for i in range(6)]
    won = await asyncio.gather(*(c.claim() for c in cursors))
    assert sorted(won, key=lambda w: w is None) == [0] + [None] * 5
    won = await asyncio.gather(*(c.claim() for c in cursors))  # and it stays with the winner
    assert won.count(0) == 1
