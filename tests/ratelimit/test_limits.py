"""One contract for both rate-limit backends (in-process with a fake clock, real Redis), then
what only one of them has: exact refill times (memory), one round trip per call, script
recovery, key layout, and Lua computing exactly what ``ratelimit.gcra`` computes (Redis).

Redis runs on its own clock, so the contract avoids depending on elapsed time: the limits are
chosen so that the milliseconds a test takes refill far less than one unit.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as redis

from ratelimit.gcra import UNLIMITED, decide, refund
from ratelimit.limits import (
    _EPOCH,
    _LUA_GCRA,
    Limits,
    MemoryBackend,
    RateLimitBackend,
    RedisBackend,
    Verdict,
)
from tests.waiting import eventually

SCOPE, TENANT = "key:k1", "acme"


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def redis_client(url: str) -> redis.Redis:
    """A client whose pool really spreads concurrent calls over several connections."""
    return redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, max_connections=32))


@pytest.fixture(params=["memory", "redis"])
def make_backend(request: pytest.FixtureRequest) -> Callable[[], RateLimitBackend]:
    if request.param == "memory":
        return lambda: MemoryBackend(clock=FakeClock())
    url: str = request.getfixturevalue("redis_url")
    prefix: str = request.getfixturevalue("key_prefix")
    return lambda: RedisBackend(redis_client(url), key_prefix=prefix)


@pytest.fixture
async def backend(make_backend: Callable[[], RateLimitBackend]) -> AsyncIterator[RateLimitBackend]:
    backend = make_backend()
    try:
        yield backend
    finally:
        await backend.aclose()


async def reserve(backend: RateLimitBackend, limits: Limits, tokens: int = 0) -> Verdict:
    return await backend.reserve(SCOPE, TENANT, limits, tokens)


# The contract ---------------------------------------------------------------------------------


async def test_a_burst_up_to_the_limit_then_one_per_second(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=60, tpm=0)
    for remaining in range(59, -1, -1):
        verdict = await reserve(backend, limits)
        assert verdict.allowed
        assert verdict.denied_by is None
        assert verdict.requests.remaining == remaining
    assert verdict.requests.reset_s == pytest.approx(60, abs=0.5)
    assert verdict.tokens.remaining == UNLIMITED
    denied = await reserve(backend, limits)
    assert not denied.allowed
    assert denied.denied_by == "requests"
    assert denied.requests.retry_after_s == pytest.approx(1, abs=0.5)
    assert denied.retry_after_s == denied.requests.retry_after_s


async def test_a_tokens_refusal_takes_no_request(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=3, tpm=10)  # 20 s per request, 6 s per token
    assert (await reserve(backend, limits, 6)).tokens.remaining == 4
    denied = await reserve(backend, limits, 5)
    assert (denied.allowed, denied.denied_by) == (False, "tokens")
    assert denied.requests.allowed  # it would have allowed ...
    assert denied.requests.remaining == 2  # ... and took nothing
    assert denied.tokens.remaining == 4
    assert denied.tokens.retry_after_s == pytest.approx(6, abs=0.5)  # one token short
    allowed = await reserve(backend, limits, 4)
    assert allowed.allowed
    assert (allowed.requests.remaining, allowed.tokens.remaining) == (1, 0)


async def test_a_requests_refusal_takes_no_tokens(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=1, tpm=10)
    assert (await reserve(backend, limits, 3)).allowed
    denied = await reserve(backend, limits, 3)
    assert (denied.allowed, denied.denied_by) == (False, "requests")
    assert denied.tokens.allowed
    assert denied.tokens.remaining == 7  # not 4
    assert denied.tokens.retry_after_s == 0.0
    assert (await reserve(backend, Limits(rpm=0, tpm=10), 7)).allowed  # still all 7


async def test_when_both_refuse_requests_is_named_and_the_longer_wait_counts(
    backend: RateLimitBackend,
) -> None:
    limits = Limits(rpm=1, tpm=10)
    assert (await reserve(backend, limits, 10)).allowed
    denied = await reserve(backend, limits, 10)
    assert denied.denied_by == "requests"
    assert not denied.requests.allowed
    assert not denied.tokens.allowed
    assert denied.requests.retry_after_s == pytest.approx(60, abs=0.5)
    assert denied.tokens.retry_after_s == pytest.approx(60, abs=0.5)
    assert denied.retry_after_s == max(denied.requests.retry_after_s, denied.tokens.retry_after_s)


async def test_a_refund_gives_tokens_back_up_to_the_limit(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=0, tpm=10)
    assert (await reserve(backend, limits, 10)).allowed
    assert not (await reserve(backend, limits, 1)).allowed
    await backend.refund(SCOPE, TENANT, limits, 6)
    assert (await reserve(backend, limits, 0)).tokens.remaining == 6
    assert (await reserve(backend, limits, 6)).allowed
    await backend.refund(SCOPE, TENANT, limits, 1_000)
    assert (await reserve(backend, limits, 0)).tokens.remaining == 10  # full, not fuller


async def test_a_refund_to_a_full_or_absent_bucket_changes_nothing(
    backend: RateLimitBackend,
) -> None:
    limits = Limits(rpm=2, tpm=10)
    await backend.refund(SCOPE, TENANT, limits, 5)
    verdict = await reserve(backend, limits, 10)
    assert verdict.allowed
    assert (verdict.requests.remaining, verdict.tokens.remaining) == (1, 0)


async def test_zero_is_unlimited(backend: RateLimitBackend) -> None:
    for _ in range(100):
        verdict = await reserve(backend, Limits(rpm=0, tpm=0), 10**9)
        assert verdict.allowed
    assert verdict.requests.remaining == verdict.tokens.remaining == UNLIMITED
    limits = Limits(rpm=0, tpm=10)  # one unlimited bucket, one limited
    assert (await reserve(backend, limits, 10)).allowed
    assert (await reserve(backend, limits, 1)).denied_by == "tokens"


async def test_a_reservation_larger_than_the_limit_exceeds_it(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=5, tpm=100)
    verdict = await reserve(backend, limits, 101)
    assert (verdict.allowed, verdict.denied_by) == (False, "tokens")
    assert verdict.tokens.exceeds_limit
    assert verdict.tokens.retry_after_s == 60
    assert verdict.tokens.remaining == 100
    assert verdict.requests.remaining == 5  # nothing taken
    assert (await reserve(backend, limits, 100)).allowed  # the limit itself fits


async def test_scopes_and_tenants_are_independent(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=1, tpm=0)
    for scope, tenant in [("a", "t1"), ("b", "t1"), ("a", "t2")]:
        assert (await backend.reserve(scope, tenant, limits, 0)).allowed
    for scope, tenant in [("a", "t1"), ("b", "t1"), ("a", "t2")]:
        assert not (await backend.reserve(scope, tenant, limits, 0)).allowed


async def test_concurrent_reserves_allow_exactly_the_limit(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=50, tpm=0)
    verdicts = await asyncio.gather(*(reserve(backend, limits) for _ in range(200)))
    assert sum(verdict.allowed for verdict in verdicts) == 50


async def test_concurrent_reserves_are_atomic_over_both_buckets(
    backend: RateLimitBackend,
) -> None:
    """Each bucket alone would let 10 through; together only requests that fit both pass, and
    a refused request never takes from either."""
    limits = Limits(rpm=10, tpm=100)
    costs = [7, 20, 3, 30] * 25  # 100 requests, 1500 tokens
    verdicts = await asyncio.gather(*(reserve(backend, limits, cost) for cost in costs))
    allowed = [cost for cost, verdict in zip(costs, verdicts, strict=True) if verdict.allowed]
    assert 1 <= len(allowed) <= 10
    assert sum(allowed) <= 100
    final = await reserve(backend, limits, 0)
    assert final.requests.remaining in (10 - len(allowed) - 1, 10 - len(allowed))
    assert final.tokens.remaining == 100 - sum(allowed)


async def test_negative_values_are_refused(backend: RateLimitBackend) -> None:
    with pytest.raises(ValueError, match="negative"):
        Limits(rpm=-1, tpm=0)
    with pytest.raises(ValueError, match="negative"):
        await reserve(backend, Limits(rpm=1, tpm=1), -1)
    with pytest.raises(ValueError, match="negative"):
        await backend.refund(SCOPE, TENANT, Limits(rpm=1, tpm=1), -1)


# The in-process backend: exact times, bounded memory --------------------------------------------


async def test_memory_refills_one_request_per_interval() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    limits = Limits(rpm=60, tpm=0)
    for _ in range(60):
        await reserve(backend, limits)
    denied = await reserve(backend, limits)
    assert denied.requests.retry_after_s == 1.0
    assert denied.requests.reset_s == 60.0
    clock.now += 1.0
    assert (await reserve(backend, limits)).allowed
    assert not (await reserve(backend, limits)).allowed
    clock.now += 60.0
    assert (await reserve(backend, limits)).requests.remaining == 59


async def test_memory_forgets_full_buckets() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    limits = Limits(rpm=0, tpm=10)
    await reserve(backend, limits, 4)
    assert len(backend) == 1
    await backend.refund(SCOPE, TENANT, limits, 4)
    assert len(backend) == 0
    sweep = MemoryBackend._MIN_SWEEP
    for i in range(sweep):
        await backend.reserve(f"old-{i}", TENANT, limits, 1)
    clock.now += 60.0  # every old bucket is full again
    for i in range(sweep):
        await backend.reserve(f"new-{i}", TENANT, limits, 1)
    assert len(backend) == sweep  # the sweep at 2 * sweep dropped the old ones


# The Redis backend ----------------------------------------------------------------------------


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.Redis]:
    client = redis_client(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def count_commands(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commands ``client`` sends from now on (one each: no pipelines here)."""
    sent: list[str] = []
    execute = client.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return await execute(*args, **options)

    monkeypatch.setattr(client, "execute_command", counting)
    return sent


async def test_redis_one_round_trip_per_call(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    limits = Limits(rpm=10, tpm=100)
    await reserve(backend, limits, 1)  # loads the script if this server lacks it
    await backend.refund(SCOPE, TENANT, limits, 1)
    sent = count_commands(client, monkeypatch)
    await reserve(backend, limits, 10)
    assert sent == ["EVALSHA"]
    await backend.refund(SCOPE, TENANT, limits, 5)
    assert sent == ["EVALSHA", "EVALSHA"]


async def test_redis_reloads_flushed_scripts_once(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    limits = Limits(rpm=3, tpm=10)
    assert (await reserve(backend, limits, 5)).allowed
    sent = count_commands(client, monkeypatch)
    await client.script_flush()
    verdict = await reserve(backend, limits, 5)
    assert sent == ["SCRIPT FLUSH", "EVALSHA", "SCRIPT LOAD", "EVALSHA"]
    assert (verdict.allowed, verdict.requests.remaining, verdict.tokens.remaining) == (True, 1, 0)
    await client.script_flush()
    sent.clear()
    await backend.refund(SCOPE, TENANT, limits, 10)
    assert sent == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]
    assert (await reserve(backend, limits, 0)).tokens.remaining == 10


async def test_redis_keys_are_hash_tagged_and_expire_when_full(
    client: redis.Redis, key_prefix: str
) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    key = f"{key_prefix}rl:{{acme}}:{SCOPE}"
    assert backend.key(SCOPE, TENANT) == key
    await reserve(backend, Limits(rpm=3, tpm=0))  # 20 s until full
    assert 19_000 < await client.pttl(key) <= 20_000
    assert set(await client.hgetall(key)) == {b"r", b"t"}
    await reserve(backend, Limits(rpm=0, tpm=100), 100)  # 60 s until full
    assert 59_000 < await client.pttl(key) <= 60_000
    await backend.refund(SCOPE, TENANT, Limits(rpm=0, tpm=100), 100)
    assert 19_000 < await client.pttl(key) <= 20_000  # the requests bucket still counts
    assert await client.exists(key)


async def test_redis_full_buckets_leave_no_key(client: redis.Redis, key_prefix: str) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    limits = Limits(rpm=0, tpm=100)
    await reserve(backend, limits, 30)
    await backend.refund(SCOPE, TENANT, limits, 30)
    await reserve(backend, Limits(rpm=0, tpm=0), 30)
    assert await client.keys(f"{key_prefix}*") == []


def test_redis_tenants_cannot_forge_each_others_keys() -> None:
    backend = RedisBackend(redis.Redis(), key_prefix="p:")
    assert backend.key("x}:y", "a") != backend.key("y", "a}:x")
    assert backend.key("s", "a{b}c%") == "p:rl:{a%7Bb%7Dc%25}:s"
    with pytest.raises(ValueError, match="braces"):
        RedisBackend(redis.Redis(), key_prefix="{p}")


async def test_redis_refills_with_the_server_clock(client: redis.Redis, key_prefix: str) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    limits = Limits(rpm=60, tpm=0)
    for _ in range(60):
        assert (await reserve(backend, limits)).allowed
    denied = await reserve(backend, limits)
    assert not denied.allowed
    started = time.monotonic()

    async def allowed() -> bool:
        return (await reserve(backend, limits)).allowed

    await eventually(allowed, within_s=5.0, every=0.02)
    assert time.monotonic() - started >= denied.retry_after_s - 0.05
    assert not (await reserve(backend, limits)).allowed  # exactly one came back


# Lua's arithmetic against gcra's, operation by operation, on the server's own number type.
# ARGV: limit, the initial TAT, then (now, op, amount) triples; the TAT after each operation.
_LUA_SEQUENCE = """
local limit, tat, out = tonumber(ARGV[1]), tonumber(ARGV[2]), {}
for i = 3, #ARGV, 3 do
  local now, op, amount = tonumber(ARGV[i]), ARGV[i + 1], tonumber(ARGV[i + 2])
  if op == 'take' then
    local taken = take(tat, now, limit, amount)
    if taken then tat = taken; out[#out + 1] = fmt(tat) else out[#out + 1] = 'denied' end
  else
    tat = give_back(tat, now, limit, amount); out[#out + 1] = fmt(tat)
  end
end
return out
"""


def sequence(rng: random.Random, limit: int) -> tuple[float, list[tuple[float, str, int]]]:
    """Operations that dwell on boundaries: bursts at one instant, exact-interval waits,
    microsecond steps at the magnitude of Redis's clock (seconds since 2025)."""
    interval = 60 / limit
    now = time.time() - _EPOCH + rng.random()
    ops = []
    for _ in range(300):
        now += rng.choice([0.0, 0.0, 0.0, 1e-6 * rng.randint(1, 999), interval, rng.random()])
        amount = rng.choice([1, 1, limit, rng.randint(0, limit), rng.randint(0, limit + 1)])
        ops.append((now, rng.choice(["take", "take", "take", "refund"]), amount))
    return ops[0][0], ops


async def test_redis_lua_computes_exactly_what_gcra_computes(client: redis.Redis) -> None:
    rng = random.Random(20250101)
    script = client.register_script(_LUA_GCRA + _LUA_SEQUENCE)
    for limit in [1, 3, 7, 60, 997, 1_000, 123_457, 10**6, 10**7]:
        for _ in range(4):
            tat, ops = sequence(rng, limit)
            args = [limit, repr(tat)] + [x for now, op, n in ops for x in (repr(now), op, n)]
            lua = await script(args=args)
            for (now, op, amount), got in zip(ops, lua, strict=True):
                if op == "refund":
                    tat = refund(tat, now, limit, amount)
                else:
                    tat, decision = decide(tat, now, limit, amount)
                    assert (got != b"denied") == decision.allowed, (limit, now, amount)
                assert got == b"denied" or float(got) == tat
