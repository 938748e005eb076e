"""One contract for both rate-limit backends (in-process with a fake clock, real Redis), then
what only one of them has: exact refill times (memory), one round trip per call, script
recovery, key layout, and Lua computing exactly what ``ratelimit.gcra`` and
``ratelimit.limits.admit`` compute (Redis).

Most contract tests use one scope (the key's); the multi-scope ones pair a key's scope with its
tenant's, as the gateway does. Redis runs on its own clock, so the contract avoids depending on
elapsed time: the limits are chosen so that the milliseconds a test takes refill far less than
one unit.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

import pytest
import redis.asyncio as redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from ratelimit.gcra import UNLIMITED, decide, refund
from ratelimit.limits import (
    _EPOCH,
    Limits,
    MemoryBackend,
    RateLimitBackend,
    RedisBackend,
    Scope,
    Tats,
    Verdict,
    admit,
    limited,
)
from ratelimit.luascript import lua_source
from tests.clock import FakeClock
from tests.redis_commands import count_commands
from tests.waiting import eventually

SCOPE, TENANT = "key:k1", "acme"


async def reserve(backend: RateLimitBackend, limits: Limits, tokens: int = 0) -> Verdict:
    """One scope, the key's."""
    return await backend.reserve(TENANT, [Scope(SCOPE, limits)], tokens)


async def give_back(backend: RateLimitBackend, limits: Limits, tokens: int) -> None:
    await backend.refund(TENANT, [Scope(SCOPE, limits)], tokens)


def key_and_tenant(key: Limits, tenant: Limits, key_id: str = "a") -> list[Scope]:
    """The gateway's pair: the key's scope first, then its tenant's."""
    return [Scope(f"key:{key_id}", key), Scope("tenant", tenant)]


async def remaining(backend: RateLimitBackend, scope: Scope) -> tuple[int, int]:
    """What ``scope`` alone holds now (a reserve of 0 tokens; it takes one request)."""
    verdict = await backend.reserve(TENANT, [scope], 0)
    return verdict.requests.decision.remaining, verdict.tokens.decision.remaining


# The contract: one scope ----------------------------------------------------------------------


async def test_a_burst_up_to_the_limit_then_one_per_second(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=60, tpm=0)
    for left in range(59, -1, -1):
        verdict = await reserve(backend, limits)
        assert verdict.allowed
        assert verdict.denied_by is None
        assert verdict.requests.decision.remaining == left
    assert verdict.requests.decision.reset_s == pytest.approx(60, abs=0.5)
    assert verdict.tokens.decision.remaining == UNLIMITED
    assert (verdict.tokens.scope, verdict.tokens.limit) == (SCOPE, 0)
    denied = await reserve(backend, limits)
    assert not denied.allowed
    assert denied.denied_by == "requests"
    assert (denied.requests.scope, denied.requests.limit) == (SCOPE, 60)
    assert denied.requests.decision.retry_after_s == pytest.approx(1, abs=0.5)
    assert denied.retry_after_s == denied.requests.decision.retry_after_s


async def test_a_tokens_refusal_takes_no_request(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=3, tpm=10)  # 20 s per request, 6 s per token
    assert (await reserve(backend, limits, 6)).tokens.decision.remaining == 4
    denied = await reserve(backend, limits, 5)
    assert (denied.allowed, denied.denied_by) == (False, "tokens")
    assert denied.requests.decision.allowed  # it would have allowed ...
    assert denied.requests.decision.remaining == 2  # ... and took nothing
    assert denied.tokens.decision.remaining == 4
    assert denied.tokens.decision.retry_after_s == pytest.approx(6, abs=0.5)  # one token short
    allowed = await reserve(backend, limits, 4)
    assert allowed.allowed
    assert (allowed.requests.decision.remaining, allowed.tokens.decision.remaining) == (1, 0)


async def test_a_requests_refusal_takes_no_tokens(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=1, tpm=10)
    assert (await reserve(backend, limits, 3)).allowed
    denied = await reserve(backend, limits, 3)
    assert (denied.allowed, denied.denied_by) == (False, "requests")
    assert denied.tokens.decision.allowed
    assert denied.tokens.decision.remaining == 7  # not 4
    assert denied.tokens.decision.retry_after_s == 0.0
    assert (await reserve(backend, Limits(rpm=0, tpm=10), 7)).allowed  # still all 7


async def test_when_both_refuse_requests_is_named_and_the_longer_wait_counts(
    backend: RateLimitBackend,
) -> None:
    limits = Limits(rpm=1, tpm=10)
    assert (await reserve(backend, limits, 10)).allowed
    denied = await reserve(backend, limits, 10)
    assert denied.denied_by == "requests"
    assert not denied.requests.decision.allowed
    assert not denied.tokens.decision.allowed
    assert denied.requests.decision.retry_after_s == pytest.approx(60, abs=0.5)
    assert denied.tokens.decision.retry_after_s == pytest.approx(60, abs=0.5)
    waits = (denied.requests.decision.retry_after_s, denied.tokens.decision.retry_after_s)
    assert denied.retry_after_s == max(waits)


async def test_a_refund_gives_tokens_back_up_to_the_limit(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=0, tpm=10)
    assert (await reserve(backend, limits, 10)).allowed
    assert not (await reserve(backend, limits, 1)).allowed
    await give_back(backend, limits, 6)
    assert (await reserve(backend, limits, 0)).tokens.decision.remaining == 6
    assert (await reserve(backend, limits, 6)).allowed
    await give_back(backend, limits, 1_000)
    assert (await reserve(backend, limits, 0)).tokens.decision.remaining == 10  # not fuller


async def test_a_refund_to_a_full_or_absent_bucket_changes_nothing(
    backend: RateLimitBackend,
) -> None:
    limits = Limits(rpm=2, tpm=10)
    await give_back(backend, limits, 5)
    verdict = await reserve(backend, limits, 10)
    assert verdict.allowed
    assert (verdict.requests.decision.remaining, verdict.tokens.decision.remaining) == (1, 0)


async def test_zero_is_unlimited(backend: RateLimitBackend) -> None:
    for _ in range(100):
        verdict = await reserve(backend, Limits(rpm=0, tpm=0), 10**9)
        assert verdict.allowed
    assert verdict.requests.decision.remaining == verdict.tokens.decision.remaining == UNLIMITED
    assert (verdict.requests.scope, verdict.requests.limit) == (SCOPE, 0)
    limits = Limits(rpm=0, tpm=10)  # one unlimited bucket, one limited
    assert (await reserve(backend, limits, 10)).allowed
    assert (await reserve(backend, limits, 1)).denied_by == "tokens"


async def test_a_reservation_larger_than_the_limit_exceeds_it(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=5, tpm=100)
    verdict = await reserve(backend, limits, 101)
    assert (verdict.allowed, verdict.denied_by) == (False, "tokens")
    assert verdict.tokens.decision.exceeds_limit
    assert verdict.tokens.decision.retry_after_s == 60
    assert verdict.tokens.decision.remaining == 100
    assert verdict.requests.decision.remaining == 5  # nothing taken
    assert (await reserve(backend, limits, 100)).allowed  # the limit itself fits


async def test_scopes_and_tenants_are_independent(backend: RateLimitBackend) -> None:
    limits = Limits(rpm=1, tpm=0)
    for scope, tenant in [("a", "t1"), ("b", "t1"), ("a", "t2")]:
        assert (await backend.reserve(tenant, [Scope(scope, limits)], 0)).allowed
    for scope, tenant in [("a", "t1"), ("b", "t1"), ("a", "t2")]:
        assert not (await backend.reserve(tenant, [Scope(scope, limits)], 0)).allowed


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
    assert final.requests.decision.remaining in (10 - len(allowed) - 1, 10 - len(allowed))
    assert final.tokens.decision.remaining == 100 - sum(allowed)


async def test_negative_values_are_refused(backend: RateLimitBackend) -> None:
    with pytest.raises(ValueError, match="negative"):
        Limits(rpm=-1, tpm=0)
    with pytest.raises(ValueError, match="negative"):
        await reserve(backend, Limits(rpm=1, tpm=1), -1)
    with pytest.raises(ValueError, match="negative"):
        await give_back(backend, Limits(rpm=1, tpm=1), -1)


async def test_scope_names_are_unique_within_a_call(backend: RateLimitBackend) -> None:
    twice = [Scope("tenant", Limits(rpm=1, tpm=1)), Scope("tenant", Limits(rpm=2, tpm=2))]
    with pytest.raises(ValueError, match="unique"):
        await backend.reserve(TENANT, twice, 0)
    with pytest.raises(ValueError, match="unique"):
        await backend.refund(TENANT, twice, 1)


# The contract: a key's scope and its tenant's, together -----------------------------------------


async def test_a_tenant_limit_refuses_while_the_key_limit_would_allow(
    backend: RateLimitBackend,
) -> None:
    scopes = key_and_tenant(Limits(rpm=10, tpm=100), Limits(rpm=2, tpm=1_000))
    first = await backend.reserve(TENANT, scopes, 10)
    assert first.allowed
    assert (first.requests.scope, first.requests.decision.remaining) == ("tenant", 1)
    assert (first.tokens.scope, first.tokens.decision.remaining) == ("key:a", 90)
    assert (await backend.reserve(TENANT, scopes, 10)).allowed
    denied = await backend.reserve(TENANT, scopes, 10)
    assert (denied.allowed, denied.denied_by) == (False, "requests")
    assert (denied.requests.scope, denied.requests.limit) == ("tenant", 2)
    assert not denied.requests.decision.allowed
    assert denied.requests.decision.retry_after_s == pytest.approx(30, abs=0.5)
    assert denied.retry_after_s == denied.requests.decision.retry_after_s
    assert denied.tokens.decision.allowed
    assert (denied.tokens.scope, denied.tokens.decision.remaining) == ("key:a", 80)  # untouched


async def test_a_key_limit_refuses_while_the_tenant_limit_would_allow(
    backend: RateLimitBackend,
) -> None:
    scopes = key_and_tenant(Limits(rpm=100, tpm=50), Limits(rpm=10, tpm=1_000))
    assert (await backend.reserve(TENANT, scopes, 40)).allowed
    denied = await backend.reserve(TENANT, scopes, 20)
    assert (denied.allowed, denied.denied_by) == (False, "tokens")
    assert (denied.tokens.scope, denied.tokens.limit) == ("key:a", 50)
    assert denied.tokens.decision.remaining == 10
    assert denied.tokens.decision.retry_after_s == pytest.approx(12, abs=0.5)  # 10 tokens short
    assert denied.requests.decision.allowed
    assert (denied.requests.scope, denied.requests.decision.remaining) == ("tenant", 9)


async def test_of_several_refusing_buckets_the_longest_wait_binds(
    backend: RateLimitBackend,
) -> None:
    """In either order of the scopes: the verdict's wait is the one after which all allow."""
    key, tenant = Limits(rpm=0, tpm=100), Limits(rpm=0, tpm=60)  # 0.6 s and 1 s per token
    for name, scopes in [
        ("t1", key_and_tenant(key, tenant)),
        ("t2", key_and_tenant(key, tenant)[::-1]),
    ]:
        assert (await backend.reserve(name, scopes, 50)).allowed  # 50 and 10 left
        denied = await backend.reserve(name, scopes, 52)  # 2 and 42 tokens short
        assert (denied.denied_by, denied.tokens.scope) == ("tokens", "tenant")
        assert denied.retry_after_s == pytest.approx(42, abs=0.5)


async def test_ties_go_to_the_scope_given_first(backend: RateLimitBackend) -> None:
    same = Limits(rpm=10, tpm=100)
    first = await backend.reserve(TENANT, key_and_tenant(same, same), 5)
    assert (first.requests.scope, first.tokens.scope) == ("key:a", "key:a")
    second = await backend.reserve("t2", [Scope("tenant", same), Scope("key:a", same)], 5)
    assert (second.requests.scope, second.tokens.scope) == ("tenant", "tenant")


async def test_a_refusal_by_the_tenant_takes_nothing_from_the_key(
    backend: RateLimitBackend,
) -> None:
    scopes = key_and_tenant(Limits(rpm=2, tpm=60), Limits(rpm=0, tpm=50))
    assert (await backend.reserve(TENANT, scopes, 40)).allowed  # key: 1 request, 20 tokens left
    denied = await backend.reserve(TENANT, scopes, 20)  # the key would allow, the tenant refuses
    assert (denied.denied_by, denied.tokens.scope) == ("tokens", "tenant")
    last = await backend.reserve(TENANT, scopes[:1], 20)  # fits the key exactly: nothing was taken
    assert last.allowed
    assert (last.requests.decision.remaining, last.tokens.decision.remaining) == (0, 0)


async def test_a_refusal_by_the_key_takes_nothing_from_the_tenant(
    backend: RateLimitBackend,
) -> None:
    scopes = key_and_tenant(Limits(rpm=1, tpm=0), Limits(rpm=3, tpm=100))
    assert (await backend.reserve(TENANT, scopes, 30)).allowed
    denied = await backend.reserve(TENANT, scopes, 30)  # the tenant would allow, the key refuses
    assert (denied.denied_by, denied.requests.scope) == ("requests", "key:a")
    assert (denied.tokens.scope, denied.tokens.decision.remaining) == ("tenant", 70)
    last = await backend.reserve(TENANT, scopes[1:], 70)  # fits the tenant exactly
    assert last.allowed
    assert (last.requests.decision.remaining, last.tokens.decision.remaining) == (1, 0)


async def test_a_refund_restores_every_scopes_tokens(backend: RateLimitBackend) -> None:
    scopes = key_and_tenant(Limits(rpm=0, tpm=100), Limits(rpm=0, tpm=200))
    assert (await backend.reserve(TENANT, scopes, 80)).allowed
    await backend.refund(TENANT, scopes, 50)
    assert await remaining(backend, scopes[0]) == (UNLIMITED, 70)
    assert await remaining(backend, scopes[1]) == (UNLIMITED, 170)
    await backend.refund(TENANT, scopes, 1_000)  # full, not fuller
    whole = await backend.reserve(TENANT, scopes, 100)  # the key's whole limit fits again
    assert (whole.tokens.scope, whole.tokens.decision.remaining) == ("key:a", 0)
    assert await remaining(backend, scopes[1]) == (UNLIMITED, 100)


async def test_a_refund_skips_absent_and_unlimited_buckets(backend: RateLimitBackend) -> None:
    key, tenant = Limits(rpm=5, tpm=0), Limits(rpm=0, tpm=100)
    assert (await backend.reserve(TENANT, [Scope("tenant", tenant)], 60)).allowed
    await backend.refund(TENANT, [*key_and_tenant(key, tenant), Scope("key:b", tenant)], 20)
    assert await remaining(backend, Scope("tenant", tenant)) == (UNLIMITED, 60)
    assert await remaining(backend, Scope("key:a", key)) == (4, UNLIMITED)
    assert await remaining(backend, Scope("key:b", tenant)) == (UNLIMITED, 100)


async def test_two_keys_of_a_tenant_share_its_bucket(backend: RateLimitBackend) -> None:
    tenant = Limits(rpm=3, tpm=0)
    a = key_and_tenant(Limits(rpm=10, tpm=0), tenant, key_id="a")
    b = key_and_tenant(Limits(rpm=10, tpm=0), tenant, key_id="b")
    for scopes in (a, b, a):
        assert (await backend.reserve(TENANT, scopes, 0)).allowed
    denied = await backend.reserve(TENANT, b, 0)
    assert (denied.denied_by, denied.requests.scope) == ("requests", "tenant")
    assert await remaining(backend, a[0]) == (7, UNLIMITED)  # 2 taken, this one, none refused
    assert (await backend.reserve("globex", b, 0)).allowed  # another tenant has its own


async def test_scopes_without_limits_cost_nothing(backend: RateLimitBackend) -> None:
    free = Limits(rpm=0, tpm=0)
    verdict = await backend.reserve(TENANT, key_and_tenant(free, free), 10**9)
    assert (verdict.allowed, verdict.denied_by, verdict.retry_after_s) == (True, None, 0.0)
    assert verdict.requests == verdict.tokens
    assert (verdict.requests.scope, verdict.requests.limit) == ("key:a", 0)
    assert verdict.requests.decision == decide(0.0, 0.0, 0, 0)[1]
    nothing = await backend.reserve(TENANT, [], 5)
    assert (nothing.allowed, nothing.requests.scope, nothing.tokens.scope) == (True, "", "")
    await backend.refund(TENANT, [], 5)
    mixed = [Scope("tenant", free), Scope("key:a", Limits(rpm=1, tpm=0))]
    assert (await backend.reserve(TENANT, mixed, 10**9)).allowed
    denied = await backend.reserve(TENANT, mixed, 0)
    assert (denied.denied_by, denied.requests.scope) == ("requests", "key:a")
    assert (denied.tokens.scope, denied.tokens.limit) == ("tenant", 0)  # the first scope given


async def test_concurrent_keys_of_a_tenant_allow_exactly_its_limit(
    backend: RateLimitBackend,
) -> None:
    tenant = Limits(rpm=30, tpm=0)
    keys = [key_and_tenant(Limits(rpm=20, tpm=0), tenant, key_id) for key_id in "ab"]
    calls = [backend.reserve(TENANT, keys[i % 2], 0) for i in range(100)]
    verdicts = await asyncio.gather(*calls)
    assert sum(verdict.allowed for verdict in verdicts) == 30
    for i, scopes in enumerate(keys):
        taken = sum(verdict.allowed for verdict in verdicts[i::2])
        assert taken <= 20
        assert (await remaining(backend, scopes[0]))[0] == 20 - taken - 1  # none refused took


# The in-process backend: exact times, bounded memory --------------------------------------------


async def test_memory_refills_one_request_per_interval() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    limits = Limits(rpm=60, tpm=0)
    for _ in range(60):
        await reserve(backend, limits)
    denied = await reserve(backend, limits)
    assert denied.requests.decision.retry_after_s == 1.0
    assert denied.requests.decision.reset_s == 60.0
    clock.now += 1.0
    assert (await reserve(backend, limits)).allowed
    assert not (await reserve(backend, limits)).allowed
    clock.now += 60.0
    assert (await reserve(backend, limits)).requests.decision.remaining == 59


async def test_memory_forgets_full_buckets() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    limits = Limits(rpm=0, tpm=10)
    await reserve(backend, limits, 4)
    assert len(backend) == 1
    await give_back(backend, limits, 4)
    assert len(backend) == 0
    sweep = MemoryBackend._MIN_SWEEP
    for i in range(sweep):
        await backend.reserve(TENANT, [Scope(f"old-{i}", limits)], 1)
    clock.now += 60.0  # every old bucket is full again
    for i in range(sweep):
        await backend.reserve(TENANT, [Scope(f"new-{i}", limits)], 1)
    assert len(backend) == sweep  # the sweep at 2 * sweep dropped the old ones


async def test_memory_keeps_one_state_per_limited_scope() -> None:
    backend = MemoryBackend(clock=FakeClock())
    free = Limits(rpm=0, tpm=0)
    await backend.reserve(
        TENANT, [*key_and_tenant(Limits(rpm=3, tpm=0), free), Scope("x", free)], 1
    )
    assert len(backend) == 1
    scopes = key_and_tenant(Limits(rpm=3, tpm=0), Limits(rpm=0, tpm=100))
    await backend.reserve(TENANT, scopes, 30)
    assert len(backend) == 2
    await backend.refund(TENANT, scopes, 30)
    assert len(backend) == 1  # the tenant's bucket is full again: forgotten


# The Redis backend ----------------------------------------------------------------------------


async def test_redis_one_round_trip_per_call(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    limits = Limits(rpm=10, tpm=100)
    await reserve(backend, limits, 1)  # loads the scripts if this server lacks them
    await give_back(backend, limits, 1)
    sent = count_commands(client, monkeypatch)
    await reserve(backend, limits, 10)
    assert sent == ["EVALSHA"]
    await give_back(backend, limits, 5)
    assert sent == ["EVALSHA", "EVALSHA"]


async def test_redis_one_round_trip_for_a_key_and_its_tenant(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    scopes = key_and_tenant(Limits(rpm=10, tpm=100), Limits(rpm=100, tpm=1_000))
    await backend.reserve(TENANT, scopes, 1)  # loads the scripts if this server lacks them
    await backend.refund(TENANT, scopes, 1)
    sent = count_commands(client, monkeypatch)
    assert (await backend.reserve(TENANT, scopes, 10)).allowed
    assert sent == ["EVALSHA"]
    assert not (await backend.reserve(TENANT, scopes, 1_000)).allowed
    assert sent == ["EVALSHA"] * 2
    await backend.refund(TENANT, scopes, 5)
    assert sent == ["EVALSHA"] * 3


async def test_redis_no_round_trip_when_there_is_nothing_to_do(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    sent = count_commands(client, monkeypatch)
    free = Limits(rpm=0, tpm=0)
    assert (await backend.reserve(TENANT, key_and_tenant(free, free), 10**6)).allowed
    assert (await backend.reserve(TENANT, [], 10)).allowed
    await backend.refund(TENANT, key_and_tenant(free, Limits(rpm=5, tpm=0)), 10)  # no tokens limit
    await backend.refund(TENANT, key_and_tenant(free, Limits(rpm=5, tpm=50)), 0)  # nothing to give
    await backend.refund(TENANT, [], 10)
    assert sent == []


@pytest.mark.private_redis
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
    left = (verdict.requests.decision.remaining, verdict.tokens.decision.remaining)
    assert (verdict.allowed, left) == (True, (1, 0))
    await client.script_flush()
    sent.clear()
    await give_back(backend, limits, 10)
    assert sent == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]
    assert (await reserve(backend, limits, 0)).tokens.decision.remaining == 10


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
    await give_back(backend, Limits(rpm=0, tpm=100), 100)
    assert 19_000 < await client.pttl(key) <= 20_000  # the requests bucket still counts
    assert await client.exists(key)


async def test_redis_one_key_per_limited_scope_in_one_slot(
    client: redis.Redis, key_prefix: str
) -> None:
    """Redis Cluster runs a script only on keys of one slot: the tenant's hash tag sees to it."""
    backend = RedisBackend(client, key_prefix=key_prefix)
    free = Limits(rpm=0, tpm=0)
    scopes = [*key_and_tenant(Limits(rpm=3, tpm=0), Limits(rpm=0, tpm=100)), Scope("x", free)]
    assert (await backend.reserve(TENANT, scopes, 30)).allowed
    keys = [backend.key(scope.name, TENANT) for scope in scopes]
    assert sorted(await client.keys(f"{key_prefix}*")) == sorted(k.encode() for k in keys[:2])
    assert len({key_slot(key.encode()) for key in keys}) == 1
    assert 19_000 < await client.pttl(keys[0]) <= 20_000  # each key lives until it is full
    assert 17_000 < await client.pttl(keys[1]) <= 18_000


async def test_redis_full_buckets_leave_no_key(client: redis.Redis, key_prefix: str) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    limits = Limits(rpm=0, tpm=100)
    scopes = key_and_tenant(limits, limits)
    await backend.reserve(TENANT, scopes, 30)
    await backend.refund(TENANT, scopes, 30)
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
    script = client.register_script(lua_source("limits_gcra.lua") + _LUA_SEQUENCE)
    for limit in [1, 3, 7, 60, 997, 1_000, 123_457, 10**6, 10**7]:
        for _ in range(4):
            tat, ops = sequence(rng, limit)
            args = [str(limit), repr(tat)] + [
                x for now, op, n in ops for x in (repr(now), op, str(n))
            ]
            lua = await script(args=args)
            for (now, op, amount), got in zip(ops, lua, strict=True):
                if op == "refund":
                    tat = refund(tat, now, limit, amount)
                else:
                    tat, decision = decide(tat, now, limit, amount)
                    assert (got != b"denied") == decision.allowed, (limit, now, amount)
                assert got == b"denied" or float(got) == tat


# The Lua ``admit`` against ``limits.admit`` over several scopes, as the reserve and refund scripts
# use them. ARGV: the number n of limited scopes, their 2n limits and 2n initial TATs (requests,
# tokens, scope after scope), then (now, op, amount) triples. For each operation: 'allowed',
# 'denied' or 'refund', then the 2n TATs after it.
_LUA_SCOPES = """
local n, limits, tats, out = tonumber(ARGV[1]), {}, {}, {}
for j = 1, 2 * n do limits[j], tats[j] = tonumber(ARGV[1 + j]), tonumber(ARGV[1 + 2 * n + j]) end
for i = 2 + 4 * n, #ARGV, 3 do
  local now, op, amount = tonumber(ARGV[i]), ARGV[i + 1], tonumber(ARGV[i + 2])
  if op == 'take' then
    local new = admit(tats, now, limits, amount)
    if new then tats = new; out[#out + 1] = 'allowed' else out[#out + 1] = 'denied' end
  else
    for j = 2, 2 * n, 2 do tats[j] = give_back(tats[j], now, limits[j], amount) end
    out[#out + 1] = 'refund'
  end
  for j = 1, 2 * n do out[#out + 1] = fmt(tats[j]) end
end
return out
"""

_LIMIT_VALUES = [0, 0, 1, 3, 7, 60, 997, 1_000, 123_457, 10**6]
_limits = st.builds(Limits, st.sampled_from(_LIMIT_VALUES), st.sampled_from(_LIMIT_VALUES))
_scope_lists = st.lists(_limits, min_size=1, max_size=4).map(
    lambda limits: [Scope(f"s{i}", each) for i, each in enumerate(limits)]
)
_steps = st.one_of(
    st.just(0.0),
    st.integers(1, 999).map(lambda micros: micros * 1e-6),
    st.sampled_from([60 / limit for limit in _LIMIT_VALUES if limit]),
    st.floats(0, 30),
)
_amounts = st.one_of(st.just(1), st.integers(0, 1_100), st.sampled_from(_LIMIT_VALUES))
_ops = st.lists(
    st.tuples(_steps, st.sampled_from(["take", "take", "take", "refund"]), _amounts),
    min_size=1,
    max_size=60,
)


def python_steps(
    scopes: Sequence[Scope], tats: list[Tats], ops: Sequence[tuple[float, str, int]]
) -> list[tuple[str, list[Tats]]]:
    """What the memory backend computes for ``ops``, with the outcome of each operation."""
    out: list[tuple[str, list[Tats]]] = []
    for now, op, amount in ops:
        if op == "take":
            tats, verdict = admit(scopes, tats, now, amount)
            outcome = "allowed" if verdict.allowed else "denied"
        else:
            limits = [scope.limits.tpm for scope in limited(scopes)]
            tats = [
                (r, refund(t, now, tpm, amount)) for (r, t), tpm in zip(tats, limits, strict=True)
            ]
            outcome = "refund"
        out.append((outcome, tats))
    return out


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    scopes=_scope_lists,
    offsets=st.lists(st.floats(-5, 61), min_size=8, max_size=8),
    ops=_ops,
)
async def test_redis_lua_admits_exactly_what_python_admits(
    client: redis.Redis,
    scopes: list[Scope],
    offsets: list[float],
    ops: list[tuple[float, str, int]],
) -> None:
    """Scopes without limits are left out of the script, as ``RedisBackend`` leaves them out."""
    start = time.time() - _EPOCH
    active = limited(scopes)
    tats = [(start + offsets[2 * i], start + offsets[2 * i + 1]) for i in range(len(active))]
    timed: list[tuple[float, str, int]] = []
    now = start
    for step, op, amount in ops:
        now += step
        timed.append((now, op, amount))
    limits = [x for scope in active for x in (scope.limits.rpm, scope.limits.tpm)]
    args: list[str | int] = [len(active), *limits, *(repr(x) for tat in tats for x in tat)]
    args += [x for now, op, amount in timed for x in (repr(now), op, amount)]
    lua = await client.register_script(lua_source("limits_gcra.lua") + _LUA_SCOPES)(args=args)
    width = 1 + 2 * len(active)
    for i, (outcome, expected) in enumerate(python_steps(scopes, tats, timed)):
        got = lua[i * width : (i + 1) * width]
        assert got[0].decode() == outcome, (i, timed[i])
        assert [float(x) for x in got[1:]] == [x for tat in expected for x in tat]


def test_the_lua_clock_starts_where_the_python_one_does() -> None:
    from ratelimit.limits import _EPOCH

    assert f"(tonumber(t[1]) - {_EPOCH})" in lua_source("limits_state.lua")
