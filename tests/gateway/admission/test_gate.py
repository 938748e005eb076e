"""``Gate`` (``gateway/admission/gate.py``): the rate limits and the KV budget asked at once,
whichever refuses the other's reservation given back, and ``settle`` refunding and releasing
without raising. Every test runs on the in-process backends and on Redis (a random key prefix,
both circuits ``closed``, so a Redis failure fails the test instead of falling back)."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from audit.record import Usage
from gateway.admission.budget import KVAdmission, open_admission
from gateway.admission.circuit import Circuit, redis_errors
from gateway.admission.gate import Gate
from gateway.admission.limiter import Admission, Limiter
from gateway.admission.ratelimits import KeyLimiter, open_limiter
from gateway.admission.redisconn import open_redis
from gateway.admission.spending import SpendAsk
from gateway.auth.keys import KeyInfo
from gateway.errors import GatewayError, RateLimited
from gateway.settings import Settings
from gateway.upstream.engine import Upstream
from ratelimit.autopipe import AutoPipeline
from ratelimit.kvbudget import KVBudgetStore, MemoryKVBudgetStore, RedisKVBudgetStore
from ratelimit.limits import MemoryBackend, RateLimitBackend, RedisBackend
from tests.waiting import eventually

GateFactory = Callable[..., Gate]
CAPACITY = 1000  # per engine; admitted at 85 %: 850 tokens, in 16-token blocks


@pytest.fixture
async def make_gate(redis_at: tuple[str, str] | None) -> AsyncIterator[GateFactory]:
    """``make_gate(admission_wait_ms=0)``: a gate as the app builds one, on either backend."""
    clients: list[AutoPipeline] = []
    url, prefix = redis_at or ("", "")

    def make(admission_wait_ms: int = 0) -> Gate:
        settings = Settings(kv_capacity_tokens=CAPACITY, admission_wait_ms=admission_wait_ms)
        kv = open_admission(settings.admission, None)
        redis = open_redis(Settings(redis_url=url)) if url else None
        if redis is None:
            return Gate(open_limiter(settings.admission, None), kv)
        clients.append(redis)
        limits: Circuit[RateLimitBackend] = Circuit(
            "rate limits", RedisBackend(redis, key_prefix=prefix), MemoryBackend(),
            fail="closed", errors=redis_errors())  # fmt: skip
        budget: Circuit[KVBudgetStore] = Circuit(
            "KV budget", RedisKVBudgetStore(redis, prefix=prefix), MemoryKVBudgetStore(),
            fail="closed", errors=redis_errors())  # fmt: skip
        return Gate(KeyLimiter(limits, settings), dataclasses.replace(kv, store=budget))

    try:
        yield make
    finally:
        for client in clients:
            await client.aclose()


def key(tpm: int = 1000) -> KeyInfo:
    return KeyInfo(secrets.token_hex(6), "acme", "client", "hidden", None, tpm,
                   datetime.now(UTC), None, b"")  # fmt: skip


async def reserved(kv: KVAdmission, engine: Upstream) -> int:
    return await kv.store.call(lambda store: store.reserved(engine.base_url))


async def test_admitted_by_both_the_ticket_carries_the_limiters_headers(
    make_gate: GateFactory,
) -> None:
    gate = make_gate()
    busy, idle = Upstream("http://busy/v1"), Upstream("http://idle/v1")
    await gate.kv.admit([busy], "acme", "standard", 400)
    ticket, ordered = await gate.admit(key(tpm=1000), [busy, idle], "standard", 300)
    assert ordered == [idle, busy]  # the granted engine first
    assert ticket.reserved_tokens == 300
    assert ticket.grant.lease is not None and ticket.grant.lease.tokens == 304
    assert await reserved(gate.kv, idle) == 304
    headers = dict(ticket.headers)
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == "700"
    assert "x-ratelimit-reset-tokens" in headers


@dataclasses.dataclass
class AfterGrant:
    """The real limiter, answering only once the KV budget has granted (as Redis answers both
    scripts of one round trip): its refusal then finds a grant to give back."""

    limiter: Limiter
    kv: KVAdmission
    leases_before: int

    def at_once(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission | None:
        return self.limiter.at_once(key, tokens, spend)

    async def admit(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission:
        await eventually(lambda: len(self.kv.leases) > self.leases_before, within_s=2)
        return await self.limiter.admit(key, tokens, spend)

    async def settle(
        self, admission: Admission, used_tokens: int, usage: Usage | None = None
    ) -> None:
        await self.limiter.settle(admission, used_tokens, usage)


@pytest.mark.parametrize("granted_first", [False, True])
async def test_a_limiter_refusal_gives_the_kv_grant_back(
    make_gate: GateFactory, granted_first: bool
) -> None:
    gate = make_gate()
    engine = Upstream("http://engine/v1")
    held, _ = await gate.kv.admit([engine], "acme", "standard", 160)
    before = await reserved(gate.kv, engine)
    limiter = AfterGrant(gate.limiter, gate.kv, 1) if granted_first else gate.limiter
    with pytest.raises(RateLimited) as refused:  # 300 tokens, 100 per minute: never fits
        await Gate(limiter, gate.kv).admit(key(tpm=100), [engine], "standard", 300)
    assert refused.value.type == "tokens"
    assert refused.value.headers()["x-ratelimit-limit-tokens"] == "100"

    async def given_back() -> bool:
        return await reserved(gate.kv, engine) == before

    await eventually(given_back, within_s=2)  # an admission still in flight is forgotten too
    assert list(gate.kv.leases.values()) == [held]


@pytest.mark.parametrize(
    ("tokens", "code", "status"),
    [(600, "kv_budget_exhausted", 429), (900, "kv_request_too_large", 400)],
    ids=["budget-full", "can-never-fit"],
)
async def test_a_kv_refusal_refunds_the_limiter_and_carries_its_headers(
    make_gate: GateFactory, tokens: int, code: str, status: int
) -> None:
    gate = make_gate()
    engine = Upstream("http://engine/v1")
    await gate.kv.admit([engine], "acme", "critical", 800 if tokens == 600 else 16)
    before = await reserved(gate.kv, engine)
    caller = key(tpm=1000)
    with pytest.raises(GatewayError) as refused:
        await gate.admit(caller, [engine], "standard", tokens)
    assert refused.value.code == code and refused.value.status == status
    headers = refused.value.headers()  # given when the refusal is made: part of it
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert headers["x-ratelimit-remaining-tokens"] == str(1000 - tokens)
    assert await reserved(gate.kv, engine) == before
    again = await gate.limiter.admit(caller, tokens)  # refused unless all of it came back
    assert dict(again.headers)["x-ratelimit-remaining-tokens"] == str(1000 - tokens)


async def test_settle_refunds_the_unused_tokens_and_releases_the_lease(
    make_gate: GateFactory,
) -> None:
    gate = make_gate()
    engine, caller = Upstream("http://engine/v1"), key(tpm=1000)
    ticket, _ = await gate.admit(caller, [engine], "standard", 600)
    assert await reserved(gate.kv, engine) == 608
    assert await gate.settle(ticket, 100) == []
    assert await reserved(gate.kv, engine) == 0 and not gate.kv.leases
    second, _ = await gate.admit(caller, [engine], "standard", 700)  # fits: 500 came back
    assert await gate.settle(second, 700) == []  # all of it used: nothing comes back
    with pytest.raises(RateLimited) as refused:  # the 100 used first stay spent: 200 left
        await gate.admit(caller, [engine], "standard", 300)
    assert refused.value.code == "rate_limit_exceeded" and refused.value.type == "tokens"


@dataclasses.dataclass
class BrokenSettle:
    """The real limiter, whose refunds fail (Redis went away after admission)."""

    limiter: Limiter

    def at_once(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission | None:
        return self.limiter.at_once(key, tokens, spend)

    async def admit(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission:
        return await self.limiter.admit(key, tokens, spend)

    async def settle(
        self, admission: Admission, used_tokens: int, usage: Usage | None = None
    ) -> None:
        raise RedisConnectionError("gone")


async def test_settle_reports_a_failure_instead_of_raising(make_gate: GateFactory) -> None:
    gate = make_gate()
    broken = Gate(BrokenSettle(gate.limiter), gate.kv)
    engine = Upstream("http://engine/v1")
    ticket, _ = await broken.admit(key(), [engine], "standard", 300)
    failures = await broken.settle(ticket, 0)
    assert [type(f) for f in failures] == [RedisConnectionError]
    assert await reserved(gate.kv, engine) == 0  # the lease went back all the same


async def test_cancelled_while_waiting_for_the_budget_nothing_stays_reserved(
    make_gate: GateFactory,
) -> None:
    gate = make_gate(admission_wait_ms=10_000)
    engine, caller = Upstream("http://engine/v1"), key(tpm=1000)
    held, _ = await gate.kv.admit([engine], "acme", "critical", 800)
    waiting = asyncio.create_task(gate.admit(caller, [engine], "standard", 600))
    await eventually(lambda: gate.kv.waiting == 1, within_s=2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.kv.waiting == 0 and list(gate.kv.leases.values()) == [held]

    async def only_the_held() -> bool:
        return await reserved(gate.kv, engine) == 800

    await eventually(only_the_held, within_s=2)
    again = await gate.limiter.admit(caller, 600)  # the limiter's reservation came back
    assert dict(again.headers)["x-ratelimit-remaining-tokens"] == "400"


@pytest.mark.parametrize("limited", [True, False], ids=["both-asked", "kv-alone"])
@pytest.mark.parametrize("cancels", [1, 2])
async def test_a_caller_cancelled_at_any_point_of_admission_leaves_nothing_reserved(
    make_gate: GateFactory, cancels: int, limited: bool
) -> None:
    """Cancelled after 0, 1, 2 ... turns of the loop (and once more a turn later: a client
    gone and a server shutting down), whatever both had granted by then is given back; one
    that got its ticket before the cancellation is settled, as its owner would. The same for
    a key no limit counts, whose KV admission runs in the caller's own task."""
    gate = make_gate()
    engine = Upstream("http://engine/v1")

    async def nothing_reserved() -> bool:
        return await reserved(gate.kv, engine) == 0 and not gate.kv.leases

    for turns in range(30):
        caller = key() if limited else key(tpm=0)
        task = asyncio.create_task(gate.admit(caller, [engine], "standard", 300))
        for _ in range(turns):
            await asyncio.sleep(0)  # one turn of the loop: where the cancellation lands
        for _ in range(cancels):
            task.cancel()
            await asyncio.sleep(0)
        try:
            ticket, _ = await task
        except asyncio.CancelledError:
            pass
        else:
            assert await gate.settle(ticket, 0) == []
        await eventually(nothing_reserved, within_s=2)


class TaskCount:
    """The tasks made on the running loop while installed (its task factory)."""

    def __init__(self) -> None:
        self.made = 0

    def __enter__(self) -> TaskCount:
        loop = asyncio.get_running_loop()
        self._before = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            self.made += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.get_running_loop().set_task_factory(self._before)


@pytest.mark.parametrize(
    ("limited", "measured", "tasks"),
    [(False, True, 0), (True, False, 0), (True, True, 1)],
    ids=["kv-alone", "limiter-alone", "both-asked"],
)
async def test_only_two_stores_to_ask_take_a_task_beside_the_request(
    make_gate: GateFactory, redis_at: tuple[str, str] | None, limited: bool, measured: bool,
    tasks: int,
) -> None:  # fmt: skip
    """A key no limit counts asks the KV budget alone, and an engine whose KV capacity is not
    known asks the limiter alone, in the caller's own task; both are asked side by side (one
    task for the KV budget) only when both have something to ask; settling, likewise (one
    task for the release). On Redis, the auto-pipeline's one flush per round trip comes on
    top, whatever the path."""
    gate = make_gate()
    engine = Upstream("http://engine/v1")
    if not measured:
        gate.kv.engine(engine).controller = None  # as before the first scrape of its capacity
    ticket, ordered = await gate.admit(key(tpm=1000 if limited else 0), [engine], "standard", 300)
    assert await gate.settle(ticket, 0) == []  # warm: Redis scripts loaded, connections made
    with TaskCount() as count:
        ticket, ordered = await gate.admit(key(tpm=1000 if limited else 0), [engine],
                                           "standard", 300)  # fmt: skip
    assert ordered == [engine]
    assert (ticket.grant.lease is not None) == measured
    assert bool(ticket.admission.scopes) == limited
    flushes = 1 if redis_at else 0  # a batch of one or two scripts
    assert count.made == tasks + flushes
    with TaskCount() as count:  # settled the same way: the release beside the refund
        assert await gate.settle(ticket, 0) == []
    assert count.made == tasks + flushes
