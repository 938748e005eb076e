"""KV-budget admission (``gateway/admission/budget.py``) against real simulators on real sockets:
reservations up to the admitted limit, waiting and 429, routing by free budget, the adaptive
limit driven by the simulator's own ``/metrics``, and each lease renewed and released in the
store that granted it, whatever the circuit says by then."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import pytest

from gateway.admission.budget import Grant, KVAdmission, open_admission, priority_of
from gateway.admission.circuit import Circuit, redis_errors
from gateway.edge.servers import BackgroundServer
from gateway.errors import InvalidRequest, PermissionDenied, RateLimited, ServiceUnavailable
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from gateway.upstream.engine import Upstream
from gateway.upstream.pool import UpstreamPool
from ratelimit.aimd import Tuning
from ratelimit.fairness import Priority
from ratelimit.kvbudget import (
    Ask,
    Choice,
    KVBudgetStore,
    Lease,
    MemoryKVBudgetStore,
    Placement,
    Rules,
)
from tests.clock import FakeClock
from tests.gateway.admission.outage import Outage
from tests.waiting import eventually


def _pool() -> UpstreamPool:
    """The gateway's own client for the scrapes (``UpstreamPool.get``), as the app passes it."""
    return UpstreamPool(httpx.AsyncHTTPTransport(), Settings().upstream)


def admission(
    capacity: int | None, wait_s: float = 0.0, *, rules: Rules | None = None, queue_max: int = 64
) -> KVAdmission:
    local = MemoryKVBudgetStore()
    store: Circuit[KVBudgetStore] = Circuit("KV budget", local, local, fail="open", errors=())
    return KVAdmission(store, capacity, Tuning(), wait_s,
                       rules or Rules(), queue_max)  # fmt: skip


async def test_admits_up_to_the_limit_then_waits_then_refuses() -> None:
    kv = admission(capacity=1000, wait_s=0.3)  # admitted: 850 tokens, in 16-token blocks
    engine = Upstream("http://engine-a/v1")
    first, _ = await kv.admit([engine], "acme", "standard", 300)
    second, _ = await kv.admit([engine], "acme", "standard", 300)
    assert first.lease is not None and first.lease.tokens == 304  # whole blocks
    waiting = asyncio.create_task(kv.admit([engine], "acme", "standard", 300))
    await asyncio.sleep(0)  # let it find the budget full and start waiting
    assert not waiting.done()
    await kv.release(first)  # a release wakes the waiter at once
    third, _ = await asyncio.wait_for(waiting, 1)
    assert third.lease is not None
    with pytest.raises(RateLimited) as refused:
        await kv.admit([engine], "acme", "standard", 300)  # waits 0.3 s, then 429
    assert refused.value.code == "kv_budget_exhausted"
    assert refused.value.headers()["retry-after"] == "1"
    await kv.release(second)
    await kv.release(third)


async def test_sheddable_work_is_refused_under_pressure_at_once() -> None:
    kv = admission(capacity=1000, wait_s=5.0)
    engine = Upstream("http://engine-a/v1")
    await kv.admit([engine], "acme", "critical", 700)
    with pytest.raises(RateLimited):
        await asyncio.wait_for(kv.admit([engine], "acme", "sheddable", 100), 1)


async def test_routes_to_the_engine_with_the_most_free_budget() -> None:
    kv = admission(capacity=1000)
    busy, idle = Upstream("http://busy/v1"), Upstream("http://idle/v1")
    await kv.admit([busy], "acme", "standard", 600)
    grant, order = await kv.admit([busy, idle], "acme", "standard", 100)
    assert grant.upstream is idle and order == [idle, busy]


async def test_unknown_capacity_is_not_limited() -> None:
    kv = admission(capacity=None)
    grant, _ = await kv.admit([Upstream("http://engine/v1")], "acme", "standard", 10**9)
    assert grant.lease is None


def test_priority_header_may_lower_but_not_raise_the_keys_ceiling() -> None:
    assert priority_of(None) == "standard"
    assert priority_of(None, "critical") == "critical"
    assert priority_of(" Critical ", "critical") == "critical"
    assert priority_of("sheddable") == "sheddable"
    with pytest.raises(PermissionDenied):
        priority_of("critical")  # a standard key cannot claim critical
    with pytest.raises(PermissionDenied):
        priority_of("standard", "sheddable")
    with pytest.raises(InvalidRequest):
        priority_of("urgent", "critical")


async def test_a_request_that_can_never_fit_is_refused_at_once() -> None:
    kv = admission(capacity=1000, wait_s=5.0)
    with pytest.raises(InvalidRequest) as refused:
        await asyncio.wait_for(kv.admit([Upstream("http://e/v1")], "acme", "critical", 900), 1)
    assert refused.value.code == "kv_request_too_large" and refused.value.param == "max_tokens"


async def test_the_wait_queue_is_bounded() -> None:
    kv = admission(capacity=1000, wait_s=5.0, queue_max=1)
    engine = Upstream("http://e/v1")
    held, _ = await kv.admit([engine], "acme", "critical", 800)
    waiting = asyncio.create_task(kv.admit([engine], "acme", "critical", 800))
    await eventually(lambda: kv.waiting == 1, within_s=1)
    with pytest.raises(RateLimited) as refused:  # the queue is full: no wait at all
        await asyncio.wait_for(kv.admit([engine], "other", "standard", 16), 1)
    assert refused.value.code == "kv_budget_exhausted"
    await kv.release(held)
    second, _ = await asyncio.wait_for(waiting, 1)
    await kv.release(second)
    assert kv.waiting == 0 and not kv.queues


async def test_a_tenants_requests_are_admitted_in_order_critical_first() -> None:
    kv = admission(capacity=1000, wait_s=5.0)
    engine = Upstream("http://e/v1")
    held, _ = await kv.admit([engine], "acme", "critical", 800)
    order: list[str] = []

    async def ask(name: str, priority: Priority, tokens: int) -> None:
        grant, _ = await kv.admit([engine], "acme", priority, tokens)
        order.append(name)
        await kv.release(grant)

    standard = asyncio.create_task(ask("standard", "standard", 700))  # under the 90 % headroom
    await eventually(lambda: kv.waiting == 1, within_s=1)
    critical = asyncio.create_task(ask("critical", "critical", 800))
    await eventually(lambda: kv.waiting == 2, within_s=1)
    await kv.release(held)
    await asyncio.wait_for(asyncio.gather(standard, critical), 2)
    assert order == ["critical", "standard"]


async def test_a_tenant_over_its_share_yields_to_a_waiting_tenant() -> None:
    """acme holds 600 of 800 admitted; globex waits for 400. acme's next request, though it
    fits, waits: globex is admitted first when acme releases."""
    kv = admission(capacity=1000, wait_s=5.0, rules=Rules(pressure_threshold=1.0))
    engine = Upstream("http://e/v1")
    big, _ = await kv.admit([engine], "acme", "standard", 592)
    order: list[str] = []

    async def ask(tenant: str, tokens: int) -> None:
        grant, _ = await kv.admit([engine], tenant, "standard", tokens)
        order.append(tenant)
        await eventually(lambda: len(order) == 2, within_s=2)
        await kv.release(grant)

    globex = asyncio.create_task(ask("globex", 400))
    await eventually(lambda: "globex" in kv.queues, within_s=1)
    acme = asyncio.create_task(ask("acme", 96))  # fits (592 + 96 <= 850), but over its share
    await eventually(lambda: "acme" in kv.queues, within_s=1)
    assert not acme.done() and list(kv.leases.values()) == [big]  # acme asked and waits
    await kv.release(big)
    await asyncio.wait_for(asyncio.gather(globex, acme), 3)
    assert order == ["globex", "acme"]


@pytest.fixture
async def sim() -> AsyncIterator[tuple[BackgroundServer, str]]:
    app = create_sim_app(SimConfig(kv_capacity_tokens=4096, block_size=16, itl_ms=50))
    async with BackgroundServer(app) as server:
        yield server, f"{server.url}/v1"


async def test_the_simulators_metrics_drive_the_admitted_limit(
    sim: tuple[BackgroundServer, str],
) -> None:
    _server, base = sim
    kv = open_admission(Settings(), None)
    engine = Upstream(base)
    scraper = asyncio.create_task(kv.scrape_forever([engine], _pool().get))
    try:
        await eventually(lambda: kv.engine(engine).controller is not None, within_s=5)
        controller = kv.engine(engine).controller
        assert controller is not None
        assert controller.capacity == 4096  # discovered: (num_gpu_blocks − 1) × block_size
        healthy = controller.limit
        # Fill the simulator's KV cache directly (long prompts, slow streams): its usage
        # passes 0.85 and the gateway must admit less, as vLLM's own numbers say.
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            body = {"model": "deepseek-r1", "stream": True, "max_tokens": 400,
                    "messages": [{"role": "user", "content": "word " * 800}]}  # fmt: skip
            streams = [asyncio.create_task(_hold(client, body)) for _ in range(4)]
            try:
                await eventually(lambda: controller.limit < healthy, within_s=10)
            finally:
                for stream in streams:
                    stream.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
        assert not controller.healthy
    finally:
        scraper.cancel()
        await asyncio.gather(scraper, return_exceptions=True)


async def _hold(client: httpx.AsyncClient, body: dict[str, object]) -> None:
    async with client.stream("POST", "/chat/completions", json=body) as response:
        async for _ in response.aiter_raw():
            pass


class MetricsAnswer:
    """A model server whose /metrics always answers ``status`` (and counts the scrapes)."""

    def __init__(self, status: int) -> None:
        self.status, self.scrapes = status, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.scrapes += scope["path"] == "/metrics"
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize(("status", "adapts"), [(404, False), (500, True)])
async def test_an_engine_without_metrics_keeps_its_budget_a_failing_one_loses_it(
    status: int, adapts: bool
) -> None:
    """404: the engine exports no metrics there (Ray Serve LLM): no signal, the budget stays.
    500: a failed scrape is a bad signal: the budget shrinks (AIMD)."""
    app = MetricsAnswer(status)
    async with BackgroundServer(app) as server:
        kv = admission(capacity=1000)
        engine = Upstream(f"{server.url}/v1")
        controller = kv.engine(engine).controller
        assert controller is not None and controller.limit == 850
        scraper = asyncio.create_task(kv.scrape_forever([engine], _pool().get))
        try:
            await eventually(lambda: app.scrapes >= 2, within_s=10)
        finally:
            scraper.cancel()
            await asyncio.gather(scraper, return_exceptions=True)
    assert (controller.limit < 850) is adapts


async def test_a_standard_request_that_fits_only_into_the_critical_headroom_is_refused_at_once(
) -> None:  # fmt: skip
    """Larger than the standard share of an idle engine's budget, it could never be admitted at
    its priority (it would wait, then 429 "try again", forever): 400 with the largest size
    that fits. The same size is admitted as critical work, which may use the headroom."""
    kv = admission(capacity=1000, wait_s=5.0)
    target = kv.tuning.target_utilization
    standard_room = int(1000 * target * 0.9)
    size = standard_room + 32  # above the standard share, within the critical one
    assert size <= 1000 * target
    with pytest.raises(InvalidRequest) as refused:
        await asyncio.wait_for(kv.admit([Upstream("http://e/v1")], "acme", "standard", size), 1)
    assert refused.value.code == "kv_request_too_large" and refused.value.param == "max_tokens"
    assert f"at most {standard_room} fit" in refused.value.message
    assert "headroom kept for critical work" in refused.value.message
    granted = await asyncio.wait_for(kv.admit([Upstream("http://e/v1")], "acme", "critical",
                                              size), 1)  # fmt: skip
    assert granted is not None


# -- a lease goes back to the store that granted it -------------------------------------------


class FlakyStore(Outage):
    """An in-process store standing in for Redis, which can be away (``Outage``)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.inner = MemoryKVBudgetStore(clock)
        self.replies_lost = 0  # the next admissions that run, and whose reply times out
        self.settling = asyncio.Event()  # ``settled`` returns once it is set
        self.settling.set()

    async def admit(self, ask: Ask, ttl_s: float, rules: Rules) -> Placement:
        self._asked("admit")
        placement = await self.inner.admit(ask, ttl_s, rules)
        if self.replies_lost:
            self.replies_lost -= 1
            raise TimeoutError("the reply came too late")
        return placement

    async def renew(self, lease: Lease, ttl_s: float) -> bool:
        self._asked("renew")
        return await self.inner.renew(lease, ttl_s)

    async def release(self, lease: Lease) -> None:
        self._asked("release")
        await self.inner.release(lease)

    async def reserved(self, engine: str) -> int:
        return await self.inner.reserved(engine)

    async def by_tenant(self, engine: str) -> dict[str, int]:
        return await self.inner.by_tenant(engine)

    async def settled(self) -> None:
        await self.settling.wait()
        await self.inner.settled()


ENGINE = Upstream("http://engine/v1")


async def granted_on_both() -> tuple[KVAdmission, FlakyStore, FlakyStore, Grant, Grant]:
    """A budget whose shared store granted one lease and then failed, so the circuit (open,
    retried after 1 s of a clock that does not move) granted the next one in process; the
    shared store answers again, but the circuit does not know yet."""
    clock = FakeClock()
    shared, local = FlakyStore(clock), FlakyStore(clock)
    store: Circuit[KVBudgetStore] = Circuit("KV budget", shared, local, fail="open",
                                            errors=redis_errors(), clock=clock)  # fmt: skip
    kv = KVAdmission(store, 1000, Tuning(), 0.0)
    by_shared, _ = await kv.admit([ENGINE], "acme", "standard", 100)
    shared.down = True
    by_local, _ = await kv.admit([ENGINE], "acme", "standard", 200)
    shared.down = False
    assert kv.store.degraded
    assert await shared.reserved(ENGINE.base_url) == 112
    assert await local.reserved(ENGINE.base_url) == 208
    return kv, shared, local, by_shared, by_local


async def test_a_lease_is_released_to_the_store_that_granted_it() -> None:
    kv, shared, local, by_shared, by_local = await granted_on_both()
    await kv.release(by_shared)  # the circuit is open: it would have picked the local store
    assert await shared.reserved(ENGINE.base_url) == 0
    assert await local.reserved(ENGINE.base_url) == 208 and local.calls["release"] == 0
    assert not kv.store.degraded  # the shared store answered: the outage is over
    await kv.release(by_local)  # the circuit is closed: it would have picked the shared store
    assert await local.reserved(ENGINE.base_url) == 0
    assert (shared.calls["release"], local.calls["release"]) == (1, 1)
    assert not kv.leases


async def test_a_release_the_granting_store_cannot_take_is_lost_not_misplaced() -> None:
    kv, shared, local, by_shared, _ = await granted_on_both()
    shared.down = True
    await kv.release(by_shared)  # no error: the lease expires in the shared store
    assert by_shared.lease is not None and by_shared.lease.lease_id not in kv.leases
    assert await shared.reserved(ENGINE.base_url) == 112  # until it expires
    assert await local.reserved(ENGINE.base_url) == 208 and local.calls["release"] == 0


@pytest.mark.parametrize("fail", ["open", "closed"])
async def test_a_lease_booked_by_a_shared_store_whose_reply_timed_out_is_given_back(
    fail: Literal["open", "closed"],
) -> None:
    """The script ran in Redis but its reply came too late: the circuit fell back to the local
    store (open) or refused (closed), and what Redis booked is released there, not left until
    the lease's TTL."""
    clock = FakeClock()
    shared, local = FlakyStore(clock), FlakyStore(clock)
    store: Circuit[KVBudgetStore] = Circuit("KV budget", shared, local, fail=fail,
                                            errors=redis_errors(), clock=clock)  # fmt: skip
    kv = KVAdmission(store, 1000, Tuning(), 0.0)
    shared.replies_lost = 1
    if fail == "open":
        grant, _ = await kv.admit([ENGINE], "acme", "standard", 100)
        assert grant.store is local and await local.reserved(ENGINE.base_url) == 112
    else:
        with pytest.raises(ServiceUnavailable):
            await kv.admit([ENGINE], "acme", "standard", 100)
    assert shared.calls["admit"] == 1
    await eventually(lambda: shared.calls["release"] == 1, within_s=5)
    assert await shared.reserved(ENGINE.base_url) == 0
    if fail == "open":
        assert local.calls["release"] == 0  # the lease it granted is held
        await kv.release(grant)
        assert await local.reserved(ENGINE.base_url) == 0


async def test_a_late_release_of_an_earlier_attempt_leaves_a_waiting_requests_grant() -> None:
    """The shared store booked the first attempt but its reply timed out; the local store
    said wait; the request asked again, the circuit closed, and the shared store granted it.
    The first attempt's release, sent once that store settled (here: after the grant), takes
    back only what that attempt booked: each attempt asks under a lease id of its own."""
    clock = FakeClock()
    shared, local = FlakyStore(clock), FlakyStore(clock)
    store: Circuit[KVBudgetStore] = Circuit("KV budget", shared, local, fail="open",
                                            errors=redis_errors(), retry_s=0.0,
                                            clock=clock)  # fmt: skip
    kv = KVAdmission(store, 1000, Tuning(), wait_s=60.0)
    full = Ask("full", "globex", "critical", (Choice(ENGINE.base_url, 1000, 1000),))
    assert (await local.inner.admit(full, 60, Rules())).decision == "admit"  # no room here
    shared.replies_lost, shared.settling = 1, asyncio.Event()
    grant, _ = await asyncio.wait_for(kv.admit([ENGINE], "acme", "standard", 100), 10)
    assert grant.store is shared and shared.calls["admit"] == 2
    assert await shared.reserved(ENGINE.base_url) == 2 * 112  # the lost reply's, and the grant
    shared.settling.set()  # the first attempt's release goes out now
    await eventually(lambda: shared.calls["release"] == 1, within_s=5)
    assert await shared.reserved(ENGINE.base_url) == 112  # the grant's lease, still held
    assert grant.lease is not None and await shared.renew(grant.lease, 30)
    await kv.release(grant)
    assert await shared.reserved(ENGINE.base_url) == 0


async def test_a_lease_is_renewed_in_the_store_that_granted_it() -> None:
    kv, shared, local, by_shared, by_local = await granted_on_both()
    kv.lease_ttl_s = 0.03  # a renewal round every 10 ms
    renewing = asyncio.create_task(kv.renew_forever())
    try:
        # the in-process store does not know the shared store's lease: renewed there, it
        # would say so, and the lease would be renewed no more
        await eventually(lambda: shared.calls["renew"] >= 2 and local.calls["renew"] >= 2,
                         within_s=5)  # fmt: skip
        assert list(kv.leases.values()) == [by_shared, by_local]
        shared.down = True  # away: renewed again next round, not dropped
        await eventually(lambda: shared.calls["renew"] >= 4, within_s=5)
        assert list(kv.leases.values()) == [by_shared, by_local]
        shared.down, shared.inner = False, MemoryKVBudgetStore(FakeClock())  # restarted: empty
        await eventually(lambda: list(kv.leases.values()) == [by_local], within_s=5)
    finally:
        renewing.cancel()
        await asyncio.gather(renewing, return_exceptions=True)
