"""The gateway's database goes away (PostgreSQL behind a proxy that is cut): known keys go on
being served, their records spooled and written once it is back; whatever needs the database
is answered 503 with ``retry-after`` in the endpoint's own shape; never a 500; the outage is
logged once, not per request. (Two replicas and a PostgreSQL killed under load:
``tests/e2e/test_replica_faults.py``.)"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from audit.schema import entries
from gateway.db import create_engine
from tests.e2e.conftest import Stack, StackFactory
from tests.tcpproxy import TcpProxy
from tests.waiting import eventually

CHAT = {"model": "deepseek-r1", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@dataclass(frozen=True, slots=True)
class Outage:
    stack: Stack
    proxy: TcpProxy
    database_url: str


@pytest.fixture
async def outage(stack_factory: StackFactory, postgres_url: str) -> AsyncIterator[Outage]:
    url = make_url(postgres_url)
    async with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
        stack = await stack_factory(database_url=proxied)
        yield Outage(stack, proxy, postgres_url)


async def post(stack: Stack, path: str, key: str, stream: bool = False) -> httpx.Response:
    body = {**CHAT, "stream": stream}
    async with httpx.AsyncClient(base_url=stack.root, timeout=30) as client:
        return await client.post(path, json=body, headers={"authorization": f"Bearer {key}"})


async def recorded(database_url: str, request_ids: list[str]) -> bool:
    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            query = select(entries.c.request_id).where(entries.c.request_id.in_(request_ids))
            return len((await conn.execute(query)).all()) == len(request_ids)
    finally:
        await engine.dispose()


async def test_known_keys_are_served_the_rest_gets_503_in_its_own_shape(
    outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    stack, keys = outage.stack, outage.stack.keys
    for path in ("/v1/chat/completions", "/v1/messages"):  # the keys are now in the cache
        assert (await post(stack, path, keys["visible"])).status_code == 200
    admin = {"authorization": f"Bearer {keys['admin']}"}
    async with httpx.AsyncClient(base_url=stack.root, timeout=30) as client:
        assert (await client.get("/admin/v1/keys", headers=admin)).status_code == 200
    caplog.set_level(logging.INFO)
    await outage.proxy.stop()
    answered = []
    for stream in (False, True):
        for path in ("/v1/chat/completions", "/v1/messages"):
            response = await post(stack, path, keys["visible"], stream)
            assert response.status_code == 200, response.text
            answered.append(response.headers["x-request-id"])
    chat = await post(stack, "/v1/chat/completions", keys["hidden"])  # never looked up here
    assert chat.status_code == 503 and chat.headers["retry-after"] == "1"
    assert chat.json()["error"]["code"] == "database_unavailable"
    assert chat.json()["error"]["type"] == "service_unavailable"
    messages = await post(stack, "/v1/messages", keys["other"])
    assert messages.status_code == 503 and messages.headers["retry-after"] == "1"
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "overloaded_error"
    async with httpx.AsyncClient(base_url=stack.root, timeout=30) as client:
        # a known key on a route whose work needs the database (no layer of its own translates)
        listing = await client.get("/admin/v1/keys", headers=admin)
        assert listing.status_code == 503 and listing.headers["retry-after"] == "1"
        assert listing.json()["error"]["code"] == "database_unavailable"
    text = caplog.text
    assert "unhandled error" not in text and "Traceback" not in text
    assert sum("database is unreachable" in r.getMessage() for r in caplog.records) == 1
    await outage.proxy.start()
    await eventually(lambda: recorded(outage.database_url, answered), within_s=30)

    async def served() -> bool:  # as its retry-after says: within a second or so
        return (await post(stack, "/v1/chat/completions", keys["hidden"])).status_code == 200

    await eventually(served, within_s=10, every=0.2)
    assert any("answers again" in r.getMessage() for r in caplog.records)
