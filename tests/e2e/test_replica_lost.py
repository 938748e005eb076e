"""No answer without its record when a replica dies (issue 39): two real replica processes on
PostgreSQL + Redis, 16 streams on one of them past their first chunk, then ``kill -9``.

- With the database up, the survivor appends one ``replica_lost`` record per stream within
  ``BACKGROUND_STALE_S`` and a sweep's interval (6 s here and about a second, the beat's
  tick; the default's 30 s and 2.5 s would only wait longer) and a few seconds: the request
  (readable by the
  auditor), the engine it ran on, its first token and the tokens streamed so far; no request
  twice; ``thinkgate ledger verify`` passes.
- With the database away during the kill, the intents are in the dead replica's spool only:
  started again on it (as a pod restarts on its volume), the replica replays them and records
  the same 16 ``replica_lost`` records (with what the intents say: its beats never reached
  the database, so no engine or first token).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import func, select

from audit.schema import entries, intents
from gateway.db import create_engine
from tests.e2e.load import RawRequest, request_body
from tests.e2e.processes import run_cli
from tests.e2e.test_replica_faults import (  # noqa: F401 - the fixture
    Cluster,
    ClusterFactory,
    cluster_factory,
    metric,
)
from tests.waiting import eventually

pytestmark = [pytest.mark.xdist_group("private_postgres"), pytest.mark.timeout(150)]

STREAMS = 16
STALE_S = 6  # BACKGROUND_STALE_S: how long a replica may go without a beat
# some 100 s of answer: none of them can end before the kill
LONG = {**request_body(True, max_tokens=2000), "sim": {"itl_ms": 50}}


async def held_streams(cluster: Cluster, url: str) -> dict[str, RawRequest]:
    """``STREAMS`` streams on ``url`` by request id, each past its first chunk."""
    tag = secrets.token_hex(4)
    ids = [f"lost-{tag}-{i:02d}" for i in range(STREAMS)]
    held = {rid: await cluster.raw(url, "visible", LONG, rid) for rid in ids}
    await asyncio.gather(*(request.read_events(2) for request in held.values()))
    return held


async def lost_rows(cluster: Cluster) -> list[Any]:
    engine = create_engine(cluster.database_url)
    try:
        async with engine.connect() as conn:
            query = select(entries.c.idx, entries.c.request_id, entries.c.status,
                           entries.c.header).where(entries.c.kind == "completion")  # fmt: skip
            return list((await conn.execute(query.order_by(entries.c.idx))).all())
    finally:
        await engine.dispose()


async def pending_intents(cluster: Cluster, *, started: bool = False) -> int:
    """Intents in the database (``started``: those whose progress has a first token)."""
    engine = create_engine(cluster.database_url)
    try:
        async with engine.connect() as conn:
            if not started:
                count = select(func.count()).select_from(intents)
                return int((await conn.execute(count)).scalar_one())
            rows = (await conn.execute(select(intents.c.progress))).all()
            return sum(bool(r.progress and orjson.loads(r.progress).get("first_token_at"))
                       for r in rows)  # fmt: skip
    finally:
        await engine.dispose()


async def recorded(cluster: Cluster, held: dict[str, RawRequest]) -> bool:
    return sum(r.request_id in held for r in await lost_rows(cluster)) >= len(held)


async def assert_lost_once_each(cluster: Cluster, held: dict[str, RawRequest]) -> None:
    """One ``replica_lost`` record per cut stream, with what was known; none twice; the
    auditor reads the request of each; ``ledger verify`` passes."""
    ids = set(held)
    rows = [r for r in await lost_rows(cluster) if r.request_id in ids]
    assert Counter(r.request_id for r in rows) == Counter(ids)  # each once
    for row in rows:
        header = orjson.loads(row.header)
        assert row.status == header["error_code"] == "replica_lost"
        assert header["endpoint"] == "chat.completions" and header["stream"] is True
        assert header["usage"]["counted"] is True
    assert await pending_intents(cluster) == 0
    code, output = await run_cli(cluster.env, "ledger", "verify", cwd=str(cluster.tmp))
    assert code == 0, output
    auditor = {"authorization": f"Bearer {cluster.keys['auditor']}"}
    async with httpx.AsyncClient(headers=auditor, timeout=10) as http:
        opened = await http.get(f"{cluster.gateways[1].url}/audit/v1/records/{rows[0].idx}")
    assert opened.status_code == 200, opened.text
    assert opened.json()["body"]["messages"] == LONG["messages"]


async def test_a_killed_replicas_streams_are_recorded_by_the_survivor(
    cluster_factory: ClusterFactory,  # noqa: F811
) -> None:
    cluster = await cluster_factory(THINKGATE_BACKGROUND_STALE_S=str(STALE_S))
    doomed, survivor = cluster.gateways
    held = await held_streams(cluster, doomed.url)
    # the owner's beat has told the database of each stream's first token (within a second)
    await eventually(lambda: _at_least(pending_intents(cluster, started=True), STREAMS), 10)
    await doomed.kill_9()
    killed_at = time.monotonic()
    for request in held.values():  # cut: neither [DONE] nor an error event
        await request.read_to_end()
        assert b"[DONE]" not in request.received and b"event: error" not in request.received

    await eventually(lambda: recorded(cluster, held), within_s=STALE_S * 13 / 12 + 10)
    assert time.monotonic() - killed_at < STALE_S * 13 / 12 + 5
    await assert_lost_once_each(cluster, held)
    assert await metric(survivor.url, "thinkgate_ledger_replica_lost_total") == STREAMS
    for row in await lost_rows(cluster):  # what the owner's last beat knew
        header = orjson.loads(row.header)
        assert header["upstream"] == cluster.engine_url
        assert header["first_token_at"] >= header["started_at"]
        assert header["usage"]["completion_tokens"] >= 1


async def test_spooled_intents_of_a_replica_killed_while_the_database_is_away(
    cluster_factory: ClusterFactory,  # noqa: F811
) -> None:
    cluster = await cluster_factory(THINKGATE_BACKGROUND_STALE_S="4")
    doomed, _ = cluster.gateways
    bearer = {"authorization": f"Bearer {cluster.keys['visible']}"}
    async with httpx.AsyncClient(headers=bearer, timeout=10) as http:  # the key, cached
        seen = await http.post(f"{doomed.url}/v1/chat/completions", json=request_body(False))
    assert seen.status_code == 200, seen.text
    await asyncio.to_thread(cluster.pg.kill)
    held = await held_streams(cluster, doomed.url)  # their intents go to its spool
    await doomed.kill_9()
    assert await _spooled_intents(cluster) == STREAMS
    await asyncio.to_thread(cluster.pg.start)
    back_at = time.monotonic()
    await cluster.start_replica(0)  # the dead one's spool, replayed by its successor
    await eventually(lambda: recorded(cluster, held), within_s=35)
    assert time.monotonic() - back_at < 35
    await assert_lost_once_each(cluster, held)


async def _at_least(count: Any, wanted: int) -> bool:
    return int(await count) >= wanted


async def _spooled_intents(cluster: Cluster) -> int:
    """The intent lines in replica 0's spool file (read without opening it as a spool)."""
    from audit.spool import decode_line

    path = cluster.tmp / "spool-0.log"
    lines = path.read_bytes().split(b"\n")[:-1]
    return sum((decode_line(line) or b"")[:1] == b"I" for line in lines)
