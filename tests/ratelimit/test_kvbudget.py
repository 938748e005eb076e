"""KV reservations as leases: one contract suite over the in-process and the Redis store.

Time passes differently per backend: the in-process store gets a fake clock that the test moves
on; the Redis store uses the server's ``TIME``, so the test waits (deadline-bounded, polling)
until the server's clock has moved on. Nothing sleeps to synchronise.

Redis tests skip when Redis is unreachable, except under ``CI``, where they fail. This file
carries its own check rather than a conftest fixture (``tests/ratelimit/conftest.py`` belongs to
another suite).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from typing import NoReturn

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.settings import Settings
from ratelimit.kvbudget import (
    KVBudgetStore,
    Lease,
    MemoryKVBudgetStore,
    RedisKVBudgetStore,
    round_to_blocks,
)
from tests.waiting import eventually

ENGINE = "http://10.0.0.7:8000/v1"  # engines are named by URL: ':' and '/' in a hash tag
OTHER_ENGINE = "http://10.0.0.8:8000/v1"
SHORT_TTL = 0.2
LONG_TTL = 30.0


def _unavailable(service: str, exc: BaseException) -> NoReturn:
    message = f"{service} is not reachable ({type(exc).__name__}); start it or see .ci/run"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def lease(tokens: int, tenant: str = "acme", engine: str = ENGINE) -> Lease:
    return Lease(engine, secrets.token_hex(8), tokens, tenant, "standard")


# --- backends ---------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class MemoryBackend:
    """One process: every "replica" is the same store."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self._store = MemoryKVBudgetStore(self.clock)

    def replica(self) -> KVBudgetStore:
        return self._store

    async def elapse(self, seconds: float) -> None:
        self.clock.now += seconds


class RedisBackend:
    """Each replica is a store on its own client, as two gateway processes would have."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"tg-test-{secrets.token_hex(4)}:"
        self.clients: list[Redis] = []

    def client(self, **options: bool) -> Redis:
        client = Redis.from_url(self.url, **options)
        self.clients.append(client)
        return client

    def replica(self) -> RedisKVBudgetStore:
        return RedisKVBudgetStore(self.client(), prefix=self.prefix)

    async def elapse(self, seconds: float) -> None:
        """Return once the server's clock (the one leases expire by) has moved on ``seconds``."""
        client = self.clients[0] if self.clients else self.client()
        start = await server_ms(client)
        done = start + seconds * 1000

        async def passed() -> bool:
            return await server_ms(client) >= done

        await eventually(passed, within_s=seconds + 5)

    async def our_keys(self) -> list[str]:
        return [k.decode() async for k in self.clients[0].scan_iter(match=f"{self.prefix}*")]

    async def close(self) -> None:
        keys = await self.our_keys()
        if keys:
            await self.clients[0].delete(*keys)
        for client in self.clients:
            await client.aclose()


async def server_ms(client: Redis) -> int:
    seconds, micros = await client.time()
    return seconds * 1000 + micros // 1000


Backend = MemoryBackend | RedisBackend


@pytest.fixture
async def redis_url() -> str:
    url = Settings().test_redis_url
    client = Redis.from_url(url, socket_connect_timeout=2)
    try:
        await client.ping()
    except (OSError, RedisError) as exc:
        _unavailable("Redis", exc)
    finally:
        await client.aclose()
    return url


@pytest.fixture
async def redis_backend(redis_url: str) -> AsyncIterator[RedisBackend]:
    backend = RedisBackend(redis_url)
    backend.client()  # the first client: clock reads and cleanup
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each contract test runs against both stores."""
    if request.param == "memory":
        yield MemoryBackend()
    else:
        found: RedisBackend = request.getfixturevalue("redis_backend")
        yield found


@pytest.fixture
def store(backend: Backend) -> KVBudgetStore:
    return backend.replica()


# --- block rounding and leases (pure) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "block_size", "expected"),
    [(0, 16, 0), (1, 16, 16), (16, 16, 16), (17, 16, 32), (4097, 1, 4097), (100, 128, 128)],
)
def test_round_to_blocks(tokens: int, block_size: int, expected: int) -> None:
    assert round_to_blocks(tokens, block_size) == expected


@given(st.integers(0, 10**9), st.integers(1, 4096))
def test_round_to_blocks_is_the_least_whole_number_of_blocks(tokens: int, block: int) -> None:
    rounded = round_to_blocks(tokens, block)
    assert rounded % block == 0
    assert tokens <= rounded < tokens + block


@pytest.mark.parametrize(("tokens", "block_size"), [(-1, 16), (10, 0)])
def test_round_to_blocks_rejects_nonsense(tokens: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="must"):
        round_to_blocks(tokens, block_size)


def test_a_lease_holds_tokens_on_a_named_engine() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        Lease(ENGINE, "l1", 0, "acme", "standard")
    with pytest.raises(ValueError, match="engine and a lease id"):
        Lease(ENGINE, "", 1, "acme", "standard")


# --- the contract -----------------------------------------------------------------------------


async def test_admits_up_to_the_limit_and_denies_beyond(store: KVBudgetStore) -> None:
    assert await store.try_reserve(lease(40), 100, LONG_TTL) == (True, 40)
    assert await store.try_reserve(lease(40), 100, LONG_TTL) == (True, 80)
    assert await store.try_reserve(lease(30), 100, LONG_TTL) == (False, 80)
    assert await store.try_reserve(lease(20), 100, LONG_TTL) == (True, 100)  # exactly full
    assert await store.try_reserve(lease(1), 100, LONG_TTL) == (False, 100)
    assert await store.reserved(ENGINE) == 100


async def test_a_request_larger_than_the_limit_is_never_admitted(store: KVBudgetStore) -> None:
    assert await store.try_reserve(lease(101), 100, LONG_TTL) == (False, 0)
    assert await store.reserved(ENGINE) == 0


async def test_a_denied_lease_holds_nothing(store: KVBudgetStore) -> None:
    denied = lease(50)
    await store.try_reserve(lease(60), 100, LONG_TTL)
    assert await store.try_reserve(denied, 100, LONG_TTL) == (False, 60)
    assert await store.renew(denied, LONG_TTL) is False
    await store.release(denied)
    assert await store.reserved(ENGINE) == 60


async def test_release_frees(store: KVBudgetStore) -> None:
    first = lease(60)
    await store.try_reserve(first, 100, LONG_TTL)
    assert (await store.try_reserve(lease(60), 100, LONG_TTL))[0] is False
    await store.release(first)
    assert await store.reserved(ENGINE) == 0
    assert await store.try_reserve(lease(60), 100, LONG_TTL) == (True, 60)


async def test_release_is_idempotent(store: KVBudgetStore) -> None:
    kept, gone = lease(30), lease(20)
    for held in (kept, gone):
        await store.try_reserve(held, 100, LONG_TTL)
    await store.release(gone)
    await store.release(gone)
    await store.release(lease(5))  # never reserved
    assert await store.reserved(ENGINE) == 30
    assert await store.by_tenant(ENGINE) == {"acme": 30}


async def test_a_retried_reservation_counts_once(store: KVBudgetStore) -> None:
    held = lease(30)
    assert await store.try_reserve(held, 100, LONG_TTL) == (True, 30)
    assert await store.try_reserve(held, 100, LONG_TTL) == (True, 30)
    await store.release(held)
    assert await store.reserved(ENGINE) == 0


async def test_expiry_frees(backend: Backend) -> None:
    store = backend.replica()
    await store.try_reserve(lease(30, "crashed"), 100, SHORT_TTL)
    await store.try_reserve(lease(50, "alive"), 100, LONG_TTL)
    assert await store.reserved(ENGINE) == 80
    await backend.elapse(SHORT_TTL)
    assert await store.reserved(ENGINE) == 50
    assert await store.by_tenant(ENGINE) == {"alive": 50}
    assert await store.try_reserve(lease(50), 100, LONG_TTL) == (True, 100)


async def test_renew_keeps_a_lease_alive(backend: Backend) -> None:
    store = backend.replica()
    held = lease(30)
    await store.try_reserve(held, 100, SHORT_TTL)
    assert await store.renew(held, LONG_TTL) is True
    await backend.elapse(SHORT_TTL)
    assert await store.reserved(ENGINE) == 30
    assert await store.renew(held, LONG_TTL) is True


async def test_renew_reports_expiry_and_the_lease_is_gone(backend: Backend) -> None:
    store = backend.replica()
    held = lease(30)
    await store.try_reserve(held, 100, LONG_TTL)
    assert await store.renew(held, SHORT_TTL) is True  # a renewal may also shorten
    await backend.elapse(SHORT_TTL)
    assert await store.renew(held, LONG_TTL) is False
    assert await store.renew(held, LONG_TTL) is False
    assert await store.reserved(ENGINE) == 0
    assert await store.by_tenant(ENGINE) == {}
    assert await store.try_reserve(held, 100, LONG_TTL) == (True, 30)  # a fresh reservation


async def test_by_tenant_sums(store: KVBudgetStore) -> None:
    a1, a2, b = lease(10, "a"), lease(15, "a"), lease(7, "b|with bar ü")
    for held in (a1, a2, b):
        await store.try_reserve(held, 100, LONG_TTL)
    assert await store.by_tenant(ENGINE) == {"a": 25, "b|with bar ü": 7}
    await store.release(a1)
    assert await store.by_tenant(ENGINE) == {"a": 15, "b|with bar ü": 7}
    await store.release(a2)
    await store.release(b)
    assert await store.by_tenant(ENGINE) == {}
    assert await store.reserved(ENGINE) == 0


async def test_engines_have_separate_budgets(store: KVBudgetStore) -> None:
    assert (await store.try_reserve(lease(100), 100, LONG_TTL))[0]
    assert await store.try_reserve(lease(100, engine=OTHER_ENGINE), 100, LONG_TTL) == (True, 100)
    assert await store.reserved(ENGINE) == 100
    assert await store.by_tenant(OTHER_ENGINE) == {"acme": 100}


async def test_nonpositive_ttl_is_refused(store: KVBudgetStore) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await store.try_reserve(lease(1), 100, 0)
    with pytest.raises(ValueError, match="ttl"):
        await store.renew(lease(1), -1)


async def test_concurrent_reservations_never_over_admit(store: KVBudgetStore) -> None:
    k, tokens = 37, 16
    limit = k * tokens + tokens - 1  # room for k and a bit, never k + 1
    results = await asyncio.gather(
        *(store.try_reserve(lease(tokens, f"t{i % 5}"), limit, LONG_TTL) for i in range(100))
    )
    assert sum(admitted for admitted, _ in results) == k
    assert all(after <= limit for _, after in results)
    assert await store.reserved(ENGINE) == k * tokens
    assert sum((await store.by_tenant(ENGINE)).values()) == k * tokens


async def test_replicas_share_one_budget(backend: Backend) -> None:
    one, two = backend.replica(), backend.replica()
    first = lease(60)
    assert await one.try_reserve(first, 100, LONG_TTL) == (True, 60)
    assert await two.reserved(ENGINE) == 60
    assert await two.try_reserve(lease(60), 100, LONG_TTL) == (False, 60)
    await two.release(first)  # whoever holds the lease id may release it
    assert await one.reserved(ENGINE) == 0

    k, tokens = 23, 10
    limit = k * tokens + 5
    stores = (one, two)
    results = await asyncio.gather(
        *(stores[i % 2].try_reserve(lease(tokens), limit, LONG_TTL) for i in range(100))
    )
    assert sum(admitted for admitted, _ in results) == k
    assert await one.reserved(ENGINE) == await two.reserved(ENGINE) == k * tokens


# --- Redis specifics --------------------------------------------------------------------------


async def test_an_engines_keys_share_one_cluster_slot_and_expire(
    redis_backend: RedisBackend,
) -> None:
    store = redis_backend.replica()
    held = lease(10)
    await store.try_reserve(held, 100, LONG_TTL)
    keys = await redis_backend.our_keys()
    assert sorted(keys) == sorted(store.keys(ENGINE))
    assert {key_slot(k.encode()) for k in keys} == {key_slot(ENGINE.encode())}
    client = redis_backend.clients[0]
    for key in keys:
        assert 0 < await client.pttl(key) <= (LONG_TTL + 1) * 1000
    await store.release(held)
    assert await redis_backend.our_keys() == []  # nothing left behind


async def test_scripts_are_loaded_again_after_a_flush(redis_backend: RedisBackend) -> None:
    store = redis_backend.replica()
    assert (await store.try_reserve(lease(10), 100, LONG_TTL))[0]
    await redis_backend.clients[0].script_flush()  # what a Redis restart does to the cache
    assert await store.try_reserve(lease(10), 100, LONG_TTL) == (True, 20)
    assert await store.reserved(ENGINE) == 20


async def test_decoded_responses_work_too(redis_backend: RedisBackend) -> None:
    store = RedisKVBudgetStore(
        redis_backend.client(decode_responses=True), prefix=redis_backend.prefix
    )
    await store.try_reserve(lease(10, "ü"), 100, LONG_TTL)
    assert await store.by_tenant(ENGINE) == {"ü": 10}
    assert await store.reserved(ENGINE) == 10


def test_a_prefix_with_braces_would_break_the_hash_tag() -> None:
    with pytest.raises(ValueError, match="braces"):
        RedisKVBudgetStore(Redis(), prefix="{oops}:")


async def test_an_unreachable_redis_raises_the_redis_error() -> None:
    with socket.socket() as bound:  # bound but not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        client = Redis(port=port, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0))
        try:
            with pytest.raises(RedisConnectionError):
                await RedisKVBudgetStore(client).try_reserve(lease(1), 100, LONG_TTL)
        finally:
            await client.aclose()
