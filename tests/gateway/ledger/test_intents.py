"""The gateway's side of write-ahead intents (``gateway.ledger.intents``): which progress a
beat reports, which ended exchanges the sweep must still leave alone, and a round against a
ledger whose database is away (logged once, its reports repeated when it is back)."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest
from sqlalchemy import select

from audit.intents import Progress
from audit.schema import intents
from gateway.ledger.intents import Cadence, Due, Running, keep_once
from tests.audit.conftest import LedgerFactory, ledger_factory  # noqa: F401 - the fixture
from tests.audit.test_intents import asked, started
from tests.clock import FakeClock


def test_a_beat_reports_only_the_progress_that_moved() -> None:
    running, figures = Running(), {"a": 0}
    running.add("a", lambda: Progress("u", 1.0, 3, figures["a"], 0, at=figures["a"] + 100.0))
    assert set(running.changed()) == {"a"}
    assert running.changed() == {}  # the same figures, a later report time: nothing to tell
    figures["a"] = 5
    assert running.changed()["a"].completion_tokens == 5
    running.untold({"a": Progress()})  # that report was lost: told again
    assert set(running.changed()) == {"a"}


def test_an_ended_exchange_is_held_for_the_grace_time_then_forgotten() -> None:
    clock = FakeClock()
    running = Running(grace_s=30.0, clock=clock)
    running.add("a", Progress)
    assert "a" in running and len(running) == 1
    running.discard("a")
    assert "a" in running and len(running) == 0  # its record may still be queued
    clock.now += 29.0
    running.discard("b")
    assert "a" in running and "b" in running
    clock.now += 2.0  # a's grace is over, not b's
    running.discard("c")
    assert "a" not in running and "b" in running and "c" in running


async def test_a_round_with_the_database_away_is_logged_once_and_repeats_its_reports(
    ledger_factory: LedgerFactory,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    ledger = await ledger_factory.open(url)
    intent_id, durable = await ledger.intend(started("r-1"), asked("r-1"))
    await ledger.confirm(durable)
    running = Running()
    running.add(intent_id, lambda: Progress("http://engine/v1", 2.0, 1, 7, 3, 9.0))
    engine = ledger_factory.engine(url)
    async with engine.begin() as conn:
        await conn.exec_driver_sql("ALTER TABLE ledger_replicas RENAME TO away")
    failing = [False]
    caplog.set_level(logging.WARNING, "thinkgate.ledger")
    assert await keep_once(ledger, running, 30.0, failing) == []
    assert await keep_once(ledger, running, 30.0, failing) == []
    assert failing == [True]
    assert len([r for r in caplog.records if "heartbeat" in r.getMessage()]) == 1
    async with engine.begin() as conn:
        await conn.exec_driver_sql("ALTER TABLE away RENAME TO ledger_replicas")
    assert await keep_once(ledger, running, 30.0, failing) == []
    assert failing == [False]
    async with engine.connect() as conn:
        [progress] = (await conn.execute(select(intents.c.progress))).scalars().all()
    assert Progress.decode(progress).completion_tokens == 7  # the report lost earlier


def test_the_cadence_beats_only_when_no_commit_did_and_reports_and_sweeps_less_often() -> None:
    cadence = Cadence(stale_s=30.0, beat_s=1.0)
    ticks = [cadence.next(since_beat_s=0.2 if n < 20 else 5.0) for n in range(40)]
    # while the writer's commits carry a beat, the tick beats only with a progress report
    assert [n for n, d in enumerate(ticks[:20]) if d.beat] == [0, 8, 16]
    assert all(d.beat for d in ticks[20:])  # no commit beat for 5 s: every tick does
    assert [n for n, d in enumerate(ticks) if d.report] == [0, 8, 16, 24, 32]  # ≤ stale / 4
    sweeps = [n for n, d in enumerate(ticks) if d.sweep]
    assert max(b - a for a, b in itertools.pairwise(sweeps)) <= 30.0 / 12  # recorded ≤ 32.5 s


def test_a_short_stale_time_sweeps_and_reports_at_every_tick() -> None:
    cadence = Cadence(stale_s=2.0, beat_s=0.5)
    assert all(d == Due(True, True, True) for d in (cadence.next(0.0) for _ in range(5)))
