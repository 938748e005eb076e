"""KV reservations as leases: one contract suite over the in-process and the Redis store.

Time passes differently per backend: the in-process store gets a fake clock that the test moves
on; the Redis store uses the server's ``TIME``, so the test waits (deadline-bounded, polling)
until the server's clock has moved on. Nothing sleeps to synchronise.

Most tests ask as ``critical`` with no other tenant waiting, which is the plain rule "admitted
iff it fits under the limit"; the fairness and priority rules themselves are
``tests/ratelimit/test_fairness.py``'s, and here they are checked to be applied (in one atomic
call, across replicas), and the Lua script to decide exactly as the Python rules do.

Redis tests skip when Redis is unreachable, except under ``CI``, where they fail. This file
carries its own check rather than a conftest fixture (``tests/ratelimit/conftest.py`` belongs to
another suite).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal, NoReturn

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.settings import Settings
from ratelimit.fairness import Decision, Priority
from ratelimit.kvbudget import (
    Ask,
    Choice,
    KVBudgetStore,
    Lease,
    MemoryKVBudgetStore,
    Placement,
    RedisKVBudgetStore,
    Rules,
    round_to_blocks,
)
from tests.clock import FakeClock
from tests.redis_commands import count_commands
from tests.waiting import eventually

ENGINE = "http://10.0.0.7:8000/v1"  # engines are named by URL: ':' and '/' in a key
OTHER_ENGINE = "http://10.0.0.8:8000/v1"
THIRD_ENGINE = "http://10.0.0.9:8000/v1"
SHORT_TTL = 1.0  # what a busy CI machine may lag between two calls stays well within it
WAITING_TTL = 1.5  # a few calls on a busy machine see the waiter; short enough to wait out
LONG_TTL = 30.0
RULES = Rules(waiting_ttl_s=LONG_TTL)  # a waiter stays listed for the whole test
PRIORITIES: tuple[Priority, ...] = ("critical", "standard", "sheddable")


def _unavailable(service: str, exc: BaseException) -> NoReturn:
    message = f"{service} is not reachable ({type(exc).__name__}); start it or see .ci/run"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def lease(
    tokens: int, tenant: str = "acme", priority: Priority = "critical", *, engine: str = ENGINE
) -> Lease:
    return Lease(engine, secrets.token_hex(8), tokens, tenant, priority)


def one_engine(wanted: Lease, limit: int) -> Ask:
    """The admission that would grant ``wanted``, with its engine as the only candidate."""
    choice = Choice(wanted.engine, limit, wanted.tokens)
    return Ask(wanted.lease_id, wanted.tenant, wanted.priority, (choice,))


async def reserve(
    store: KVBudgetStore, wanted: Lease, limit: int, ttl_s: float = LONG_TTL, rules: Rules = RULES
) -> Decision:
    """Ask for ``wanted`` on its engine alone; when admitted, the lease granted is ``wanted``."""
    placed = await store.admit(one_engine(wanted, limit), ttl_s, rules)
    assert placed.lease == (wanted if placed.decision == "admit" else None)
    return placed.decision


# --- backends ---------------------------------------------------------------------------------


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
async def redis_url(request: pytest.FixtureRequest) -> str:
    url = Settings().test_redis_url
    if request.node.get_closest_marker("private_redis") is not None:
        url = request.getfixturevalue("private_redis_url")  # tests/conftest.py
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


def test_an_ask_names_distinct_candidate_engines() -> None:
    with pytest.raises(ValueError, match="at least one candidate"):
        Ask("l1", "acme", "standard", ())
    twice = (Choice(ENGINE, 100, 10), Choice(ENGINE, 200, 10))
    with pytest.raises(ValueError, match="distinct"):
        Ask("l1", "acme", "standard", twice)


@pytest.mark.parametrize(
    ("fields", "match"),
    [({"weights": {"idle": 0}}, "weight"), ({"weights": {"idle": 1.5}}, "weight"),
     ({"weights": {"idle": True}}, "weight"), ({"pressure_threshold": 0.0}, "pressure"),
     ({"pressure_threshold": 1.5}, "pressure"), ({"waiting_ttl_s": 0}, "ttl")],
)  # fmt: skip
def test_rules_refuse_nonsense_before_either_store_sees_them(
    fields: dict[str, Any], match: str
) -> None:
    # "idle" is nobody in particular: a bad weight is refused even where fairness is not needed
    with pytest.raises(ValueError, match=match):
        Rules(**fields)


# --- the contract -----------------------------------------------------------------------------


async def test_admits_up_to_the_limit_and_waits_beyond(store: KVBudgetStore) -> None:
    assert await reserve(store, lease(40), 100) == "admit"
    assert await reserve(store, lease(40), 100) == "admit"
    assert await store.reserved(ENGINE) == 80
    assert await reserve(store, lease(30), 100) == "wait"
    assert await reserve(store, lease(20), 100) == "admit"  # exactly full
    assert await reserve(store, lease(1), 100) == "wait"
    assert await store.reserved(ENGINE) == 100


async def test_a_request_larger_than_the_limit_is_never_admitted(store: KVBudgetStore) -> None:
    assert await reserve(store, lease(101), 100) == "wait"  # refusing it is the caller's call
    assert await store.reserved(ENGINE) == 0


async def test_a_denied_lease_holds_nothing(store: KVBudgetStore) -> None:
    denied = lease(50)
    await reserve(store, lease(60), 100)
    assert await reserve(store, denied, 100) == "wait"
    assert await store.renew(denied, LONG_TTL) is False
    await store.release(denied)
    assert await store.reserved(ENGINE) == 60


async def test_release_frees(store: KVBudgetStore) -> None:
    first = lease(60)
    await reserve(store, first, 100)
    assert await reserve(store, lease(60), 100) == "wait"
    await store.release(first)
    assert await store.reserved(ENGINE) == 0
    assert await reserve(store, lease(60), 100) == "admit"
    assert await store.reserved(ENGINE) == 60


async def test_release_is_idempotent(store: KVBudgetStore) -> None:
    kept, gone = lease(30), lease(20)
    for held in (kept, gone):
        await reserve(store, held, 100)
    await store.release(gone)
    await store.release(gone)
    await store.release(lease(5))  # never reserved
    assert await store.reserved(ENGINE) == 30
    assert await store.by_tenant(ENGINE) == {"acme": 30}


async def test_a_retried_reservation_counts_once(store: KVBudgetStore) -> None:
    held = lease(30)
    assert await reserve(store, held, 100) == "admit"
    assert await reserve(store, held, 100) == "admit"
    assert await store.reserved(ENGINE) == 30
    await store.release(held)
    assert await store.reserved(ENGINE) == 0


async def test_a_retried_admission_renews_where_it_was_admitted(backend: Backend) -> None:
    store = backend.replica()
    retried = Ask(
        "once", "acme", "standard", (Choice(ENGINE, 100, 30), Choice(OTHER_ENGINE, 100, 30))
    )
    first = await store.admit(retried, SHORT_TTL, RULES)
    assert first == Placement("admit", Lease(ENGINE, "once", 30, "acme", "standard"))
    # OTHER_ENGINE is now the freer one, but the retry stays on ENGINE and renews the lease there
    assert await store.admit(retried, LONG_TTL, RULES) == first
    await backend.elapse(SHORT_TTL)
    assert await store.reserved(ENGINE) == 30
    assert await store.reserved(OTHER_ENGINE) == 0


async def test_expiry_frees(backend: Backend) -> None:
    store = backend.replica()
    await reserve(store, lease(30, "crashed"), 100, SHORT_TTL)
    await reserve(store, lease(50, "alive"), 100, LONG_TTL)
    assert await store.reserved(ENGINE) == 80
    await backend.elapse(SHORT_TTL)
    assert await store.reserved(ENGINE) == 50
    assert await store.by_tenant(ENGINE) == {"alive": 50}
    assert await reserve(store, lease(50), 100) == "admit"
    assert await store.reserved(ENGINE) == 100


async def test_renew_keeps_a_lease_alive(backend: Backend) -> None:
    store = backend.replica()
    held = lease(30)
    await reserve(store, held, 100, SHORT_TTL)
    assert await store.renew(held, LONG_TTL) is True
    await backend.elapse(SHORT_TTL)
    assert await store.reserved(ENGINE) == 30
    assert await store.renew(held, LONG_TTL) is True


async def test_renew_reports_expiry_and_the_lease_is_gone(backend: Backend) -> None:
    store = backend.replica()
    held = lease(30)
    await reserve(store, held, 100)
    assert await store.renew(held, SHORT_TTL) is True  # a renewal may also shorten
    await backend.elapse(SHORT_TTL)
    assert await store.renew(held, LONG_TTL) is False
    assert await store.renew(held, LONG_TTL) is False
    assert await store.reserved(ENGINE) == 0
    assert await store.by_tenant(ENGINE) == {}
    assert await reserve(store, held, 100) == "admit"  # a fresh reservation
    assert await store.reserved(ENGINE) == 30


async def test_by_tenant_sums(store: KVBudgetStore) -> None:
    a1, a2, b = lease(10, "a"), lease(15, "a"), lease(7, "b|with bar ü")
    for held in (a1, a2, b):
        await reserve(store, held, 100)
    assert await store.by_tenant(ENGINE) == {"a": 25, "b|with bar ü": 7}
    await store.release(a1)
    assert await store.by_tenant(ENGINE) == {"a": 15, "b|with bar ü": 7}
    await store.release(a2)
    await store.release(b)
    assert await store.by_tenant(ENGINE) == {}
    assert await store.reserved(ENGINE) == 0


async def test_engines_have_separate_budgets(store: KVBudgetStore) -> None:
    assert await reserve(store, lease(100), 100) == "admit"
    assert await reserve(store, lease(100, engine=OTHER_ENGINE), 100) == "admit"
    assert await store.reserved(ENGINE) == 100
    assert await store.by_tenant(OTHER_ENGINE) == {"acme": 100}


async def test_nonpositive_ttl_is_refused(store: KVBudgetStore) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await store.admit(one_engine(lease(1), 100), 0, RULES)
    with pytest.raises(ValueError, match="ttl"):
        await store.renew(lease(1), -1)
    assert await store.reserved(ENGINE) == 0


async def test_concurrent_reservations_never_over_admit(store: KVBudgetStore) -> None:
    k, tokens = 37, 16
    limit = k * tokens + tokens - 1  # room for k and a bit, never k + 1
    decisions = await asyncio.gather(
        *(reserve(store, lease(tokens, f"t{i % 5}"), limit) for i in range(100))
    )
    assert decisions.count("admit") == k
    assert decisions.count("wait") == 100 - k
    assert await store.reserved(ENGINE) == k * tokens
    assert sum((await store.by_tenant(ENGINE)).values()) == k * tokens


async def test_replicas_share_one_budget(backend: Backend) -> None:
    one, two = backend.replica(), backend.replica()
    first = lease(60)
    assert await reserve(one, first, 100) == "admit"
    assert await two.reserved(ENGINE) == 60
    assert await reserve(two, lease(60), 100) == "wait"
    await two.release(first)  # whoever holds the lease id may release it
    assert await one.reserved(ENGINE) == 0

    k, tokens = 23, 10
    limit = k * tokens + 5
    stores = (one, two)
    decisions = await asyncio.gather(
        *(reserve(stores[i % 2], lease(tokens), limit) for i in range(100))
    )
    assert decisions.count("admit") == k
    assert await one.reserved(ENGINE) == await two.reserved(ENGINE) == k * tokens


# --- routing, fairness and priority (ratelimit.fairness, applied atomically) ---------------------


async def test_routes_to_the_engine_with_the_most_free_budget(store: KVBudgetStore) -> None:
    assert await reserve(store, lease(50, "x"), 100) == "admit"  # ENGINE: 50 free
    choices = (Choice(ENGINE, 100, 20), Choice(OTHER_ENGINE, 80, 32))  # block sizes differ
    placed = await store.admit(Ask("r1", "acme", "standard", choices), LONG_TTL, RULES)
    assert placed == Placement("admit", Lease(OTHER_ENGINE, "r1", 32, "acme", "standard"))
    placed = await store.admit(Ask("r2", "acme", "standard", choices), LONG_TTL, RULES)
    assert placed.lease is not None and placed.lease.engine == ENGINE  # 50 free against 48
    placed = await store.admit(Ask("r3", "acme", "standard", choices), LONG_TTL, RULES)
    assert placed.lease is not None and placed.lease.engine == OTHER_ENGINE  # 30 against 48
    assert await store.by_tenant(ENGINE) == {"x": 50, "acme": 20}
    assert await store.by_tenant(OTHER_ENGINE) == {"acme": 64}


async def test_equally_free_engines_are_tried_in_the_given_order(store: KVBudgetStore) -> None:
    choices = (Choice(OTHER_ENGINE, 100, 10), Choice(ENGINE, 100, 10))
    engines = []
    for n in range(4):
        placed = await store.admit(Ask(f"r{n}", "acme", "standard", choices), LONG_TTL, RULES)
        assert placed.lease is not None
        engines.append(placed.lease.engine)
    assert engines == [OTHER_ENGINE, ENGINE, OTHER_ENGINE, ENGINE]


async def test_a_preferred_engine_goes_first_while_it_has_room(store: KVBudgetStore) -> None:
    """The router's choice (the engine holding the prompt's prefix) is tried before the engine
    with the most free budget, and the rest still by free budget when it is full."""
    assert await reserve(store, lease(40, "x"), 100) == "admit"  # ENGINE: 60 free, 50 below 90 %
    choices = (Choice(ENGINE, 100, 20), Choice(OTHER_ENGINE, 100, 20))  # OTHER: 100 free
    for n in range(2):
        placed = await store.admit(Ask(f"p{n}", "acme", "standard", choices, preferred=1),
                                   LONG_TTL, RULES)  # fmt: skip
        assert placed.lease is not None and placed.lease.engine == ENGINE
    placed = await store.admit(Ask("p2", "acme", "standard", choices, preferred=1),
                               LONG_TTL, RULES)  # fmt: skip
    assert placed.lease is not None and placed.lease.engine == OTHER_ENGINE  # ENGINE at 90 %
    placed = await store.admit(Ask("p3", "acme", "standard", choices), LONG_TTL, RULES)
    assert placed.lease is not None and placed.lease.engine == OTHER_ENGINE  # no preference


async def test_sheddable_work_refused_on_a_pressured_engine_runs_on_another(
    store: KVBudgetStore,
) -> None:
    assert await reserve(store, lease(850, "x"), 1000) == "admit"  # 150 free, but 90 % is 900
    choices = (Choice(ENGINE, 1000, 100), Choice(OTHER_ENGINE, 100, 10))  # 100 free
    placed = await store.admit(Ask("s1", "acme", "sheddable", choices), LONG_TTL, RULES)
    assert placed == Placement("admit", Lease(OTHER_ENGINE, "s1", 10, "acme", "sheddable"))
    alone = await store.admit(Ask("s2", "acme", "sheddable", choices[:1]), LONG_TTL, RULES)
    assert alone == Placement("reject")
    assert await store.reserved(ENGINE) == 850


async def test_under_pressure_sheddable_is_rejected_standard_waits_critical_uses_headroom(
    store: KVBudgetStore,
) -> None:
    assert await reserve(store, lease(60, "b"), 100) == "admit"  # b's work is critical
    # sheddable work fills at most 3/4 of the pressure line: 67.5 of 100
    assert await reserve(store, lease(7, "a", "sheddable"), 100) == "admit"  # 67
    assert await reserve(store, lease(1, "a", "sheddable"), 100) == "reject"  # 68
    # where sheddable stops, standard work still has room up to the pressure line
    assert await reserve(store, lease(16, "a", "standard"), 100) == "admit"  # 83
    assert await reserve(store, lease(1, "a", "sheddable"), 100) == "reject"
    # a rejected request does not wait: b may still go beyond half the limit
    assert await reserve(store, lease(5, "b"), 100) == "admit"  # 88
    assert await reserve(store, lease(3, "a", "standard"), 100) == "wait"  # 91: the headroom
    assert await reserve(store, lease(2, "a", "critical"), 100) == "admit"  # 90: its headroom
    # a's standard request is waiting now: b, far above its half, yields to it
    assert await reserve(store, lease(1, "b"), 100) == "wait"
    assert await store.by_tenant(ENGINE) == {"a": 25, "b": 65}


async def test_weights_change_the_share(store: KVBudgetStore) -> None:
    weighted = Rules(weights={"a": 3}, waiting_ttl_s=LONG_TTL)
    assert await reserve(store, lease(40, "a"), 100) == "admit"
    assert await reserve(store, lease(70, "b"), 100) == "wait"  # b waits from now on
    more = lease(20, "a")
    assert await reserve(store, more, 100) == "wait"  # 60 is above an even share of 50
    assert await reserve(store, more, 100, rules=weighted) == "admit"  # 60 of a 75 share
    assert await reserve(store, lease(16, "a"), 100, rules=weighted) == "wait"  # 76
    assert await reserve(store, lease(15, "a"), 100, rules=weighted) == "admit"  # exactly 75
    assert await store.by_tenant(ENGINE) == {"a": 75}


async def test_a_waiting_tenant_is_seen_by_every_replica_until_its_entry_lapses(
    backend: Backend,
) -> None:
    one, two = backend.replica(), backend.replica()
    rules = Rules(waiting_ttl_s=WAITING_TTL)
    assert await reserve(one, lease(80, "a"), 100, rules=rules) == "admit"
    both = (Choice(ENGINE, 100, 40), Choice(OTHER_ENGINE, 100, 101))  # fits neither
    assert await one.admit(Ask("b1", "b", "critical", both), LONG_TTL, rules) == Placement("wait")
    # the other replica sees b waiting on both candidates: a may not go beyond half of either
    a_here, a_there = lease(10, "a"), lease(60, "a", engine=OTHER_ENGINE)
    assert await reserve(two, a_here, 100, rules=rules) == "wait"
    assert await reserve(two, a_there, 100, rules=rules) == "wait"
    await backend.elapse(WAITING_TTL)  # b did not ask again: its entry lapses
    assert await reserve(two, a_here, 100, rules=rules) == "admit"
    assert await reserve(two, a_there, 100, rules=rules) == "admit"
    assert await one.by_tenant(ENGINE) == {"a": 90}
    assert await one.by_tenant(OTHER_ENGINE) == {"a": 60}


# --- Redis specifics --------------------------------------------------------------------------


async def test_all_keys_of_all_engines_share_one_cluster_slot_and_expire(
    redis_backend: RedisBackend,
) -> None:
    store = redis_backend.replica()
    held = [lease(10), lease(10, "b", engine=OTHER_ENGINE)]
    for wanted in held:
        assert await reserve(store, wanted, 100) == "admit"
    both = (Choice(ENGINE, 100, 95), Choice(OTHER_ENGINE, 100, 95))
    wait_briefly = Rules(waiting_ttl_s=WAITING_TTL)
    assert await store.admit(Ask("w", "c", "standard", both), LONG_TTL, wait_briefly) == (
        Placement("wait")
    )
    keys = await redis_backend.our_keys()
    assert sorted(keys) == sorted(store.keys(ENGINE) + store.keys(OTHER_ENGINE))
    assert {key_slot(k.encode()) for k in keys} == {key_slot(b"{pool}")}
    client = redis_backend.clients[0]
    for key in keys:  # alive a second past the last lease, at most about two TTLs
        assert 0 < await client.pttl(key) <= (2 * LONG_TTL + 1) * 1000
    for wanted in held:
        await store.release(wanted)
    waiting = sorted([store.keys(ENGINE)[4], store.keys(OTHER_ENGINE)[4]])
    assert sorted(await redis_backend.our_keys()) == waiting  # leases leave nothing behind
    for key in waiting:  # and the waiters' keys still expire
        assert 0 < await client.pttl(key) <= (LONG_TTL + 1) * 1000


async def test_one_evalsha_per_admit_whatever_the_number_of_candidates(
    redis_backend: RedisBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis_backend.client()
    store = RedisKVBudgetStore(client, prefix=redis_backend.prefix)
    three = tuple(Choice(e, 100, 60) for e in (ENGINE, OTHER_ENGINE, THIRD_ENGINE))
    first = await store.admit(Ask("l0", "a", "critical", three), LONG_TTL, RULES)  # loads it
    assert first.lease is not None and first.lease.engine == ENGINE
    sent = count_commands(client, monkeypatch)
    engines = []
    for n in (1, 2):
        placed = await store.admit(Ask(f"l{n}", "a", "critical", three), LONG_TTL, RULES)
        assert placed.lease is not None
        engines.append(placed.lease.engine)
    assert engines == [OTHER_ENGINE, THIRD_ENGINE]
    assert sent == ["EVALSHA", "EVALSHA"]
    assert await store.admit(Ask("l3", "b", "critical", three), LONG_TTL, RULES) == (
        Placement("wait")
    )
    assert sent == ["EVALSHA"] * 3  # the waiter was registered on all three in the same call
    waiting = [store.keys(e)[4] for e in (ENGINE, OTHER_ENGINE, THIRD_ENGINE)]
    assert await client.exists(*waiting) == 3


@pytest.mark.private_redis
async def test_scripts_are_loaded_again_after_a_flush(redis_backend: RedisBackend) -> None:
    store = redis_backend.replica()
    assert await reserve(store, lease(10), 100) == "admit"
    await redis_backend.clients[0].script_flush()  # what a Redis restart does to the cache
    assert await reserve(store, lease(10), 100) == "admit"
    assert await store.reserved(ENGINE) == 20


async def test_decoded_responses_work_too(redis_backend: RedisBackend) -> None:
    store = RedisKVBudgetStore(
        redis_backend.client(decode_responses=True), prefix=redis_backend.prefix
    )
    assert await reserve(store, lease(10, "ü"), 100) == "admit"
    both = (Choice(ENGINE, 100, 10), Choice(OTHER_ENGINE, 100, 16))
    placed = await store.admit(Ask("l2", "ü", "standard", both), LONG_TTL, RULES)
    assert placed == Placement("admit", Lease(OTHER_ENGINE, "l2", 16, "ü", "standard"))
    assert await store.by_tenant(ENGINE) == {"ü": 10}
    assert await store.reserved(OTHER_ENGINE) == 16


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
                await RedisKVBudgetStore(client).admit(one_engine(lease(1), 100), LONG_TTL, RULES)
        finally:
            await client.aclose()


# --- the Lua script decides as the Python rules do -------------------------------------------

ROUTED = (ENGINE, OTHER_ENGINE, THIRD_ENGINE)


@dataclasses.dataclass(frozen=True)
class Step:
    """One call in a sequence: admit a new request, retry an earlier one (same lease id), or
    release an earlier lease (``which`` counts round the earlier ones)."""

    kind: Literal["admit", "retry", "release"]
    ask: Ask | None = None
    which: int = 0


@st.composite
def candidates(draw: st.DrawFn) -> tuple[Choice, ...]:
    engines = draw(st.permutations(ROUTED))[: draw(st.integers(1, len(ROUTED)))]
    limits = st.sampled_from([20, 40, 60, 100, 120])  # so that requests often meet the bounds
    return tuple(Choice(e, draw(limits), draw(st.integers(1, 60))) for e in engines)


@st.composite
def steps(draw: st.DrawFn) -> Step:
    kinds: list[Literal["admit", "retry", "release"]] = ["admit", "admit", "release", "retry"]
    kind = draw(st.sampled_from(kinds))
    if kind != "admit":
        return Step(kind, which=draw(st.integers(0, 30)))
    tenant, priority = draw(st.sampled_from("abc")), draw(st.sampled_from(PRIORITIES))
    return Step("admit", Ask("?", tenant, priority, draw(candidates())))


rule_sets = st.builds(
    Rules,
    weights=st.dictionaries(st.sampled_from("abc"), st.integers(1, 4)),
    pressure_threshold=st.sampled_from([0.5, 0.75, 0.9, 1.0]),
    waiting_ttl_s=st.just(LONG_TTL),  # nothing lapses: both stores see the same waiters
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rules=rule_sets, sequence=st.lists(steps(), min_size=5, max_size=40))
async def test_the_redis_store_decides_and_routes_as_the_memory_store(
    redis_backend: RedisBackend, rules: Rules, sequence: list[Step]
) -> None:
    memory = MemoryKVBudgetStore(FakeClock())  # its clock stands still: nothing expires
    prefix = f"{redis_backend.prefix}{secrets.token_hex(4)}:"  # a fresh budget per example
    shared = RedisKVBudgetStore(redis_backend.clients[0], prefix=prefix)
    asked: list[Ask] = []
    granted: list[Lease] = []
    for n, step in enumerate(sequence):
        if step.kind == "release":
            if granted:
                gone = granted[step.which % len(granted)]
                await memory.release(gone)
                await shared.release(gone)
            continue
        if step.kind == "admit":
            assert step.ask is not None
            asked.append(dataclasses.replace(step.ask, lease_id=f"l{n}"))
        elif not asked:
            continue
        ask = asked[-1] if step.kind == "admit" else asked[step.which % len(asked)]
        expected = await memory.admit(ask, LONG_TTL, rules)
        assert await shared.admit(ask, LONG_TTL, rules) == expected, f"step {n}: {ask}"
        if expected.lease is not None:
            granted.append(expected.lease)
    for engine in ROUTED:
        assert await shared.by_tenant(engine) == await memory.by_tenant(engine)
