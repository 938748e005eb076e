"""Checkpoints per interval (``checkpoint_interval_s``; the gateway's ``CHECKPOINT_INTERVAL_MS``),
on SQLite and PostgreSQL: records are committed at once, one checkpoint covers everything the
interval committed and every record's inclusion proof verifies against it, ``verify`` reports
the records still waiting for it rather than failing, a stop publishes, and a crash between a
commit and its checkpoint loses nothing: the next start covers it."""

from __future__ import annotations

import asyncio

from audit import merkle, store
from audit.note import parse_checkpoint
from tests.audit.conftest import LedgerFactory, append_records, leaf_hashes
from tests.waiting import eventually

INTERVAL_S = 0.3
NEVER_S = 3_600.0  # no checkpoint within the test but at start and stop


def size_of(note: str | None) -> int:
    return 0 if note is None else parse_checkpoint(note.split("\n\n", 1)[0] + "\n").size


async def test_one_checkpoint_covers_what_the_interval_committed(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url, checkpoint_interval_s=INTERVAL_S)
    await append_records(ledger, 8)  # eight commits, each durable when append returns
    async with ledger_factory.engine(database_url).connect() as conn:
        assert await store.tree_size(conn) == 8

    async def covered() -> bool:
        return size_of(await ledger.checkpoint()) == 8

    await eventually(covered, within_s=5)
    listed = await ledger.checkpoints(1, 100)
    assert len(listed) < 8  # not one per commit
    note = await ledger.checkpoint()
    assert note is not None
    head = parse_checkpoint(ledger_factory.verifier().open(note))
    for index, leaf in enumerate(await leaf_hashes(ledger, 8)):
        proof = await ledger.inclusion(index, 8)
        merkle.verify_inclusion(leaf, index, 8, proof.hashes, head.root)
    report = await ledger_factory.verify(database_url)
    assert (report.size, report.pending) == (8, 0)


async def test_records_waiting_for_the_checkpoint_are_reported_not_failed(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    from audit.verify import verify

    ledger = await ledger_factory.open(database_url, checkpoint_interval_s=NEVER_S)
    await eventually(lambda: ledger.stats.last_checkpoint_at is not None, within_s=5)
    await append_records(ledger, 3)
    engine = ledger_factory.engine(database_url)
    report = await verify(engine, ledger_factory.verifier(), "thinkgate.test/ledger",
                          pending_ok=True)  # fmt: skip
    assert (report.size, report.checkpoints, report.pending) == (3, 0, 3)
    await ledger.aclose()  # a stop publishes what is pending
    assert size_of(await ledger.checkpoint()) == 3
    assert (await ledger_factory.verify(database_url)).pending == 0


async def test_a_crash_between_commit_and_checkpoint_is_covered_at_the_next_start(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    first = await ledger_factory.open(database_url, checkpoint_interval_s=NEVER_S)
    await append_records(first, 5)
    writer = first._writer  # the crash: the writer dies, nothing more runs
    assert writer._task is not None
    writer._task.cancel()
    await asyncio.gather(writer._task, return_exceptions=True)
    writer._task = None  # so the teardown's aclose does not publish
    await writer._sequencer.aclose()  # its connection goes with the process
    writer._spool.release()  # and its spool's lock
    assert size_of(await first.checkpoint()) == 0
    second = await ledger_factory.open(database_url, checkpoint_interval_s=NEVER_S)

    async def covered() -> bool:
        return size_of(await second.checkpoint()) == 5

    await eventually(covered, within_s=5)
    await append_records(second, 2, start=5)
    await second.aclose()
    report = await ledger_factory.verify(database_url)
    assert (report.size, report.pending) == (7, 0)
