"""The export loop (gateway/side/siem/exporter.py) over a real ledger on SQLite and PostgreSQL, with
real sinks (a file, an HTTP collector): batches in order, the cursor moved only after every
sink took a batch, resumption after a restart or a takeover, the backlog bound, one exporter
among replicas."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.ledger import Ledger
from audit.schema import entries
from gateway.db import upgrade_schema
from gateway.edge.servers import BackgroundServer
from gateway.side.siem import ocsf, source
from gateway.side.siem.cursor import ExportCursor
from gateway.side.siem.exporter import ExportPlan, SiemExporter, backoff, plan
from gateway.side.siem.ocsf import OcsfEvent
from gateway.side.siem.sinks import HecSink, JsonLinesSink, SiemSink, SinkDown
from gateway.telemetry.metrics import Metrics
from tests.audit.conftest import LedgerFactory, append_records, ledger_factory  # noqa: F401 - the fixture
from tests.clock import FakeClock
from tests.gateway.side.siem.test_sinks import Collector, split_objects
from tests.ocsf import schema_errors
from tests.waiting import eventually


def test_a_plan_exports_a_batch_from_the_cursor() -> None:
    assert plan(cursor=0, head=10, max_backlog=100, batch=4) == ExportPlan(0, 4, 0)
    assert plan(cursor=8, head=10, max_backlog=100, batch=4) == ExportPlan(8, 10, 0)
    assert plan(cursor=10, head=10, max_backlog=100, batch=4) == ExportPlan(10, 10, 0)


def test_a_plan_keeps_only_the_newest_max_backlog_records() -> None:
    assert plan(cursor=0, head=10, max_backlog=3, batch=2) == ExportPlan(7, 9, 7)
    assert plan(cursor=7, head=10, max_backlog=3, batch=5) == ExportPlan(7, 10, 0)


def test_a_plan_never_goes_back_when_the_ledger_is_behind_the_cursor() -> None:
    assert plan(cursor=12, head=10, max_backlog=3, batch=5) == ExportPlan(12, 12, 0)


def test_the_backoff_doubles_up_to_64_intervals_or_a_third_of_the_lease() -> None:
    assert [backoff(0.5, n, 30.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert backoff(0.01, 40, 30.0) == 0.64
    assert backoff(20.0, 3, 30.0) == 20.0  # never below the interval


@pytest.fixture
async def ledger(database_url: str, ledger_factory: LedgerFactory) -> Ledger:  # noqa: F811
    opened = await ledger_factory.open(database_url)
    await upgrade_schema(ledger_factory.engine(database_url))
    return opened


@pytest.fixture
def engine(database_url: str, ledger_factory: LedgerFactory, ledger: Ledger) -> AsyncEngine:  # noqa: F811
    return ledger_factory.engine(database_url)


def exporter(engine: AsyncEngine, sinks: list[SiemSink], holder: str = "a", *,
             batch: int = 3, max_backlog: int = 1000, clock: FakeClock | None = None,
             interval_s: float = 0.01) -> SiemExporter:  # fmt: skip
    cursor = ExportCursor(engine, holder, 30.0, clock=clock or FakeClock())
    return SiemExporter(engine, sinks, cursor, Metrics(), batch=batch, max_backlog=max_backlog,
                        interval_s=interval_s)  # fmt: skip


def exported(path: Path) -> list[int]:
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines()
    return [orjson.loads(line)["unmapped"]["integrity"]["leaf_index"] for line in lines]


def sample(made: SiemExporter, name: str, **labels: str) -> float:
    value = made._metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_rounds_export_every_record_in_order_in_batches(
    ledger: Ledger, engine: AsyncEngine, tmp_path: Path
) -> None:
    await append_records(ledger, 7)
    path = tmp_path / "siem.jsonl"
    made = exporter(engine, [JsonLinesSink(path)])
    assert [await made.round() for _ in range(4)] == [True, True, False, False]
    assert exported(path) == list(range(7))
    async with engine.connect() as conn:
        hashes = (await conn.execute(select(entries.c.leaf_hash).order_by(entries.c.idx))).all()
    events = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [e["unmapped"]["integrity"]["leaf_hash"] for e in events] == [h[0].hex() for h in hashes]
    assert sample(made, "thinkgate_siem_events_total", sink="file", outcome="sent") == 7
    assert sample(made, "thinkgate_siem_backlog_records") == 0
    await append_records(ledger, 2, start=7)
    assert await made.round() is False  # two more: less than a batch
    assert exported(path) == list(range(9))


async def test_a_sink_that_is_down_holds_the_cursor_and_the_others_get_each_batch_once(
    ledger: Ledger, engine: AsyncEngine, tmp_path: Path
) -> None:
    await append_records(ledger, 4)
    path = tmp_path / "siem.jsonl"
    collector = Collector(503, 503)
    async with BackgroundServer(collector) as server:
        hec = HecSink(f"{server.url}/services/collector", "t", "gw", httpx.AsyncClient())
        made = exporter(engine, [JsonLinesSink(path), hec])
        for _ in range(2):
            with pytest.raises(SinkDown):
                await made.round()
        assert exported(path) == [0, 1, 2]  # the file took the batch once
        assert (await made._cursor.position() or (None,))[0] == 0
        assert await made.round() is True
        assert await made.round() is False
        await hec.aclose()
    assert exported(path) == [0, 1, 2, 3]
    batches = [[o["event"]["metadata"]["sequence"] for o in split_objects(body)]
               for _, body in collector.posts]  # fmt: skip
    assert batches == [[0, 1, 2], [0, 1, 2], [0, 1, 2], [3]]
    assert sample(made, "thinkgate_siem_events_total", sink="hec", outcome="failed") == 6
    assert sample(made, "thinkgate_siem_events_total", sink="hec", outcome="sent") == 4


async def test_a_restart_resumes_at_the_cursor_and_a_crash_resends_at_most_a_batch(
    ledger: Ledger, engine: AsyncEngine, tmp_path: Path
) -> None:
    await append_records(ledger, 8)
    path = tmp_path / "siem.jsonl"
    clock = FakeClock()
    first = exporter(engine, [JsonLinesSink(path)], "first", clock=clock)
    assert await first.round() is True  # 0, 1, 2
    await first._release()  # a clean stop: the next start takes over at once
    second = exporter(engine, [JsonLinesSink(path)], "second", clock=clock)
    assert await second.round() is True  # 3, 4, 5
    # the second dies after its next batch was written, before the cursor moved
    await second._deliver(await _events(engine, 6, 8), 8)
    third = exporter(engine, [JsonLinesSink(path)], "third", clock=clock)
    assert await third.round() is False  # the dead one's lease has not expired yet
    assert exported(path) == list(range(8))
    clock.now += 31
    assert await third.round() is False  # takes over at 6 and sends 6 and 7 again
    assert exported(path) == [*range(8), 6, 7]  # duplicates: the batch in flight, no more
    assert await third.round() is False
    assert exported(path) == [*range(8), 6, 7]


async def _events(engine: AsyncEngine, start: int, stop: int) -> list[OcsfEvent]:
    async with engine.connect() as conn:
        head = await source.tree_head(conn)
        rows = await source.ledger_rows(conn, start, stop)
    assert head is not None
    return [ocsf.event(row, head) for row in rows]


async def test_every_kind_of_record_the_ledger_writes_goes_out_as_a_valid_event(
    ledger: Ledger, engine: AsyncEngine, tmp_path: Path
) -> None:
    await append_records(ledger, 1)
    hold = await ledger.place_hold("acme", "case 17")
    await ledger.release_hold(hold.id, "closed")
    await ledger.set_retention("acme", 30)
    await ledger.shred("globex")
    path = tmp_path / "siem.jsonl"
    made = exporter(engine, [JsonLinesSink(path)], batch=10)
    await made.round()
    events = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [(e["unmapped"]["kind"], e["activity_name"]) for e in events] == [
        ("completion", "Create"), ("hold", "Create"), ("release", "Delete"),
        ("retention-set", "Update"), ("shred", "Delete"),
    ]  # fmt: skip
    assert all(schema_errors(e) == [] for e in events)
    assert events[1]["unmapped"]["terms"]["reason"] == "case 17"


async def test_past_the_backlog_bound_the_oldest_are_skipped_counted_and_logged(
    ledger: Ledger, engine: AsyncEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await append_records(ledger, 6)
    path = tmp_path / "down" / "siem.jsonl"  # its directory is missing: the sink is down
    made = exporter(engine, [JsonLinesSink(path)], max_backlog=2, batch=10)
    with pytest.raises(SinkDown):
        await made.round()
    assert sample(made, "thinkgate_siem_dropped_events_total") == 4
    assert "records 0 to 3 are skipped" in caplog.text
    assert sample(made, "thinkgate_siem_backlog_records") == 2
    await append_records(ledger, 1, start=6)
    path.parent.mkdir()
    await made.round()
    assert exported(path) == [5, 6]  # 4 fell out of the bound when record 6 came
    assert sample(made, "thinkgate_siem_dropped_events_total") == 5
    assert sample(made, "thinkgate_siem_backlog_records") == 0


async def test_of_several_replicas_one_exports_and_each_record_goes_out_once(
    ledger: Ledger, engine: AsyncEngine, tmp_path: Path
) -> None:
    path = tmp_path / "siem.jsonl"
    replicas = [exporter(engine, [JsonLinesSink(path)], f"r{i}") for i in range(3)]
    tasks = [asyncio.create_task(r.run()) for r in replicas]
    try:
        for start in range(0, 12, 4):
            await append_records(ledger, 4, start=start)
        await eventually(lambda: len(exported(path)) >= 12, within_s=20)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert exported(path) == list(range(12))
    assert sum(r._holding for r in replicas) <= 1
