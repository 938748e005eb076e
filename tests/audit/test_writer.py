"""The ledger writer against a real PostgreSQL that goes away and comes back.

The database is reached through ``TcpProxy``, a small TCP relay on 127.0.0.1: ``stop()`` closes
its listener and resets every live connection (what a crashed or partitioned database looks
like to the driver), ``start()`` listens again on the same port. The writer must then spool,
acknowledge, replay in order and never let a new record overtake a spooled one.

Nothing here sleeps to synchronise: each wait polls a condition under ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import struct
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.crypto import FileKeyProvider, WrappedKey
from audit.datakeys import DataKeyRow
from audit.ledger import Ledger
from audit.note import NoteSigner, NoteVerifier, create_signing_key, load_signing_key
from audit.record import Body, Facts, Sealed, parse_header
from audit.schema import checkpoints, data_keys, entries
from audit.spool import SpoolCorrupt, decode_line, encode_line
from audit.verify import Report, verify
from audit.writer import Mode, WriterStats, WriterUnavailable
from gateway.db import create_engine
from tests.tcpproxy import TcpProxy
from tests.waiting import eventually

ORIGIN = "thinkgate.test/writer"
RETRY_S = 0.05

# --- the database that goes away ------------------------------------------------------------------


@pytest.fixture
async def proxy(postgres_url: str) -> AsyncIterator[TcpProxy]:
    url = make_url(postgres_url)
    relay = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
    await relay.start()
    try:
        yield relay
    finally:
        if relay.running:
            await relay.stop()


# --- ledgers on the proxied database --------------------------------------------------------------


class Harness:
    """One set of keys; ledgers on the proxied database, and a direct engine to look at it."""

    def __init__(self, directory: Path, database_url: str, proxy: TcpProxy) -> None:
        self.directory = directory
        self.key_file = directory / "ledger-keys.json"
        self.signing_key_file = directory / "signing-key.pem"
        FileKeyProvider.create(self.key_file)
        create_signing_key(self.signing_key_file)
        proxied = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
        self.engine = create_engine(proxied.render_as_string(hide_password=False))
        self.direct = create_engine(database_url)
        self._ledgers: list[Ledger] = []

    def spool_path(self, name: str = "ledger.spool") -> Path:
        return self.directory / "spool" / name

    async def open(
        self,
        spool_path: Path | None = None,
        *,
        mode: Mode = "strict",
        engine: AsyncEngine | None = None,
    ) -> Ledger:
        ledger = await Ledger.open(
            self.engine if engine is None else engine,
            FileKeyProvider.load(self.key_file),
            NoteSigner(ORIGIN, load_signing_key(self.signing_key_file)),
            origin=ORIGIN,
            spool_path=self.spool_path() if spool_path is None else spool_path,
            mode=mode,
            retry_s=RETRY_S,
        )
        self._ledgers.append(ledger)
        return ledger

    async def request_ids(self) -> list[str]:
        """Request ids of the stored records by index, read past the proxy."""
        async with self.direct.connect() as conn:
            rows = await conn.execute(
                select(entries.c.idx, entries.c.request_id).order_by(entries.c.idx)
            )
            stored = rows.all()
        assert [row.idx for row in stored] == list(range(len(stored)))
        return [row.request_id for row in stored]

    async def checkpoint_count(self) -> int:
        async with self.direct.connect() as conn:
            return int(
                (await conn.execute(select(func.count()).select_from(checkpoints))).scalar_one()
            )

    async def verify(self) -> Report:
        verifier = NoteVerifier(
            NoteSigner(ORIGIN, load_signing_key(self.signing_key_file)).verifier_key()
        )
        return await verify(self.direct, verifier, ORIGIN)

    async def aclose(self) -> None:
        """Close every ledger (the first failure is raised, after the rest are closed)."""
        failures = []
        for ledger in self._ledgers:
            try:
                await ledger.aclose()
            except Exception as exc:
                failures.append(exc)
        await self.engine.dispose()
        await self.direct.dispose()
        if failures:
            raise failures[0]


@pytest.fixture
async def harness(postgres_url: str, proxy: TcpProxy, tmp_path: Path) -> AsyncIterator[Harness]:
    opened = Harness(tmp_path, postgres_url, proxy)
    try:
        yield opened
    finally:
        await opened.aclose()


def facts(request_id: str, tenant: str = "acme") -> Facts:
    return Facts(
        kind="completion", tenant=tenant, key_id="key-1", request_id=request_id,
        created_at=time.time(), model="qwen3-8b",
    )  # fmt: skip


def body(request_id: str, marker: str = "") -> Body:
    return Body(
        messages=[{"role": "user", "content": f"question {request_id} {marker}"}],
        params={"temperature": 0.5, "user": marker},
        reasoning=(f"thinking about {request_id} {marker}",),
        content=(f"answer {request_id} {marker}",),
    )


async def append_all(
    ledger: Ledger, ids: list[str], tenant: str = "acme", marker: str = ""
) -> None:
    for request_id in ids:
        await ledger.append(facts(request_id, tenant), body(request_id, marker))


def ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:03d}" for i in range(count)]


def spool_payloads(path: Path) -> list[bytes]:
    """The spool's payloads, read without opening a ``Spool`` (which could cut a tail)."""
    payloads = [decode_line(line) for line in path.read_bytes().split(b"\n")[:-1]]
    assert None not in payloads
    return [p for p in payloads if p is not None]


def spooled_request_ids(path: Path) -> list[str]:
    records = [Sealed.from_leaf_data(p[1:]) for p in spool_payloads(path) if p[:1] == b"R"]
    return [parse_header(r.header).request_id for r in records]


# --- strict mode: spool, then replay --------------------------------------------------------------


async def test_strict_appends_go_to_the_spool_and_replay_in_order(
    harness: Harness, proxy: TcpProxy
) -> None:
    ledger = await harness.open()
    before, during = ids("up", 3), ids("down", 6)
    await append_all(ledger, before)
    marker = f"PLAINTEXT-{secrets.token_hex(8)}"

    await proxy.stop()
    await append_all(ledger, during, marker=marker)  # strict: each returns once fsync'd
    assert ledger.spool_pending == len(during)
    assert ledger.stats.spooled == len(during)
    assert await harness.request_ids() == before
    raw = harness.spool_path().read_bytes()
    assert marker.encode() not in raw
    assert all(marker.encode() not in p for p in spool_payloads(harness.spool_path()))
    assert spooled_request_ids(harness.spool_path()) == during

    await proxy.start()
    await eventually(lambda: ledger.spool_pending == 0)
    assert await harness.request_ids() == before + during
    assert ledger.stats.replayed == len(during)
    report = await harness.verify()
    assert report.size == len(before + during)
    for index, request_id in enumerate(before + during):
        opened = await ledger.read(index)
        assert opened is not None and opened.body is not None
        assert opened.body == body(request_id, marker if request_id in during else "")


async def test_the_first_record_may_find_the_database_away(
    harness: Harness, proxy: TcpProxy
) -> None:
    ledger = await harness.open()
    await proxy.stop()
    await append_all(ledger, ids("down", 2))
    assert ledger.spool_pending > 0
    await proxy.start()
    await eventually(lambda: ledger.spool_pending == 0)
    assert await harness.request_ids() == ids("down", 2)
    assert (await harness.verify()).size == 2


# PostgreSQL stopping (a fast shutdown: a pod deleted, a failover) sends each connection this
# before it closes it: ErrorResponse, FATAL 57P01 admin_shutdown
ADMIN_SHUTDOWN = b"".join(
    [b"SFATAL\0VFATAL\0C57P01\0", b"Mterminating connection due to administrator command\0\0"]
)
ADMIN_SHUTDOWN = b"E" + struct.pack("!i", 4 + len(ADMIN_SHUTDOWN)) + ADMIN_SHUTDOWN


async def test_a_database_that_says_it_is_shutting_down_is_away_not_broken(
    harness: Harness, proxy: TcpProxy
) -> None:
    """asyncpg, idle when the shutdown message comes, fails the next statement with its
    ``InternalClientError`` ("another operation is in progress"), not a connection error. It
    is the database going away all the same: the record is spooled and replayed, and the
    writer goes on taking records (it used to refuse every record until a commit succeeded,
    so for as long as the database stayed away)."""
    ledger = await harness.open()
    await append_all(ledger, ["before"])
    await proxy.tell_clients(ADMIN_SHUTDOWN)
    await append_all(ledger, ["told"])  # raised WriterUnavailable
    assert ledger.accepting()
    await append_all(ledger, ["after"])
    await eventually(lambda: ledger.spool_pending == 0)
    assert await harness.request_ids() == ["before", "told", "after"]
    assert (await harness.verify()).size == 3


async def test_records_appended_after_the_database_returns_never_overtake_spooled_ones(
    harness: Harness, proxy: TcpProxy
) -> None:
    ledger = await harness.open()
    await append_all(ledger, ["first"])
    await proxy.stop()
    spooled = ids("spooled", 5)
    await append_all(ledger, spooled)
    await proxy.start()
    after = ids("after", 5)
    await append_all(ledger, after)  # at once: the replay may not have run yet
    await eventually(lambda: ledger.spool_pending == 0)
    assert await harness.request_ids() == ["first", *spooled, *after]
    assert (await harness.verify()).size == 11


async def test_order_holds_across_repeated_outages_under_concurrent_appends(
    harness: Harness, proxy: TcpProxy
) -> None:
    """Appenders of one tenant each wait for their own record; the ledger must hold every
    record once, each appender's records in its order, whatever the outages cut."""
    ledger = await harness.open()

    async def appender(name: str) -> None:
        await append_all(ledger, ids(name, 12))

    def progressed(stats: WriterStats, past: int) -> Callable[[], bool]:
        return lambda: stats.committed + stats.spooled > past or all(t.done() for t in tasks)

    tasks = [asyncio.create_task(appender(f"task{n}")) for n in range(4)]
    for _ in range(3):  # up a while, down a while, three times over
        await eventually(progressed(ledger.stats, ledger.stats.committed + ledger.stats.spooled))
        await proxy.stop()
        await eventually(progressed(ledger.stats, ledger.stats.committed + ledger.stats.spooled))
        await proxy.start()
    await asyncio.gather(*tasks)
    await eventually(lambda: ledger.spool_pending == 0)
    stored = await harness.request_ids()
    assert sorted(stored) == sorted(f"task{n}-{i:03d}" for n in range(4) for i in range(12))
    for n in range(4):
        assert [r for r in stored if r.startswith(f"task{n}-")] == ids(f"task{n}", 12)
    assert ledger.stats.spooled > 0
    assert (await harness.verify()).size == 48


# --- tenant keys made while the database is away --------------------------------------------------


async def test_a_tenant_first_seen_while_the_database_is_away_is_readable_after_replay(
    harness: Harness, proxy: TcpProxy
) -> None:
    ledger = await harness.open()
    await append_all(ledger, ["known"])
    tenant = f"newco-{secrets.token_hex(4)}"
    await proxy.stop()
    await append_all(ledger, ids("new", 3), tenant=tenant)

    payloads = spool_payloads(harness.spool_path())
    key_lines = [p for p in payloads if p[:1] == b"K"]
    assert len(key_lines) == 1
    assert payloads.index(key_lines[0]) == 0  # ahead of the records sealed under it
    row = DataKeyRow.decode(key_lines[0][1:])
    assert row.tenant == tenant
    dek = FileKeyProvider.load(harness.key_file).unwrap(WrappedKey(row.kek_id, row.wrapped))
    assert dek not in harness.spool_path().read_bytes()
    assert all(dek not in p for p in payloads)  # only the wrapped form is spooled

    await proxy.start()
    await eventually(lambda: ledger.spool_pending == 0)
    assert await saved_tenants(harness.direct, row.dek_id) == [tenant]

    # A fresh process (no key in memory) reads the records through the saved wrapped key.
    reader = await harness.open(harness.spool_path("reader.spool"), engine=harness.direct)
    for index, request_id in enumerate(ids("new", 3), start=1):
        for each in (ledger, reader):
            opened = await each.read(index)
            assert opened is not None
            assert not opened.destroyed
            assert opened.body == body(request_id)
    assert (await harness.verify()).size == 4


# --- replay is idempotent -------------------------------------------------------------------------


async def test_replaying_records_already_stored_adds_nothing(
    harness: Harness, proxy: TcpProxy
) -> None:
    spool = harness.spool_path()
    first = await harness.open(spool)
    tenant = f"newco-{secrets.token_hex(4)}"
    await proxy.stop()
    await append_all(first, ids("down", 4), tenant=tenant)
    copy = spool.read_bytes()
    await proxy.start()
    await eventually(lambda: first.spool_pending == 0)
    await first.aclose()
    stored, heads = await harness.request_ids(), await harness.checkpoint_count()
    assert stored == ids("down", 4)

    spool.write_bytes(copy)  # a crash between the commit and the spool's clear
    second = await harness.open(spool)
    assert second.spool_pending == len(spool_payloads(spool))
    await eventually(lambda: second.spool_pending == 0)
    assert await harness.request_ids() == stored
    assert await harness.checkpoint_count() == heads  # an all-duplicate replay signs nothing
    assert (await harness.verify()).size == 4
    opened = await second.read(3)
    assert opened is not None and opened.body == body("down-003")


async def test_a_replay_of_stored_and_new_records_adds_only_the_new(
    harness: Harness, proxy: TcpProxy
) -> None:
    spool = harness.spool_path()
    first = await harness.open(spool)
    tenant = f"newco-{secrets.token_hex(4)}"
    await proxy.stop()
    await append_all(first, ids("a", 3), tenant=tenant)
    stored_part = spool.read_bytes()
    await proxy.start()
    await eventually(lambda: first.spool_pending == 0)
    await proxy.stop()
    await append_all(first, ids("b", 3), tenant=tenant)
    await first.aclose()  # the database is still away: the b records stay spooled
    assert spooled_request_ids(spool) == ids("b", 3)

    spool.write_bytes(stored_part + spool.read_bytes())
    await proxy.start()
    second = await harness.open(spool)
    await eventually(lambda: second.spool_pending == 0)
    assert await harness.request_ids() == ids("a", 3) + ids("b", 3)
    assert (await harness.verify()).size == 6


# --- async mode -----------------------------------------------------------------------------------


async def test_async_aclose_persists_everything_queued(harness: Harness) -> None:
    ledger = await harness.open(mode="async")
    queued = ids("async", 200)
    await append_all(ledger, queued)
    await ledger.aclose()
    assert await harness.request_ids() == queued
    assert ledger.stats.committed == len(queued)
    assert ledger.stats.batches < len(queued)  # queued records share commits
    assert (await harness.verify()).size == len(queued)


async def test_async_aclose_with_the_database_away_leaves_everything_in_the_spool(
    harness: Harness, proxy: TcpProxy
) -> None:
    spool = harness.spool_path()
    ledger = await harness.open(spool, mode="async")
    await append_all(ledger, ["before"])
    await proxy.stop()
    queued = ids("async", 50)
    await append_all(ledger, queued)
    await ledger.aclose()
    stored = await harness.request_ids()
    assert stored + spooled_request_ids(spool) == ["before", *queued]

    await proxy.start()
    again = await harness.open(spool, mode="async")
    await eventually(lambda: again.spool_pending == 0)
    assert await harness.request_ids() == ["before", *queued]
    assert (await harness.verify()).size == 51


# --- when the spool fails too ---------------------------------------------------------------------


async def test_without_database_and_spool_appends_fail_until_the_database_returns(
    harness: Harness, proxy: TcpProxy
) -> None:
    spool = harness.spool_path()
    ledger = await harness.open(spool)
    await append_all(ledger, ["before"])
    assert ledger.accepting()

    await proxy.stop()
    shutil.rmtree(spool.parent)
    spool.parent.write_bytes(b"")  # the spool's directory is now a file: no write can succeed
    with pytest.raises(WriterUnavailable):
        await ledger.append(facts("refused"), body("refused"))
    assert not ledger.accepting()
    assert ledger.stats.failed == 1
    with pytest.raises(WriterUnavailable):
        await ledger.append(facts("refused-too"), body("refused-too"))

    await proxy.start()
    await eventually(ledger.accepting)  # the writer probes the database every retry_s
    await append_all(ledger, ["after"])
    assert await harness.request_ids() == ["before", "after"]
    assert (await harness.verify()).size == 2


async def test_a_damaged_spool_refuses_records_instead_of_hanging(harness: Harness) -> None:
    """A bad line before the last is damage (``SpoolCorrupt``): nothing may be committed past
    it, but a strict append must still get an answer, and the ledger must say it is not
    accepting."""
    spool = harness.spool_path()
    spool.parent.mkdir(parents=True)
    record = Sealed(b"{}", b"")
    spool.write_bytes(b"0" * 32 + b" AAAA\n" + encode_line(b"R" + record.leaf_data()))
    try:
        ledger = await harness.open(spool)
    except SpoolCorrupt:
        return  # refusing to start on a damaged spool is an answer too
    async with asyncio.timeout(5):
        with pytest.raises(WriterUnavailable):
            await ledger.append(facts("after-damage"), body("after-damage"))
    assert not ledger.accepting()
    assert await harness.request_ids() == []


async def test_a_tenant_key_made_during_a_commit_is_saved_with_its_records(
    harness: Harness, proxy: TcpProxy
) -> None:
    """A new tenant's key is made "unsaved" when its lookup cannot reach the database. If
    that happens while the writer's transaction is in flight (new connections refused, the
    writer's own connection fine: a database at its connection limit), the key must still
    reach ``ledger_data_keys``, or the tenant's records can never be read."""
    ledger = await harness.open()
    await append_all(ledger, ["warm"])
    async with harness.direct.connect() as lock:
        # Inserts into the entries wait; reads do not: the writer stalls inside its commit.
        await lock.execute(text("LOCK TABLE ledger_entries IN EXCLUSIVE MODE"))
        stalled = asyncio.create_task(ledger.append(facts("stalled"), body("stalled")))
        await eventually(lambda: waiting_on_locks(harness.direct))

        await proxy.refuse_new()
        async with harness.direct.connect() as admin:
            await admin.execute(text(TERMINATE_IDLE))  # the pool's idle connections die
        tenant = f"newco-{secrets.token_hex(4)}"
        probe = await ledger.seal(facts("probe", tenant), Body())  # makes the tenant's key
        dek_id = parse_header(probe.header).dek_id
        assert await saved_tenants(harness.direct, dek_id) == []  # unsaved, as meant
        late = asyncio.create_task(ledger.append(facts("late", tenant), body("late")))

        await proxy.start()
        await lock.commit()
    await asyncio.gather(stalled, late)
    assert await harness.request_ids() == ["warm", "stalled", "late"]
    assert await saved_tenants(harness.direct, dek_id) == [tenant]
    opened = await ledger.read(2)
    assert opened is not None
    assert not opened.destroyed, "the tenant's key never reached the database"
    assert opened.body == body("late")


TERMINATE_IDLE = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'idle'"
)


async def saved_tenants(engine: AsyncEngine, dek_id: str) -> list[str]:
    """The tenant of ``dek_id`` as ``ledger_data_keys`` has it (empty: not saved)."""
    query = select(data_keys.c.tenant).where(data_keys.c.dek_id == dek_id)
    async with engine.connect() as conn:
        return [row.tenant for row in await conn.execute(query)]


async def waiting_on_locks(engine: AsyncEngine) -> bool:
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    async with engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one()) > 0
