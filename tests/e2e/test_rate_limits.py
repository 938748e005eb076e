"""Per-key rate limits through the real gateway: OpenAI's 429 body and headers, the openai SDK's
own RateLimitError and retry, one limit shared by two gateway processes through one Redis, and
a Redis that dies mid-run (a private ``redis-server`` on a free port)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.cli.keys import open_store
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings, TenantPolicy
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import Stack, StackFactory, ledger_files
from tests.e2e.processes import gateway_env, running_gateway
from tests.gateway.cli.test_main import free_port
from tests.scrape import sample
from tests.waiting import eventually

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
Process = subprocess.Popen[bytes]


async def limited_key(stack: Stack, database_url: str, **limits: int) -> str:
    settings = Settings(database_url=database_url)
    async with open_store(settings) as store:
        new, _ = await store.create(tenant="acme", role="client", **limits)
    return new.secret


async def chat(url: str, key: str, **body: Any) -> httpx.Response:
    payload = {"model": "deepseek-r1", "messages": MESSAGES, "max_tokens": 8, **body}
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(f"{url}/chat/completions", json=payload,
                                 headers={"authorization": f"Bearer {key}"})  # fmt: skip


async def stream_status(url: str, key: str, **body: Any) -> int:
    """The status of a streamed request, which is closed at once: admission happens before
    the first byte, so the status says whether it was admitted, without waiting for the end."""
    payload = {"model": "deepseek-r1", "messages": MESSAGES, "stream": True, **body}
    async with httpx.AsyncClient(timeout=30) as client, client.stream(
        "POST", f"{url}/chat/completions", json=payload,
        headers={"authorization": f"Bearer {key}"},
    ) as response:  # fmt: skip
        return response.status_code


def database(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"


async def test_requests_over_the_limit_get_openais_429(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await stack_factory(sim=SimConfig(ttft_ms=1, itl_ms=0))
    key = await limited_key(stack, database(tmp_path), rpm=2, tpm=10_000)
    first = await chat(stack.url, key)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-limit-tokens"] == "10000"
    streamed = await chat(stack.url, key, stream=True)
    assert streamed.status_code == 200 and streamed.headers["x-ratelimit-remaining-requests"] == "0"
    refused = await chat(stack.url, key)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded"
    assert error["param"] is None
    assert re.fullmatch(
        r"Rate limit reached for key [0-9a-f]{12} on requests per min \(RPM\): Limit 2, "
        r"Used 2, Requested 1\. Please try again in [0-9.]+s\.",
        error["message"],
    )
    assert 20 <= int(refused.headers["retry-after"]) <= 31  # one request back every 30 s
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


async def test_a_request_larger_than_the_token_budget_is_refused_on_tokens(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await stack_factory(sim=SimConfig(ttft_ms=1, itl_ms=0))
    key = await limited_key(stack, database(tmp_path), tpm=300)
    ok = await chat(stack.url, key, max_tokens=100)
    assert ok.status_code == 200
    # Settled with real usage: the unused part of the reservation came back.
    after = await chat(stack.url, key, max_tokens=100)
    assert after.status_code == 200
    assert int(after.headers["x-ratelimit-remaining-tokens"]) > 0
    refused = await chat(stack.url, key, max_tokens=1000)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "tokens"
    assert "tokens per min (TPM): Limit 300" in refused.json()["error"]["message"]


async def test_the_openai_sdk_raises_and_retries(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await stack_factory(sim=SimConfig(ttft_ms=1, itl_ms=0))
    key = await limited_key(stack, database(tmp_path), rpm=60)  # one back every second
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=key, max_retries=0) as client:
        burst = [client.chat.completions.create(model="deepseek-r1", messages=MESSAGES,
                                                max_tokens=4) for _ in range(80)]  # fmt: skip
        outcomes = await asyncio.gather(*burst, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert refused and all(isinstance(o, openai.RateLimitError) for o in refused), refused[:1]
    assert all(o.status_code == 429 for o in refused if isinstance(o, openai.RateLimitError))
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=key, max_retries=3) as retrying:
        done = await retrying.chat.completions.create(model="deepseek-r1", messages=MESSAGES,
                                                      max_tokens=4)  # fmt: skip
    assert done.choices  # the SDK waited retry-after-ms, then got through


# -- Redis: shared by replicas, and failing --------------------------------------------------


@contextlib.contextmanager
def private_redis(port: int | None = None) -> Iterator[tuple[int, Process]]:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = port or free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield port, proc
    finally:
        proc.kill()
        proc.wait()


async def redis_answers(port: int) -> bool:
    import redis.asyncio as redis

    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    try:
        return bool(await client.ping())
    except (OSError, redis.RedisError):
        return False
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def redis_server(
    port: int | None = None,
) -> AsyncIterator[tuple[int, subprocess.Popen[bytes]]]:
    with private_redis(port) as (bound, proc):
        await eventually(lambda: redis_answers(bound), within_s=10)
        yield bound, proc


async def limit_keys(port: int) -> list[bytes]:
    import redis.asyncio as redis

    client = redis.Redis(port=port)
    try:
        return list(await client.keys("*rl:*"))
    finally:
        await client.aclose()


async def test_two_gateway_processes_share_one_limit(tmp_path: Path) -> None:
    files = ledger_files(tmp_path)
    async with redis_server() as (port, _), BackgroundServer(create_sim_app(SimConfig())) as sim:
        settings = Settings(upstreams=(f"{sim.url}/v1",), database_url=database(tmp_path),
                            redis_url=f"redis://127.0.0.1:{port}/0", **files)  # fmt: skip
        ensure_keys(settings.ledger, create=True)
        async with open_store(settings) as store:
            key = (await store.create(tenant="acme", role="client", rpm=4))[0].secret
        env = {**gateway_env(settings, files), "THINKGATE_REDIS_URL": settings.redis_url}
        async with running_gateway(env) as first, running_gateway(env) as second:
            statuses = [(await chat(f"{gw.url}/v1", key)).status_code
                        for gw in (first, second, first, second, first, second)]  # fmt: skip
    assert statuses == [200, 200, 200, 200, 429, 429]  # one budget of 4, not 4 per replica


async def test_a_dead_redis_fails_open_then_recovers(stack_factory: StackFactory,
                                                     tmp_path: Path) -> None:  # fmt: skip
    async with redis_server() as (port, proc):
        stack = await stack_factory(sim=SimConfig(ttft_ms=1, itl_ms=0),
                                    redis_url=f"redis://127.0.0.1:{port}/0")  # fmt: skip
        # 3 RPM: a bucket that stays in Redis for 20 s after one request (a larger limit
        # refills, and its key expires, within milliseconds).
        key = await limited_key(stack, database(tmp_path), rpm=3)
        assert (await chat(stack.url, key)).status_code == 200
        assert await limit_keys(port)  # the shared limit lives in Redis
        proc.kill()
        proc.wait()
        # Fail open: served, with in-process limits on this replica, and the metrics say so.
        assert (await chat(stack.url, key)).status_code == 200
        assert await fallback(stack) == 1
    async with redis_server(port):  # Redis is back, empty, on the same address

        async def shared_again() -> bool:
            assert (await chat(stack.url, key)).status_code in (200, 429)
            return bool(await limit_keys(port))

        await eventually(shared_again, within_s=10, every=0.2)
        assert await fallback(stack) == 0  # the alert's gauge clears with the outage


async def fallback(stack: Stack) -> float:
    """``thinkgate_ratelimit_fallback_active{backend="rate_limits"}`` as scraped."""
    async with httpx.AsyncClient(timeout=10) as client:
        name = "thinkgate_ratelimit_fallback_active"
        return await sample(client, f"{stack.root}/metrics", name, backend="rate_limits")


async def test_a_dead_redis_fails_closed_when_configured(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    async with redis_server() as (port, proc):
        stack = await stack_factory(sim=SimConfig(ttft_ms=1, itl_ms=0), ratelimit_fail="closed",
                                    redis_url=f"redis://127.0.0.1:{port}/0")  # fmt: skip
        key = await limited_key(stack, database(tmp_path), rpm=1000)
        assert (await chat(stack.url, key)).status_code == 200
        proc.kill()
        proc.wait()
        refused = await chat(stack.url, key)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "service_unavailable"


async def test_two_gateway_processes_share_one_kv_budget(tmp_path: Path) -> None:
    """A fixed capacity of 1,000 tokens admits 850 (0.85), 765 of them for standard work. A
    stream holding ~540 tokens through one process leaves no room for a second one through the
    other process; when the stream ends, the other process admits."""
    files = ledger_files(tmp_path)
    slow = SimConfig(ttft_ms=1, itl_ms=30)
    async with redis_server() as (port, _), BackgroundServer(create_sim_app(slow)) as sim:
        settings = Settings(upstreams=(f"{sim.url}/v1",), database_url=database(tmp_path),
                            redis_url=f"redis://127.0.0.1:{port}/0", **files)  # fmt: skip
        ensure_keys(settings.ledger, create=True)
        async with open_store(settings) as store:
            key = (await store.create(tenant="acme", role="client"))[0].secret
        env = {**gateway_env(settings, files), "THINKGATE_REDIS_URL": settings.redis_url,
               "THINKGATE_KV_CAPACITY_TOKENS": "1000",
               "THINKGATE_ADMISSION_WAIT_MS": "0"}  # fmt: skip
        async with running_gateway(env) as first, running_gateway(env) as second:
            body = {"model": "deepseek-r1", "messages": MESSAGES, "max_tokens": 500}
            headers = {"authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(timeout=30) as client, client.stream(
                "POST", f"{first.url}/v1/chat/completions", headers=headers,
                json={**body, "stream": True},
            ) as held:  # fmt: skip
                assert held.status_code == 200
                refused = await chat(f"{second.url}/v1", key, max_tokens=500)
                assert refused.status_code == 429, refused.text
                assert refused.json()["error"]["code"] == "kv_budget_exhausted"
                assert refused.headers["retry-after"] == "1"
                assert "server" not in refused.headers  # thinkgate serve sends no server header
                # what still fits is admitted
                assert await stream_status(f"{second.url}/v1", key, max_tokens=100) == 200

            # the stream is closed: its lease is released, the other process admits again
            async def admitted() -> bool:
                return await stream_status(f"{second.url}/v1", key, max_tokens=500) == 200

            await eventually(admitted, within_s=10, every=0.1)


async def test_a_tenant_limit_binds_all_its_keys(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    tenants = {"acme": TenantPolicy(rpm=3)}
    stack = await stack_factory(sim=SimConfig(ttft_ms=1, itl_ms=0), tenants=tenants)
    first = await limited_key(stack, database(tmp_path))  # the keys themselves are unlimited
    second = await limited_key(stack, database(tmp_path))
    statuses = []
    for key in (first, second, first, second):
        response = await chat(stack.url, key)
        statuses.append(response.status_code)
    assert statuses == [200, 200, 200, 429]
    body = response.json()["error"]
    assert body["type"] == "requests" and body["code"] == "rate_limit_exceeded"
    assert body["message"].startswith(
        "Rate limit reached for organization acme on requests per min (RPM): Limit 3, Used 3, "
        "Requested 1. Please try again in"
    )
    assert response.headers["x-ratelimit-limit-requests"] == "3"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"


async def test_the_ratelimit_headers_come_with_an_upstream_failure_too(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await stack_factory(sim=SimConfig(error_rate=1.0))
    key = await limited_key(stack, database(tmp_path), rpm=10, tpm=100_000)
    failed = await chat(stack.url, key)
    assert failed.status_code >= 500
    assert failed.headers["x-ratelimit-limit-requests"] == "10"
    assert failed.headers["x-ratelimit-remaining-requests"] == "9"
    assert failed.headers["x-ratelimit-limit-tokens"] == "100000"


async def test_priority_is_granted_per_key_not_claimed(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await stack_factory(sim=SimConfig(ttft_ms=1, itl_ms=0))
    key = await limited_key(stack, database(tmp_path))
    claimed = await chat_with(stack.url, key, {"x-thinkgate-priority": "critical"})
    assert claimed.status_code == 403
    assert claimed.json()["error"]["code"] == "priority_not_allowed"
    lowered = await chat_with(stack.url, key, {"x-thinkgate-priority": "sheddable"})
    assert lowered.status_code == 200
    wrong = await chat_with(stack.url, key, {"x-thinkgate-priority": "urgent"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "x-thinkgate-priority"


async def chat_with(url: str, key: str, headers: dict[str, str]) -> httpx.Response:
    payload = {"model": "deepseek-r1", "messages": MESSAGES, "max_tokens": 8}
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(f"{url}/chat/completions", json=payload,
                                 headers={"authorization": f"Bearer {key}", **headers})  # fmt: skip


async def test_the_engines_own_kv_usage_makes_the_gateway_admit_less(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    """The gateway learns the simulator's capacity from its /metrics (4,096 tokens: 3,481
    admitted). Someone else fills the engine's cache directly; vLLM-style usage passes 0.85,
    the gateway shrinks its budget, and a request it admitted a moment ago is now refused."""
    sim = create_sim_app(SimConfig(kv_capacity_tokens=4096, block_size=16, itl_ms=50))
    async with BackgroundServer(sim) as engine:
        stack = await stack_factory(extra_upstreams=(f"{engine.url}/v1",), admission_wait_ms=0)
        key = stack.keys["hidden"]

        async def capacity_known() -> bool:  # more than capacity × 0.85 can never fit
            return await stream_status(stack.url, key, max_tokens=4000) == 400

        await eventually(capacity_known, within_s=10, every=0.2)
        assert await stream_status(stack.url, key, max_tokens=2000) == 200
        body = {"model": "deepseek-r1", "stream": True, "max_tokens": 400,
                "messages": [{"role": "user", "content": "word " * 800}]}  # fmt: skip
        async with httpx.AsyncClient(base_url=f"{engine.url}/v1", timeout=30) as direct:
            hogs = [asyncio.create_task(_hold(direct, body)) for _ in range(4)]
            try:

                async def refused() -> bool:
                    # a refusal is immediate; an admitted request waits in the full engine's
                    # queue for its first byte (its headers), which is "not refused (yet)"
                    try:
                        status = await asyncio.wait_for(
                            stream_status(stack.url, key, max_tokens=2000), timeout=1.0
                        )
                    except TimeoutError:
                        return False
                    return status == 429

                # nothing else went through the gateway and the key has no rate limits: only
                # the engine's own metrics (usage, its queue, preemptions) changed its mind
                await eventually(refused, within_s=15, every=0.2)
                assert sim.sim.requests_total >= 4
            finally:
                for hog in hogs:
                    hog.cancel()
                await asyncio.gather(*hogs, return_exceptions=True)


async def _hold(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    async with client.stream("POST", "/chat/completions", json=body) as response:
        async for _ in response.aiter_raw():
            pass
