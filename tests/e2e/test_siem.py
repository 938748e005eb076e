"""The SIEM export end to end (docs/siem.md): the gateway on real sockets, completions through
the openai SDK, and every ledger record arriving as an OCSF API Activity event that the OCSF
schema accepts, whose integrity fields match the ledger's rows and checkpoints, carrying no
prompt or answer text: at a real rsyslogd over TCP (through a restart of the receiver and of
the gateway, losing nothing), in a JSON-lines file, at a Splunk HEC stand-in; and the backlog
bound skipping ahead, counted."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
from sqlalchemy import select

from audit.schema import checkpoints, entries
from gateway.app import create_app
from gateway.db import create_engine
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.siem.syslog import timestamp
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import StackFactory, ledger_files, make_keys
from tests.e2e.rsyslog import Rsyslog
from tests.gateway.side.siem.test_sinks import Collector, split_objects
from tests.ocsf import schema_errors
from tests.scrape import sample
from tests.waiting import eventually

MARKER = "zebra-umbrella-7731"  # in every prompt: no event may carry it
BATCH = 3


@dataclass(frozen=True)
class LedgerState:
    rows: dict[int, tuple[bytes, str, str]]  # index -> (leaf hash, kind, request id)
    roots: dict[int, bytes]  # checkpoint size -> root hash


async def ledger_state(database_url: str) -> LedgerState:
    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(entries.c.idx, entries.c.leaf_hash, entries.c.kind, entries.c.request_id)
            )
            found = {int(r.idx): (bytes(r.leaf_hash), str(r.kind), str(r.request_id))
                     for r in rows}  # fmt: skip
            heads = await conn.execute(select(checkpoints.c.size, checkpoints.c.root))
            roots = {int(size): bytes(root) for size, root in heads}
    finally:
        await engine.dispose()
    return LedgerState(found, roots)


def check_event(event: dict[str, Any], ledger: LedgerState) -> int:
    """Assert ``event`` is a valid OCSF 6003 event of its ledger row; its leaf index."""
    assert schema_errors(event) == []
    integrity = event["unmapped"]["integrity"]
    index = integrity["leaf_index"]
    leaf_hash, kind, request_id = ledger.rows[index]
    assert integrity["leaf_hash"] == leaf_hash.hex()
    size, root = integrity["checkpoint"]["tree_size"], integrity["checkpoint"]["root_hash"]
    assert index < size and ledger.roots[size].hex() == root  # a checkpoint that includes it
    assert (event["unmapped"]["kind"], event["api"]["request"]["uid"]) == (kind, request_id)
    assert event["metadata"]["sequence"] == index
    assert MARKER not in orjson.dumps(event).decode()
    return int(index)


async def complete(url: str, key: str, count: int, *, stream: bool = False) -> list[Any]:
    """``count`` completions through the openai SDK, each prompt carrying ``MARKER``."""
    answers = []
    async with openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0) as client:
        for i in range(count):
            messages: Any = [{"role": "user", "content": f"{MARKER} question {i}"}]
            if stream:
                chunks = await client.chat.completions.create(
                    model="deepseek-r1", messages=messages, max_tokens=16, stream=True
                )
                answers.append([chunk async for chunk in chunks])
            else:
                answers.append(await client.chat.completions.create(
                    model="deepseek-r1", messages=messages, max_tokens=16))  # fmt: skip
    return answers


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def indexes(events: list[dict[str, Any]]) -> list[int]:
    return [int(e["unmapped"]["integrity"]["leaf_index"]) for e in events]


async def test_rsyslog_receives_every_record_and_restarts_lose_none(tmp_path: Path) -> None:
    rsyslog = Rsyslog(tmp_path / "rsyslog")
    await rsyslog.start()
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    try:
        async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=1, itl_ms=1))) as sim:
            settings = Settings(
                upstreams=(f"{sim.url}/v1",), database_url=database_url, models_cache_ttl_s=0,
                siem_syslog_url=rsyslog.url, siem_interval_s=0.05, siem_batch=BATCH,
                **ledger_files(tmp_path),
            )  # fmt: skip
            ensure_keys(settings.ledger, create=True)
            keys = await make_keys(settings)
            async with BackgroundServer(create_app(settings)) as gateway:
                await complete(f"{gateway.url}/v1", keys["visible"], 4)
                async with httpx.AsyncClient(base_url=gateway.url) as client:
                    read = await client.get(
                        "/audit/v1/records/0",  # an auditor's access record
                        headers={"authorization": f"Bearer {keys['auditor']}"},
                    )
                    assert read.status_code == 200
                    await eventually(lambda: len(rsyslog.received()) >= 5, within_s=20)
                    # the receiver goes away; records made meanwhile wait in the ledger
                    rsyslog.stop()
                    await complete(f"{gateway.url}/v1", keys["visible"], 3)
                    failed = (
                        "thinkgate_siem_events_total",
                        {"sink": "syslog", "outcome": "failed"},
                    )

                    async def refused() -> bool:
                        return await sample(client, "/metrics", failed[0], **failed[1]) > 0

                    await eventually(refused, within_s=20)
            first = rsyslog.received()
            # the gateway stopped (its lease released); the receiver and the gateway come back
            await rsyslog.start()
            async with BackgroundServer(create_app(settings)) as gateway:
                await complete(f"{gateway.url}/v1", keys["hidden"], 2, stream=True)
                ledger = await ledger_state(database_url)
                await eventually(lambda: set(indexes([m.event for m in rsyslog.received()]))
                                 >= set(ledger.rows), within_s=30)  # fmt: skip
    finally:
        rsyslog.stop()

    ledger = await ledger_state(database_url)
    assert len(ledger.rows) == 10  # 4 + the access + 3 while rsyslog was down + 2
    assert indexes([m.event for m in first]) == list(range(5))
    received = rsyslog.received()
    seen = Counter(check_event(m.event, ledger) for m in received)
    assert set(seen) == set(ledger.rows)  # no loss across both restarts
    assert sum(seen.values()) - len(seen) <= BATCH  # duplicates: one batch window at most
    for m in received:  # what rsyslog parsed out of the RFC 5424 header
        assert (m.app_name, m.msgid, m.facility) == ("thinkgate", m.event["unmapped"]["kind"], 13)
        assert m.severity == (5 if m.msgid == "access" else 6)  # Low -> notice, Info -> info
        assert m.timestamp == timestamp(m.event["time"])
    access = [m.event for m in received if m.msgid == "access"]
    assert [(e["activity_id"], e["unmapped"]["subject"]) for e in access] == [(2, 0)]


async def test_a_file_sink_gets_each_record_as_a_valid_event_without_its_text(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    path = tmp_path / "siem.jsonl"
    stack = await stack_factory(siem_file=path, siem_interval_s=0.05)
    answers = await complete(stack.url, stack.keys["visible"], 3)
    await complete(stack.url, stack.keys["hidden"], 1, stream=True)
    await eventually(lambda: len(lines(path)) >= 4, within_s=20)
    ledger = await ledger_state(f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    events = lines(path)
    assert sorted(check_event(e, ledger) for e in events) == [0, 1, 2, 3]
    text = path.read_text()
    for answer in answers:
        message = answer.choices[0].message
        for said in (message.content, (message.model_extra or {}).get("reasoning_content")):
            assert not said or said not in text
    first = events[0]
    assert (first["activity_id"], first["api"]["operation"]) == (1, "chat.completions")
    assert first["actor"]["user"]["account"]["uid"] == "acme"
    usage = answers[0].usage
    assert first["unmapped"]["usage"]["prompt_tokens"] == usage.prompt_tokens
    assert first["unmapped"]["usage"]["completion_tokens"] == usage.completion_tokens


async def test_a_hec_endpoint_gets_batches_with_the_splunk_token(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    collector = Collector(503)  # the first batch is refused, and sent again
    async with BackgroundServer(collector) as hec:
        stack = await stack_factory(siem_hec_url=f"{hec.url}/services/collector/event",
                                    siem_hec_token="hec-token-2", siem_interval_s=0.05)  # fmt: skip
        await complete(stack.url, stack.keys["visible"], 3)

        def accepted() -> list[dict[str, Any]]:
            return [obj for (_, body), status in zip(collector.posts, collector.answered,
                                                     strict=True) if status == 200
                    for obj in split_objects(body)]  # fmt: skip

        await eventually(lambda: len(accepted()) >= 3, within_s=20)
    ledger = await ledger_state(f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    assert collector.answered[0] == 503
    assert set(collector.paths) == {"/services/collector/event"}
    for headers, _ in collector.posts:
        assert headers["authorization"] == "Splunk hec-token-2"
    objects = accepted()
    assert sorted(check_event(o["event"], ledger) for o in objects) == [0, 1, 2]
    for obj in objects:
        assert set(obj) == {"time", "host", "source", "sourcetype", "event"}
        assert obj["sourcetype"] == "ocsf:api_activity"
        assert round(obj["time"] * 1000) == obj["event"]["time"]


async def test_past_the_backlog_bound_the_export_skips_ahead_and_counts(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    path = tmp_path / "later" / "siem.jsonl"  # its directory does not exist yet: a sink down
    stack = await stack_factory(siem_file=path, siem_max_backlog=3, siem_interval_s=0.05)
    await complete(stack.url, stack.keys["visible"], 6)
    async with httpx.AsyncClient(base_url=stack.root) as client:

        async def dropped(expected: float) -> bool:
            found = await sample(client, "/metrics", "thinkgate_siem_dropped_events_total")
            return found == expected

        await eventually(lambda: dropped(3), within_s=20)
        path.parent.mkdir()
        await eventually(lambda: len(lines(path)) >= 3, within_s=20)
        assert await dropped(3)

        async def caught_up() -> bool:
            return await sample(client, "/metrics", "thinkgate_siem_backlog_records") == 0

        await eventually(caught_up, within_s=10)
    assert indexes(lines(path)) == [3, 4, 5]  # the newest SIEM_MAX_BACKLOG records
