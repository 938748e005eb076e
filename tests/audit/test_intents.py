"""Write-ahead intents in the ledger (``audit.intents``), on SQLite and PostgreSQL: an intent is
durable before it is acknowledged, its record takes its place (one leaf per exchange), and an
intent whose replica stopped beating becomes exactly one ``replica_lost`` record with what the
owner's last beat knew, whichever replicas sweep at once; through the spool as through the
database."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from pathlib import Path

from sqlalchemy import select, update

from audit import intentstore
from audit.commit import Query, Script, Statements
from audit.intents import LOST, Intent, Progress, cancel_pairs
from audit.ledger import Ledger
from audit.merkle import CompactRange
from audit.record import Body, Facts, Sealed
from audit.schema import intents, replicas
from audit.store import Filter
from tests.audit.conftest import LedgerFactory
from tests.audit.test_writer import Harness, harness, proxy  # noqa: F401
from tests.tcpproxy import TcpProxy
from tests.waiting import eventually

LATER = 3600.0  # "an hour later": every beat so far is stale by then


def started(request_id: str, tenant: str = "acme") -> Facts:
    return Facts(kind="completion", tenant=tenant, key_id="key-1", request_id=request_id,
                 created_at=time.time(), model="deepseek-r1", status="started", stream=True,
                 started_at=time.time(), endpoint="chat.completions")  # fmt: skip


def asked(request_id: str) -> Body:
    return Body(messages=[{"role": "user", "content": f"question of {request_id}"}],
                params={"max_tokens": 64})  # fmt: skip


def answered(request_id: str) -> tuple[Facts, Body]:
    facts = dataclasses.replace(started(request_id), status="ok", created_at=time.time())
    return facts, Body(messages=asked(request_id).messages, content=("the answer",))


async def rows(ledger: Ledger) -> list[tuple[str, str]]:
    found = await ledger.find(_everything(), 100)
    return [(r.header["request_id"], r.header["status"]) for r in found]


def _everything() -> Filter:
    return Filter()


async def test_an_intent_is_durable_when_acknowledged_and_its_record_takes_its_place(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url)
    intent_id, durable = await ledger.intend(started("r-1"), asked("r-1"))
    await ledger.confirm(durable)
    assert await intentstore.pending(ledger_factory.engine(database_url)) == 1
    assert await rows(ledger) == []  # an intent is not a leaf

    facts, body = answered("r-1")
    await ledger.append(facts, body, replaces=intent_id)
    assert await intentstore.pending(ledger_factory.engine(database_url)) == 0
    assert await rows(ledger) == [("r-1", "ok")]
    assert (await ledger_factory.verify(database_url)).size == 1


async def test_a_dead_replicas_intent_becomes_one_replica_lost_record_whoever_sweeps(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    dead = await ledger_factory.open(database_url)
    sweepers = [await ledger_factory.open(database_url) for _ in range(3)]
    intent_id, durable = await dead.intend(started("r-lost"), asked("r-lost"))
    await dead.confirm(durable)
    first_token = time.time()
    await dead.beat({intent_id: Progress("http://engine-a/v1", first_token, 12, 40, 30,
                                         time.time())})  # fmt: skip

    # while its owner beats, nobody takes it
    assert [await s.recover_lost(30.0) for s in sweepers] == [[], [], []]

    # the owner dies: its last beat an hour ago (the sweepers beat as they claim, for real)
    async with ledger_factory.engine(database_url).begin() as conn:
        await conn.execute(update(replicas).where(replicas.c.id == dead.writer_id)
                           .values(heartbeat_at=replicas.c.heartbeat_at - LATER))  # fmt: skip
    found = await asyncio.gather(*(s.recover_lost(30.0) for s in sweepers))
    assert [r for one in found for r in one] == ["r-lost"]  # claimed once, by one of them
    [listed] = await dead.find(_everything(), 10)
    header = listed.header
    assert header["status"] == LOST and header["error_code"] == LOST
    assert header["request_id"] == "r-lost" and header["endpoint"] == "chat.completions"
    assert header["upstream"] == "http://engine-a/v1"
    assert header["first_token_at"] == first_token
    assert header["usage"] == {
        "prompt_tokens": 12,
        "completion_tokens": 40,
        "reasoning_tokens": 30,
        "total_tokens": 52,
        "counted": True,
    }
    opened = await dead.read(listed.index)
    assert opened is not None and opened.body == asked("r-lost")  # the request, readable
    assert await intentstore.pending(ledger_factory.engine(database_url)) == 0
    assert [await s.recover_lost(30.0) for s in sweepers] == [[], [], []]
    assert (await ledger_factory.verify(database_url)).size == 1


async def test_a_replicas_own_intent_is_recovered_only_once_no_exchange_holds_it(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url)
    intent_id, durable = await ledger.intend(started("r-own"), asked("r-own"))
    await ledger.confirm(durable)
    later = time.time() + LATER
    assert await ledger.recover_lost(30.0, running={intent_id}, now=later) == []
    assert await ledger.recover_lost(30.0, running=set(), now=time.time()) == []  # too young
    assert await ledger.recover_lost(30.0, running=set(), now=later) == ["r-own"]
    assert await rows(ledger) == [("r-own", LOST)]


async def test_an_intent_and_its_record_in_one_commit_write_no_intent_row(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url, mode="async")
    intent_id, _ = await ledger.intend(started("r-quick"), asked("r-quick"))
    facts, body = answered("r-quick")
    await ledger.append(facts, body, replaces=intent_id)  # queued behind it, one batch
    await ledger.aclose()
    engine = ledger_factory.engine(database_url)
    assert await intentstore.pending(engine) == 0
    async with engine.connect() as conn:
        beaten = (await conn.execute(select(replicas.c.id))).all()
    assert beaten == [] or all(r.id == ledger.writer_id for r in beaten)
    assert await rows(ledger) == [("r-quick", "ok")]


def test_cancel_pairs_drops_an_intent_and_the_deletion_of_it_together() -> None:
    sealed = Sealed(b"{}", b"")
    a, b = (Intent(i, "w", "t", i, 0.0, sealed) for i in ("a", "b"))
    assert cancel_pairs([a, b], ["a", "z"]) == ([b], ["z"])
    assert cancel_pairs([a], []) == ([a], [])


def test_progress_survives_a_row_half_written() -> None:
    p = Progress("u", 1.5, 3, 4, 2, 9.0)
    assert Progress.decode(p.encode()) == p
    assert Progress.decode("{not json") == Progress()
    assert Progress.decode(None) == Progress()


# --- through the spool ------------------------------------------------------------------------


async def test_spooled_intents_and_records_replay_to_no_intent_and_one_record(
    harness: Harness,  # noqa: F811
    proxy: TcpProxy,  # noqa: F811
) -> None:
    ledger = await harness.open()
    await proxy.stop()
    intent_id, durable = await ledger.intend(started("r-spooled"), asked("r-spooled"))
    await ledger.confirm(durable)  # fsync'd to the spool
    facts, body = answered("r-spooled")
    await ledger.append(facts, body, replaces=intent_id)
    await proxy.start()
    await eventually(lambda: ledger.spool_pending == 0)
    assert await harness.request_ids() == ["r-spooled"]
    assert await intentstore.pending(harness.direct) == 0


async def test_a_spooled_intent_of_a_killed_replica_is_recovered_after_its_spool_replays(
    harness: Harness,  # noqa: F811
    proxy: TcpProxy,  # noqa: F811
) -> None:
    """The replica dies with the database away: its spool holds the intent alone. Started
    again on that spool (a new process, a new writer id), it replays the intent as its own,
    under its beat, and its sweep records the exchange; another replica leaves it alone while
    it beats."""
    dead = await harness.open(harness.spool_path("dead.spool"))
    await proxy.stop()
    _, durable = await dead.intend(started("r-orphan"), asked("r-orphan"))
    await dead.confirm(durable)
    _kill(harness, dead)

    await proxy.start()
    again = await harness.open(harness.spool_path("dead.spool"))
    await eventually(lambda: again.spool_pending == 0)
    async with harness.direct.connect() as conn:
        [row] = (await conn.execute(select(intents.c.owner))).all()
        beats = dict((await conn.execute(select(replicas.c.id, replicas.c.heartbeat_at))).all())
    assert row.owner == again.writer_id and again.writer_id in beats  # adopted, beaten
    survivor = await harness.open(harness.spool_path("survivor.spool"))
    assert await survivor.recover_lost(30.0, now=time.time()) == []
    assert await again.recover_lost(30.0, now=time.time() + LATER) == ["r-orphan"]
    assert await harness.request_ids() == ["r-orphan"]
    assert (await harness.verify()).size == 1


def _kill(opened: Harness, ledger: Ledger) -> None:
    """As ``kill -9`` leaves it: the writer stops where it is, nothing is flushed or closed;
    the kernel lets go of the process's spool lock."""
    ledger._writer._task.cancel()  # type: ignore[union-attr]
    ledger._writer._spool.release()
    opened._ledgers.remove(ledger)


async def test_an_intent_is_committed_at_once_with_whatever_is_queued_by_then(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    """Nobody has to await an intent for its commit to start (the engine's time to first
    token hides it); what is queued before the writer runs shares that commit."""
    ledger = await ledger_factory.open(database_url)
    engine = ledger_factory.engine(database_url)
    _, riding = await ledger.intend(started("r-rides"), asked("r-rides"))
    _, beside = await ledger.intend(started("r-beside"), asked("r-beside"))
    facts, body = answered("r-other")
    await ledger.append(facts, body)  # another exchange's record, queued behind them
    assert riding.done() and beside.done() and await intentstore.pending(engine) == 2
    assert ledger.stats.batches == 1  # one commit for the three
    _, alone = await ledger.intend(started("r-alone"), asked("r-alone"))
    await asyncio.wait_for(asyncio.shield(alone), 5)  # not confirmed: committed all the same
    assert await intentstore.pending(engine) == 3 and ledger.stats.batches == 2


async def test_a_commit_of_intents_alone_is_relaxed_and_a_records_commit_is_not(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    """Durable against the replica's death, not the database host's (``audit.drivers``): what
    the database says of the synchronous setting its commits ran under."""
    ledger = await ledger_factory.open(database_url)
    driver = ledger._writer._sequencer._driver  # type: ignore[union-attr]
    seen: list[str] = []
    run = driver.run

    async def observed(script: Script, *, relaxed: bool = False) -> CompactRange:
        return await run(_noting(script, driver.statements, seen), relaxed=relaxed)

    driver.run = observed  # type: ignore[method-assign]
    await ledger.confirm((await ledger.intend(started("r-1"), asked("r-1")))[1])
    facts, body = answered("r-2")
    await ledger.append(facts, body)
    await ledger.confirm((await ledger.intend(started("r-3"), asked("r-3")))[1])
    relaxed, full = ("1", "2") if database_url.startswith("sqlite") else ("off", "on")
    assert seen == [relaxed, full, relaxed]
    assert await intentstore.pending(ledger_factory.engine(database_url)) == 2


def _noting(script: Script, sql: Statements, seen: list[str]) -> Script:
    """``script``, then a query of the synchronous setting its transaction commits under."""
    tree = yield from script
    sync = "PRAGMA synchronous" if sql.paramstyle == "qmark" else "SHOW synchronous_commit"
    seen.append(str((yield Query(sync))[0][0]))
    return tree


async def test_a_relaxed_commit_waits_for_a_write_lock_another_connection_holds(
    tmp_path: Path, ledger_factory: LedgerFactory
) -> None:
    """SQLite commits intents on the event loop without waiting for the lock: while another
    connection holds it, the commit goes to the worker thread, which waits for it."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    ledger = await ledger_factory.open(url)
    await ledger.confirm((await ledger.intend(started("r-0"), asked("r-0")))[1])  # connected
    blocker = sqlite3.connect(tmp_path / "l.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    driver = ledger._writer._sequencer._driver  # type: ignore[union-attr]
    tried, refused = driver._run_here, []

    def on_the_loop(script: Script) -> CompactRange | None:
        tree = tried(script)
        refused.extend([] if tree is not None else ["busy"])
        return tree

    driver._run_here = on_the_loop
    _, durable = await ledger.intend(started("r-1"), asked("r-1"))
    confirming = asyncio.create_task(ledger.confirm(durable))
    await eventually(lambda: refused == ["busy"], within_s=5)
    assert not confirming.done()  # on the worker thread, waiting for the lock
    await asyncio.to_thread(blocker.execute, "COMMIT")
    await asyncio.wait_for(confirming, 10)
    blocker.close()
    assert await intentstore.pending(ledger_factory.engine(url)) == 2
