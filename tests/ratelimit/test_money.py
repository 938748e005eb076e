"""Budgets' money counters (``ratelimit.money``) reserved in the rate limits' own call, on both
backends (in-process, real Redis): all or nothing with the buckets, the refusing counter named,
soft counters never refusing, settled with the tokens' refund, a late refund not reviving an
ended window; with Redis one script per call, the counters in the tenant's slot."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as redis
from redis.crc import key_slot

from ratelimit.limits import Limits, MemoryBackend, RateLimitBackend, RedisBackend, Scope
from ratelimit.money import KEEP_S, SOFT, MemoryCounters, Money, Spent
from tests.ratelimit.test_limits import TENANT, key_and_tenant, remaining
from tests.redis_commands import count_commands

KEY = Scope("key:a", Limits(rpm=10, tpm=1_000))


def money(amount: int, *limits: int, names: tuple[str, ...] = ("key:a:d1", "tenant:acme:m1")
          ) -> Money:  # fmt: skip
    return Money(names[: len(limits)], tuple(limits), amount)


async def held(backend: RateLimitBackend, *names: str) -> list[int]:
    return await backend.spent(TENANT, list(names))


async def test_money_is_reserved_with_the_buckets(backend: RateLimitBackend) -> None:
    verdict = await backend.reserve(TENANT, [KEY], 100, money(30, 100, 1_000))
    assert verdict.allowed and verdict.spent == Spent(0, (30, 30))
    assert await held(backend, "key:a:d1", "tenant:acme:m1") == [30, 30]
    assert await remaining(backend, KEY) == (8, 900)  # this request and the probe's


async def test_a_budget_refusal_takes_nothing_from_the_buckets(backend: RateLimitBackend) -> None:
    assert (await backend.reserve(TENANT, [KEY], 100, money(60, 100, 1_000))).allowed
    refused = await backend.reserve(TENANT, [KEY], 100, money(60, 100, 1_000))
    assert (refused.allowed, refused.denied_by, refused.spent) == (False, "budget", Spent(1, (60,)))
    assert refused.requests.decision.remaining == 9  # as it stands: nothing taken
    assert refused.tokens.decision.remaining == 900
    by_tenant = await backend.reserve(TENANT, [KEY], 100, money(60, 1_000, 100))
    assert by_tenant.spent == Spent(2, (60,))  # the second counter refused: named
    assert await held(backend, "key:a:d1", "tenant:acme:m1") == [60, 60]
    assert await remaining(backend, KEY) == (8, 900)


async def test_a_bucket_refusal_takes_no_money(backend: RateLimitBackend) -> None:
    tight = Scope("key:a", Limits(rpm=10, tpm=100))
    refused = await backend.reserve(TENANT, [tight], 500, money(10, 100))
    assert (refused.denied_by, refused.spent) == ("tokens", None)
    assert await held(backend, "key:a:d1") == [0]


async def test_soft_counters_count_and_never_refuse(backend: RateLimitBackend) -> None:
    for _ in range(3):
        verdict = await backend.reserve(TENANT, [], 0, money(40, SOFT, 1_000))
        assert verdict.allowed
    assert verdict.spent == Spent(0, (120, 120))


async def test_settled_with_the_refund_and_ended_windows_stay_ended(
    backend: RateLimitBackend,
) -> None:
    reserved = money(50, 100)
    await backend.reserve(TENANT, [KEY], 400, reserved)
    await backend.refund(TENANT, [KEY], 300, reserved.counters, -35)  # it cost 15
    assert await held(backend, "key:a:d1") == [15]
    assert await remaining(backend, KEY) == (8, 900)
    await backend.refund(TENANT, [], 0, ("key:a:d0",), -35)  # yesterday's: gone, not revived
    assert await held(backend, "key:a:d0") == [0]
    await backend.refund(TENANT, [], 0, reserved.counters, 20)  # it cost more: added
    assert await held(backend, "key:a:d1") == [35]


async def test_tenants_counters_are_their_own(backend: RateLimitBackend) -> None:
    await backend.reserve(TENANT, [], 0, money(50, 100))
    assert await backend.spent("globex", ["key:a:d1"]) == [0]
    assert (await backend.reserve("globex", [], 0, money(100, 100))).allowed


async def test_concurrent_reservations_fill_a_budget_exactly(backend: RateLimitBackend) -> None:
    verdicts = await asyncio.gather(
        *(backend.reserve(TENANT, [KEY], 1, money(7, 100)) for _ in range(10))
    )
    assert sum(v.allowed for v in verdicts) == 10  # the rpm allows all ten: 70 of 100
    more = await asyncio.gather(*(backend.reserve(TENANT, [], 1, money(7, 100)) for _ in range(9)))
    assert sum(v.allowed for v in more) == 4  # 98; a fifth would pass 100
    assert await held(backend, "key:a:d1") == [98]


async def test_redis_one_script_for_buckets_and_money(
    client: redis.Redis,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = RedisBackend(client, key_prefix=key_prefix)
    scopes = key_and_tenant(Limits(rpm=10, tpm=1_000), Limits(rpm=100, tpm=10_000))
    asked = money(30, 100, 1_000)
    await backend.reserve(TENANT, scopes, 10, asked)  # loads the scripts if needed
    await backend.refund(TENANT, scopes, 1, asked.counters, -1)
    sent = count_commands(client, monkeypatch)
    assert (await backend.reserve(TENANT, scopes, 10, asked)).allowed
    assert sent == ["EVALSHA"]
    await backend.refund(TENANT, scopes, 5, asked.counters, -10)
    assert sent == ["EVALSHA"] * 2
    await backend.refund(TENANT, [], 0, asked.counters, -10)  # money alone: still one
    assert sent == ["EVALSHA"] * 3
    keys = [backend.key(s.name, TENANT) for s in scopes]
    keys += [backend.money_key(c, TENANT) for c in asked.counters]
    assert len({key_slot(k.encode()) for k in keys}) == 1  # one slot: Redis Cluster runs it
    assert KEEP_S - 5 < await client.ttl(keys[-1]) <= KEEP_S
    assert backend.money_key("c", "a{b}") == f"{key_prefix}spend:{{a%7Bb%7D}}:c"


def test_memory_counters_alone() -> None:
    counters = MemoryCounters()
    assert counters.reserve("t", Money(("a", "b"), (10, SOFT), 6)) == Spent(0, (6, 6))
    assert counters.reserve("t", Money(("a", "b"), (10, SOFT), 6)) == Spent(1, (6,))
    assert counters.reserve("u", Money(("a",), (10,), 6)) == Spent(0, (6,))  # its own
    counters.settle("t", ["a", "gone"], -2)
    assert counters.spent("t", ["a", "b", "gone"]) == [4, 6, 0]
    assert Spent.of([0, 7, 9]) == Spent(0, (7, 9))
    assert isinstance(MemoryBackend().money, MemoryCounters)


async def test_redis_leaves_no_counter_without_its_ttl(
    client: redis.Redis, key_prefix: str
) -> None:
    """A refusal on a counter this call made, and a settlement of an ended window, leave
    nothing behind (a key without a TTL would live forever)."""
    backend = RedisBackend(client, key_prefix=key_prefix)
    too_much = await backend.reserve(TENANT, [], 0, money(500, 1_000, 100))
    assert too_much.spent == Spent(2, (0,))
    assert await held(backend, "key:a:d1", "tenant:acme:m1") == [0, 0]
    await backend.refund(TENANT, [], 0, ("key:a:d0",), 25)  # an ended window: not made again
    left = await client.keys(f"{key_prefix}*")
    assert left == [backend.money_key("key:a:d1", TENANT).encode()]  # made, given back: at 0
    assert [await client.ttl(k) > 0 for k in left] == [True]
    assert (await backend.reserve(TENANT, [], 0, money(50, 100))).allowed
    assert KEEP_S - 5 < await client.ttl(backend.money_key("key:a:d1", TENANT)) <= KEEP_S
