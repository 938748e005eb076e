"""``BatchStore`` and ``FileStore`` (``gateway.batch``) on SQLite and on real PostgreSQL, with
real data keys: lines claimed once, leases taken over when they run out (the attempt counted),
a result kept only from the lease's holder, cancel and expiry stopping the queue, a batch ended
once with its files, tenants apart, limits, retention, and a shred that leaves everything
unreadable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from sqlalchemy import select

from audit import migrate
from audit.crypto import FileKeyProvider
from audit.datakeys import DataKeys
from gateway.batch.files import FileStore, files
from gateway.batch.lines import BatchLine
from gateway.batch.rows import LimitReached, LineResult, batches, lines
from gateway.batch.shapes import openai_files
from gateway.batch.store import BatchStore
from gateway.db import create_engine, upgrade_schema
from tests.clock import FakeClock

RETENTION_S, LEASE_S, WINDOW_S = 7 * 86400.0, 30.0, 86400.0
LIMITS = (10, 1_000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_767_225_600.0)


@pytest.fixture
async def stores(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[tuple[BatchStore, DataKeys]]:
    engine = create_engine(database_url)
    try:
        await migrate.upgrade(engine)
        await upgrade_schema(engine)
        FileKeyProvider.create(tmp_path / "keys.json")
        keys = DataKeys(engine, FileKeyProvider.load(tmp_path / "keys.json"))
        kept = FileStore(engine, keys, RETENTION_S, clock=clock)
        yield BatchStore(engine, keys, RETENTION_S, kept, LEASE_S, clock=clock), keys
    finally:
        await engine.dispose()


@pytest.fixture
def store(stores: tuple[BatchStore, DataKeys]) -> BatchStore:
    return stores[0]


def requests(n: int, secret: str = "the prompt") -> list[BatchLine]:
    return [BatchLine(f"c{i}", "/v1/chat/completions",
                      {"model": "m", "messages": [{"role": "user", "content": f"{secret} {i}"}]})
            for i in range(n)]  # fmt: skip


def ok(line: int, custom_id: str) -> LineResult:
    return LineResult(line, custom_id, "succeeded", 200, {"id": f"chatcmpl-{line}"}, "r")


async def make(store: BatchStore, n: int = 3, tenant: str = "acme") -> str:
    batch = await store.create(tenant, "k1", "openai", "/v1/chat/completions", requests(n),
                               window_s=WINDOW_S, limits=LIMITS)  # fmt: skip
    return batch.id


async def test_lines_are_sealed_claimed_once_and_answered_once(store: BatchStore) -> None:
    batch_id = await make(store, 5)
    first, second = await asyncio.gather(store.claim("r1", 3), store.claim("r2", 3))
    second += await store.claim("r2", 3)  # what a race left
    taken = [(c.batch_id, c.line) for c in first + second]
    assert len(taken) == len(set(taken)) == 5  # each line to one replica only
    assert all(c.attempt == 1 and c.key_id == "k1" for c in first + second)
    assert {c.request.custom_id for c in first + second} == {f"c{i}" for i in range(5)}
    assert await store.claim("r3", 5) == []
    for c in first:
        assert await store.finish("r1", c, ok(c.line, c.request.custom_id))
    stranger = second[0]
    assert not await store.finish("r1", stranger, ok(stranger.line, "x"))  # not r1's line
    async with store._engine.connect() as conn:
        sealed = b"".join(bytes(r.request) for r in (await conn.execute(select(lines))).all())
    assert b"the prompt" not in sealed and b"c0" not in sealed
    loaded = await store.load("acme", batch_id, "openai")
    assert loaded is not None
    assert (loaded.counts.succeeded, loaded.counts.processing) == (len(first), len(second))


async def test_a_lease_that_ran_out_is_taken_over_and_the_first_holder_cannot_answer(
    store: BatchStore, clock: FakeClock
) -> None:
    await make(store, 1)
    [mine] = await store.claim("r1", 1)
    clock.now += LEASE_S / 2
    await store.renew("r1")  # renewed: still r1's
    clock.now += LEASE_S * 0.9
    assert await store.claim("r2", 1) == []
    clock.now += LEASE_S  # r1 went silent
    [taken] = await store.claim("r2", 1)
    assert (taken.line, taken.attempt) == (mine.line, 2)
    assert not await store.finish("r1", mine, ok(0, "c0"))
    assert await store.finish("r2", taken, ok(0, "c0"))


async def test_released_lines_go_back_unrun(store: BatchStore) -> None:
    await make(store, 2)
    claimed = await store.claim("r1", 2)
    assert await store.release("r1", claimed[:1]) == 1
    [again] = await store.claim("r2", 2)
    assert (again.line, again.attempt) == (claimed[0].line, 1)
    assert await store.release("r1") == 1  # the other one, on shutdown


async def test_cancel_stops_the_queue_and_the_batch_ends_once_with_its_files(
    store: BatchStore,
) -> None:
    batch_id = await make(store, 4)
    [running] = await store.claim("r1", 1)
    cancelling = await store.cancel("acme", batch_id, "openai")
    assert cancelling is not None and cancelling.status == "cancelling"
    assert cancelling.counts.canceled == 3 and cancelling.counts.processing == 1
    assert await store.renew("r1") == {batch_id: "canceled"}
    assert await store.unfinished() == []  # a line still runs
    await store.finish("r1", running, ok(running.line, running.request.custom_id))
    assert await store.unfinished() == [(batch_id, "acme", "openai")]
    ends = await asyncio.gather(*(store.finalize("acme", batch_id, "openai", openai_files)
                                  for _ in range(3)))  # fmt: skip
    assert sorted(ends) == [False, False, True]
    done = await store.load("acme", batch_id, "openai")
    assert done is not None and done.status == "cancelled" and done.ended_at is not None
    output = await store.files.content("acme", done.output_file_id or "")
    errors = await store.files.content("acme", done.error_file_id or "")
    assert output is not None and errors is not None
    assert [orjson.loads(x)["custom_id"] for x in output[1].splitlines()] == ["c0"]
    stopped = [orjson.loads(x) for x in errors[1].splitlines()]
    assert {e["error"]["code"] for e in stopped} == {"batch_cancelled"} and len(stopped) == 3
    async with store._engine.connect() as conn:
        made = (await conn.execute(select(files.c.id))).scalars().all()
    assert len(made) == 2  # the files of one end, not three


async def test_past_its_window_a_batch_expires_keeping_what_finished(
    store: BatchStore, clock: FakeClock
) -> None:
    batch_id = await make(store, 3)
    [first] = await store.claim("r1", 1)
    await store.finish("r1", first, ok(first.line, first.request.custom_id))
    clock.now += WINDOW_S + 1
    assert await store.expire() == [batch_id]
    assert await store.claim("r1", 5) == []
    assert await store.finalize("acme", batch_id, "openai", openai_files)
    done = await store.load("acme", batch_id, "openai")
    assert done is not None and done.status == "expired"
    assert (done.counts.succeeded, done.counts.expired) == (1, 2)


async def test_tenants_are_apart_and_limits_hold(store: BatchStore) -> None:
    batch_id = await make(store, 2)
    assert await store.load("globex", batch_id, "openai") is None
    assert await store.load("acme", batch_id, "anthropic") is None
    assert await store.cancel("globex", batch_id, "openai") is None
    with pytest.raises(LimitReached):
        await store.create(
            "acme",
            "k1",
            "openai",
            "/v1/chat/completions",
            requests(5),
            window_s=WINDOW_S,
            limits=(10, 6),
        )  # 2 waiting + 5 > 6
    with pytest.raises(LimitReached):
        await store.create("acme", "k1", "openai", "/v1/chat/completions", requests(1),
                           window_s=WINDOW_S, limits=(1, 1_000))  # fmt: skip
    await make(store, 2, tenant="globex")  # another tenant's own limits


async def test_pages_newest_first(store: BatchStore, clock: FakeClock) -> None:
    made = []
    for _ in range(5):
        made.append(await make(store, 1))
        clock.now += 1
    page, more = await store.page("acme", "openai", limit=2)
    assert [b.id for b in page] == made[:2:-1][:2] and more
    page, more = await store.page("acme", "openai", limit=2, after=page[-1].id)
    assert [b.id for b in page] == [made[2], made[1]] and more
    page, more = await store.page("acme", "openai", limit=2, before=made[1])
    assert [b.id for b in page] == [made[3], made[2]]


async def test_retention_purges_and_a_shred_leaves_nothing_readable(
    stores: tuple[BatchStore, DataKeys], clock: FakeClock
) -> None:
    store, keys = stores
    stored = await store.files.create("acme", "k1", "batch", "in.jsonl", b'{"x": 1}\n')
    batch_id = await make(store, 2)
    async with store._engine.connect() as conn:
        at_rest = bytes((await conn.execute(select(files.c.content))).scalar_one())
    assert b'{"x": 1}' not in at_rest
    await keys.shred("acme", clock())
    store._boxes.clear()
    assert await store.files.get("acme", stored.id) is None
    assert await store.load("acme", batch_id, "openai") is None
    assert await store.claim("r1", 5) == []  # nothing that cannot be opened is run
    clock.now += RETENTION_S + 1
    assert await store.files.purge() == 1 and await store.purge() == 1
    async with store._engine.connect() as conn:
        left = (await conn.execute(select(batches.c.id))).all()
        left += (await conn.execute(select(lines.c.batch_id))).all()
    assert left == []
