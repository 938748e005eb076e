"""kill -9 of a gateway process with 32 streams in flight, then a restart on the same PostgreSQL
and Redis: what the clients saw (every stream cut, none completed), what the ledger holds (every
acknowledged record, once; no (writer, sequence) twice; ``thinkgate ledger verify`` passes),
what Redis holds (the dead process's 32 leases, expiring within ``KV_LEASE_TTL_S``, then gone) and
what the new process's metrics say (its own requests only; a tree covering the old records).

The gateway runs as a real subprocess (``python -m gateway.cli serve``), with a private
``redis-server`` and a slow simulator, so the streams are still running when the process dies.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from audit.schema import entries
from gateway.db import create_engine
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from ratelimit.kvbudget import RedisKVBudgetStore
from tests.e2e.conftest import ledger_files, make_keys
from tests.e2e.processes import gateway_env, running_gateway
from tests.e2e.test_rate_limits import redis_server
from tests.waiting import eventually

STREAMS = 32
LEASE_TTL_S = 10  # KV_LEASE_TTL_S: the dead process's leases outlive it this long (default 30)
ACKNOWLEDGED = 5
THINKGATE = str(Path(sys.executable).with_name("thinkgate"))


def body(stream: bool, max_tokens: int) -> dict[str, Any]:
    return {"model": "deepseek-r1", "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "kill-nine"}]}  # fmt: skip


async def short_chat(client: httpx.AsyncClient, key: str) -> str:
    """A non-streamed request whose response arrived: acknowledged, so its record is durable."""
    response = await client.post("/v1/chat/completions", json=body(False, 8),
                                 headers={"authorization": f"Bearer {key}"})  # fmt: skip
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"]


class Stream:
    """One long stream: ``started`` once its first chunk arrived; ``outcome`` how it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.request_id = ""
        self.lines: list[str] = []

    async def run(self, client: httpx.AsyncClient, key: str) -> BaseException | None:
        headers = {"authorization": f"Bearer {key}"}
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body(True, 2000),
                                     headers=headers) as response:  # fmt: skip
                assert response.status_code == 200
                self.request_id = response.headers["x-request-id"]
                async for line in response.aiter_lines():
                    self.lines.append(line)
                    if line.startswith("data: "):
                        self.started.set()
        except httpx.TransportError as exc:
            return exc
        return None


async def ledger_rows(url: str) -> list[tuple[str, str, int]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            query = select(entries.c.request_id, entries.c.writer, entries.c.sequence)
            rows = await conn.execute(query.order_by(entries.c.idx))
            return [(r.request_id, r.writer, r.sequence) for r in rows]
    finally:
        await engine.dispose()


async def ledger_size(url: str) -> int:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(entries))).scalar_one())
    finally:
        await engine.dispose()


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """The gateway's /metrics, each sample name summed over its labels."""
    text = (await client.get("/metrics")).text
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


async def lease_expiries(client: redis.Redis, keys: Sequence[str]) -> tuple[list[float], float]:
    """The leases' expiries (ms) and Redis's own clock (ms), which the lease script uses."""
    scores = [score for _, score in await client.zrange(keys[0], 0, -1, withscores=True)]
    seconds, micros = await client.time()
    return scores, seconds * 1000 + micros / 1000


def ledger_verify(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([THINKGATE, "ledger", "verify"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip


@dataclass(frozen=True)
class Killed:
    """What process A left behind: the acknowledged ids, the streams, how each ended, and the
    tokens its leases held in Redis when it died."""

    acknowledged: list[str]
    streams: list[Stream]
    outcomes: list[BaseException | None]
    reserved: int


async def serve_then_kill_9(env: dict[str, str], key: str, budget: RedisKVBudgetStore,
                            engine_url: str) -> Killed:  # fmt: skip
    limits = httpx.Limits(max_connections=STREAMS + 8)
    async with running_gateway(env) as first, httpx.AsyncClient(
        base_url=first.url, timeout=60, limits=limits
    ) as client:  # fmt: skip
        acknowledged = [await short_chat(client, key) for _ in range(ACKNOWLEDGED)]
        streams = [Stream() for _ in range(STREAMS)]
        runs = [asyncio.create_task(s.run(client, key)) for s in streams]
        async with asyncio.timeout(20):
            await asyncio.gather(*(s.started.wait() for s in streams))
        reserved = await budget.reserved(engine_url)
        await first.kill_9()
        outcomes = await asyncio.gather(*runs)
    return Killed(acknowledged, streams, outcomes, reserved)


async def assert_ledger(url: str, env: dict[str, str], cwd: Path, expected: list[str]) -> None:
    """Every expected record exactly once and nothing else; no (writer, sequence) twice; the
    whole ledger verifies (``thinkgate ledger verify`` exits 0)."""
    rows = await ledger_rows(url)
    assert sorted(r[0] for r in rows) == sorted(expected)
    assert len({(w, s) for _, w, s in rows}) == len(rows)
    done = ledger_verify(env, cwd)
    assert done.returncode == 0, done.stdout + done.stderr


async def restart_and_serve(env: dict[str, str], key: str, kv: redis.Redis, expiries: str,
                            dead: set[str]) -> str:  # fmt: skip
    """Process B, on the same database and Redis, admits and records a request, and releases
    its lease (``expiries``: the engine's leases by expiry; ``dead``: A's, which may expire
    meanwhile); its metrics count its own requests only, and its tree covers A's records too."""
    async with running_gateway(env) as second, httpx.AsyncClient(
        base_url=second.url, timeout=30
    ) as client:  # fmt: skip
        fresh = await short_chat(client, key)
        assert set(await kv.zrange(expiries, 0, -1)) <= dead  # B released its own lease

        async def committed() -> bool:
            size = (await scrape(client)).get("thinkgate_ledger_tree_size", 0)
            return size == ACKNOWLEDGED + 1

        await eventually(committed, within_s=10)
        metrics = await scrape(client)
    assert metrics["thinkgate_requests_total"] == 1  # its own, not A's
    assert metrics["thinkgate_ledger_records_total"] == 1
    return fresh


async def test_kill_9_with_32_streams_then_restart(tmp_path: Path, postgres_url: str) -> None:
    files = ledger_files(tmp_path)
    slow = SimConfig(ttft_ms=1, itl_ms=50)  # 2,000 tokens: streams that would run for minutes
    async with redis_server() as (port, _), BackgroundServer(create_sim_app(slow)) as sim:
        engine_url = f"{sim.url}/v1"
        settings = Settings(upstreams=(engine_url,), database_url=postgres_url,
                            redis_url=f"redis://127.0.0.1:{port}/0", **files)  # fmt: skip
        ensure_keys(settings.ledger, create=True)
        key = (await make_keys(settings))["visible"]
        env = {**gateway_env(settings, files), "THINKGATE_REDIS_URL": settings.redis_url,
               "THINKGATE_KV_CAPACITY_TOKENS": "200000", "THINKGATE_AUDIT_MODE": "strict",
               "THINKGATE_ADMISSION_WAIT_MS": "0",
               "THINKGATE_KV_LEASE_TTL_S": str(LEASE_TTL_S)}  # fmt: skip
        kv = redis.Redis(port=port, decode_responses=True)
        budget = RedisKVBudgetStore(kv)
        try:
            killed = await serve_then_kill_9(env, key, budget, engine_url)

            # Redis, first (the leases' TTL is short): the dead process's 32 leases are still
            # held, all expiring within the TTL.
            keys = budget.keys(engine_url)
            scores, now_ms = await lease_expiries(kv, keys)
            assert len(scores) == STREAMS
            assert all(now_ms < s <= now_ms + LEASE_TTL_S * 1000 for s in scores), (now_ms, scores)
            assert await budget.reserved(engine_url) == killed.reserved > 0
            dead = set(await kv.zrange(keys[0], 0, -1))

            # The client: every stream was cut mid-way, after its first chunk; none got [DONE].
            assert all(isinstance(o, httpx.RemoteProtocolError | httpx.ReadError)
                       for o in killed.outcomes), killed.outcomes  # fmt: skip
            for stream in killed.streams:
                assert stream.request_id and "data: [DONE]" not in stream.lines
                assert any(line.startswith("data: ") for line in stream.lines)

            # The ledger: every acknowledged record, once; nothing of the cut streams (strict
            # mode writes a record when its request ends, which these never did).
            await assert_ledger(postgres_url, env, tmp_path, killed.acknowledged)

            fresh = await restart_and_serve(env, key, kv, keys[0], dead)

            # The dead leases expire by themselves (on Redis's clock, as the lease script's).
            async def expired() -> bool:
                return await budget.reserved(engine_url) == 0

            await eventually(expired, within_s=(max(scores) - now_ms) / 1000 + 5, every=0.5)
            assert not await kv.zrange(keys[0], 0, -1)
        finally:
            await kv.aclose()
    await assert_ledger(postgres_url, env, tmp_path, [*killed.acknowledged, fresh])
    assert await ledger_size(postgres_url) == ACKNOWLEDGED + 1
