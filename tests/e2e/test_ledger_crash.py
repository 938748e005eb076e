"""Nothing acknowledged is lost: a gateway process whose database went away spools its records,
is killed with SIGKILL, and its successor replays the spool once the database is back.

The gateway runs as a real subprocess (``python -m gateway.cli serve``); PostgreSQL is real and
"goes away" by a TCP proxy in front of it being cut (``tests/tcpproxy.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

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
from tests.scrape import sample
from tests.tcpproxy import TcpProxy
from tests.waiting import eventually


async def chat(client: httpx.AsyncClient, key: str, stream: bool) -> str:
    body = {"model": "deepseek-r1", "stream": stream, "max_tokens": 20,
            "messages": [{"role": "user", "content": "marker-prompt-5d1c"}]}  # fmt: skip
    headers = {"authorization": f"Bearer {key}"}
    response = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    if stream:
        assert response.text.endswith("data: [DONE]\n\n")  # acknowledged as complete
    return response.headers["x-request-id"]


@pytest.fixture
async def proxied_postgres(postgres_url: str) -> AsyncIterator[tuple[TcpProxy, str]]:
    url = make_url(postgres_url)
    async with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        yield proxy, url.set(port=proxy.port).render_as_string(hide_password=False)


async def stored_request_ids(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            query = select(entries.c.request_id).order_by(entries.c.idx)
            return [r.request_id for r in await conn.execute(query)]
    finally:
        await engine.dispose()


async def test_spooled_records_survive_kill_9_and_are_replayed(
    tmp_path: Path, postgres_url: str, proxied_postgres: tuple[TcpProxy, str]
) -> None:
    proxy, via_proxy = proxied_postgres
    files = ledger_files(tmp_path)
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=1, itl_ms=0))) as sim:
        settings = Settings(upstreams=(f"{sim.url}/v1",), database_url=via_proxy, **files)
        ensure_keys(settings.ledger, create=True)
        key = (await make_keys(settings))["visible"]
        env = gateway_env(settings, files)
        acknowledged = []
        async with running_gateway(env) as gateway:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
                acknowledged.append(await chat(client, key, stream=True))  # warms key cache
                await proxy.stop()  # the database goes away
                for i in range(10):
                    acknowledged.append(await chat(client, key, stream=i % 2 == 0))
                # the metrics say where the records are (the spool alert's gauge)
                assert await gauge(client, "thinkgate_ledger_spool_records") >= 10
            await gateway.kill_9()

        spooled = files["audit_spool_file"].read_bytes()
        assert spooled.count(b"\n") >= 10
        assert b"marker-prompt-5d1c" not in spooled  # sealed before it touches the disk
        assert await stored_request_ids(postgres_url) == acknowledged[:1]

        await proxy.start()  # the database is back; a new gateway process starts

        async def replayed() -> bool:
            return len(await stored_request_ids(postgres_url)) >= len(acknowledged)

        async with running_gateway(env) as successor:
            await eventually(replayed, within_s=20)
            async with httpx.AsyncClient(base_url=successor.url, timeout=30) as client:
                # replayed: the spool is empty again and the tree holds every record
                assert await gauge(client, "thinkgate_ledger_spool_records") == 0
                assert await gauge(client, "thinkgate_ledger_tree_size") == len(acknowledged)
    assert await stored_request_ids(postgres_url) == acknowledged  # all, once, in order
    engine = create_engine(postgres_url)
    try:
        origin = await log_origin(settings.ledger, engine)  # the log's own name
        named = settings.model_copy(update={"audit_origin": origin})
        report = await verify(engine, NoteVerifier(verifier_key(named)), named.audit_origin)
    finally:
        await engine.dispose()
    assert report.size == len(acknowledged)


async def gauge(client: httpx.AsyncClient, name: str) -> float:
    """One unlabelled gauge of the gateway's /metrics."""
    return await sample(client, "/metrics", name)
