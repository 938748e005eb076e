"""Two gateway processes, one PostgreSQL: both record every completion into one ledger, with
contiguous indexes and one verifiable history (the sequencer's advisory lock at work)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from sqlalchemy import select

from audit.note import NoteVerifier
from audit.schema import entries
from audit.verify import verify
from gateway.cli.ledger import verifier_key
from gateway.db import create_engine
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys, log_origin
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import ledger_files, make_keys
from tests.e2e.processes import gateway_env, running_gateway

PER_REPLICA = 24


async def burst(url: str, key: str) -> list[str]:
    """``PER_REPLICA`` completions, 8 at a time, streamed and not; their request ids."""
    headers = {"authorization": f"Bearer {key}"}
    limit = asyncio.Semaphore(8)

    async def one(client: httpx.AsyncClient, i: int) -> str:
        body = {"model": "deepseek-r1", "stream": i % 2 == 0, "max_tokens": 16,
                "messages": [{"role": "user", "content": f"question {i}"}]}  # fmt: skip
        async with limit:
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        return response.headers["x-request-id"]

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(PER_REPLICA))))


async def test_two_replicas_share_one_ledger(tmp_path: Path, postgres_url: str) -> None:
    files = ledger_files(tmp_path)
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=5, itl_ms=1))) as sim:
        settings = Settings(upstreams=(f"{sim.url}/v1",), database_url=postgres_url, **files)
        ensure_keys(settings.ledger, create=True)
        key = (await make_keys(settings))["visible"]
        env = gateway_env(settings, files)
        async with running_gateway(env) as first, running_gateway(env) as second:
            ids = await asyncio.gather(burst(first.url, key), burst(second.url, key))

    engine = create_engine(postgres_url)
    try:
        async with engine.connect() as conn:
            query = select(entries.c.idx, entries.c.request_id, entries.c.writer)
            rows = (await conn.execute(query.order_by(entries.c.idx))).all()
        origin = await log_origin(settings.ledger, engine)  # the log's own name
        named = settings.model_copy(update={"audit_origin": origin})
        verifier = NoteVerifier(verifier_key(named))
        report = await verify(engine, verifier, named.audit_origin)
    finally:
        await engine.dispose()
    assert [r.idx for r in rows] == list(range(2 * PER_REPLICA))
    assert sorted(r.request_id for r in rows) == sorted(ids[0] + ids[1])
    assert len({r.writer for r in rows}) == 2  # both processes sequenced records
    assert report.size == 2 * PER_REPLICA
