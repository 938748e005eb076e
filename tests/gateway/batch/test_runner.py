"""``BatchRunner`` (``gateway.batch.runner``) against a real ``BatchStore`` (SQLite) and an ASGI
app standing for the gateway, whose answers the test decides: refused-for-now lines go back
unrun and the runner backs off (its window halves, then grows one line per success), a cancel
stops the lines running here, a shutdown gives them back, and every line is asked with its
batch's key, at sheddable priority, its body as given."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import event
from starlette.types import Receive, Scope, Send

from audit import migrate
from audit.crypto import FileKeyProvider
from audit.datakeys import DataKeys
from gateway.batch.files import FileStore
from gateway.batch.lines import ORIGIN, BatchLine
from gateway.batch.runner import BatchRunner
from gateway.batch.shapes import openai_files
from gateway.batch.store import BatchStore
from gateway.db import create_engine, upgrade_schema
from gateway.telemetry.metrics import Metrics
from tests.waiting import eventually


class Engine:
    """An ASGI app that answers each line as ``answer(body)`` says: (status, body, hold)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.refuse = 0  # the next N lines get 429
        self.spent: set[str] = set()  # keys whose budget refuses (429 for half a minute)
        self.hold = asyncio.Event()  # lines wait on it when ``holding``
        self.holding = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        body = orjson.loads(message["body"])
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append((scope[ORIGIN].key_id, body, headers))
        status, answer = 200, {"id": "chatcmpl-1", "echo": body["messages"][0]["content"]}
        extra = [(b"retry-after", b"0.1")]
        if scope[ORIGIN].key_id in self.spent:
            status, answer = 429, {"error": {"code": "budget_exceeded"}}
            extra = [(b"retry-after", b"30")]
        elif self.refuse:
            self.refuse -= 1
            status, answer = 429, {"error": {"code": "kv_budget_exhausted"}}
        elif self.holding:
            await self.hold.wait()
        extra = extra if status == 429 else []
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *extra]})  # fmt: skip
        await send({"type": "http.response.body", "body": orjson.dumps(answer)})


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[BatchStore]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    try:
        await migrate.upgrade(engine)
        await upgrade_schema(engine)
        FileKeyProvider.create(tmp_path / "keys.json")
        keys = DataKeys(engine, FileKeyProvider.load(tmp_path / "keys.json"))
        yield BatchStore(engine, keys, 86400.0, FileStore(engine, keys, 86400.0), lease_s=3.0)
    finally:
        await engine.dispose()


def chat(n: int) -> list[BatchLine]:
    return [BatchLine(f"c{i}", "/v1/chat/completions",
                      {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]})
            for i in range(n)]  # fmt: skip


async def running(runner: BatchRunner) -> AsyncIterator[None]:
    task = asyncio.create_task(runner.run_forever())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runner.stop_all()


async def ended(store: BatchStore, batch_id: str) -> Any:
    async def done() -> Any:
        batch = await store.load("acme", batch_id, "openai")
        return batch if batch is not None and batch.ended_at is not None else None

    return await eventually(done, within_s=20, every=0.02)


async def test_lines_run_as_their_key_at_sheddable_priority_and_refusals_wait(
    store: BatchStore,
) -> None:
    engine = Engine()
    engine.refuse = 3
    runner = BatchRunner(store, lambda: engine, "r1", most=4, poll_s=0.05)
    batch = await store.create("acme", "k1", "openai", "/v1/chat/completions", chat(6),
                               window_s=3600, limits=(10, 100))  # fmt: skip
    async for _ in running(runner):
        runner.wake()
        done = await ended(store, batch.id)
    assert (done.status, done.counts.succeeded) == ("completed", 6)
    assert len(engine.seen) == 9  # 3 refused for now, asked again
    assert {key for key, _, _ in engine.seen} == {"k1"}
    assert {h["x-thinkgate-priority"] for _, _, h in engine.seen} == {"sheddable"}
    results = {r.custom_id: r.body["echo"] for r in await store.results(done)}
    assert results == {f"c{i}": f"q{i}" for i in range(6)}
    assert 1 <= runner.window <= 4


async def test_a_batch_its_own_key_refuses_waits_and_the_others_go_on(
    store: BatchStore,
) -> None:
    engine = Engine()
    engine.spent = {"k1"}
    runner = BatchRunner(store, lambda: engine, "r1", most=4, poll_s=0.05)
    held = await store.create("acme", "k1", "openai", "/v1/chat/completions", chat(3),
                              window_s=3600, limits=(10, 100))  # fmt: skip
    async for _ in running(runner):
        runner.wake()
        await eventually(lambda: any(key == "k1" for key, _, _ in engine.seen), within_s=10)
        other = await store.create("acme", "k2", "openai", "/v1/chat/completions", chat(4),
                                   window_s=3600, limits=(10, 100))  # fmt: skip
        runner.wake()
        assert (await ended(store, other.id)).counts.succeeded == 4  # not paused behind k1's
        asked = sum(key == "k1" for key, _, _ in engine.seen)
        assert asked <= 3  # each of its lines asked at most once: then the batch waits
        assert (await store.load("acme", held.id, "openai")).ended_at is None  # type: ignore[union-attr]
        engine.spent.clear()  # the budget raised here
        runner.unhold()
        assert (await ended(store, held.id)).counts.succeeded == 3


async def test_the_window_halves_when_shed_and_grows_per_line(store: BatchStore) -> None:
    runner = BatchRunner(store, lambda: Engine(), "r1", most=8)
    runner.window = 8
    runner._shed(0.0)
    assert runner.window == 4
    runner._shed(0.0)
    runner._shed(0.0)
    runner._shed(0.0)
    assert runner.window == 1


async def test_a_cancel_stops_the_lines_running_here(store: BatchStore) -> None:
    engine = Engine()
    engine.holding = True
    runner = BatchRunner(store, lambda: engine, "r1", most=2, poll_s=0.05)
    batch = await store.create("acme", "k1", "openai", "/v1/chat/completions", chat(5),
                               window_s=3600, limits=(10, 100))  # fmt: skip
    async for _ in running(runner):
        runner.wake()
        await eventually(lambda: len(runner.runs) >= 1, within_s=10)
        await store.cancel("acme", batch.id, "openai")
        runner.stop({batch.id: "canceled"})
        done = await ended(store, batch.id)
    assert done.status == "cancelled" and done.counts.canceled == 5
    output, errors = openai_files(done, await store.results(done))
    assert output is None and errors is not None and errors.count(b"batch_cancelled") == 5


async def test_a_shutdown_gives_the_running_lines_back(store: BatchStore) -> None:
    engine = Engine()
    engine.holding = True
    runner = BatchRunner(store, lambda: engine, "r1", most=2, poll_s=0.05)
    batch = await store.create("acme", "k1", "openai", "/v1/chat/completions", chat(2),
                               window_s=3600, limits=(10, 100))  # fmt: skip
    async for _ in running(runner):
        runner.wake()
        await eventually(lambda: len(runner.runs) >= 1, within_s=10)
    [again, *_] = await store.claim("r2", 2)  # back in the queue at once, not after a lease
    assert again.attempt == 1 and again.batch_id == batch.id


async def test_the_sweep_of_an_idle_replica_asks_once_and_reports_the_open_lines(
    store: BatchStore,
) -> None:
    """No active batch: one query, every gauge at zero. An active one: its lines counted."""
    statements: list[str] = []
    sync = store._engine.sync_engine
    listen = event.listens_for(sync, "before_cursor_execute")
    listen(lambda conn, cursor, statement, *rest: statements.append(statement))
    metrics = Metrics()
    runner = BatchRunner(store, lambda: Engine(), "r1", most=2, metrics=metrics)
    await runner.sweep()
    assert len(statements) == 1, statements
    assert gauges(metrics) == (0.0, 0.0, 0.0)
    await store.create("acme", "k1", "openai", "/v1/chat/completions", chat(3),
                       window_s=3600, limits=(10, 100))  # fmt: skip
    statements.clear()
    await runner.sweep()
    assert len(statements) > 1  # expiry, the batches to end, the lines
    queued, running, age = gauges(metrics)
    assert (queued, running) == (3.0, 0.0) and 0.0 <= age < 60.0


def gauges(metrics: Metrics) -> tuple[float | None, ...]:
    """The batch gauges: lines queued, running, the oldest batch's age."""
    value = metrics.registry.get_sample_value
    return (value("thinkgate_batch_lines", {"state": "queued"}),
            value("thinkgate_batch_lines", {"state": "running"}),
            value("thinkgate_batch_oldest_age_seconds"))  # fmt: skip
