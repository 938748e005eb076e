"""KV-budget admission: work is admitted against each engine's KV-cache capacity.

Rules:

- Each upstream engine has a capacity in tokens: ``KV_CAPACITY_TOKENS`` when set (fixed), else
  discovered from ``vllm:cache_config_info`` on its ``/metrics``. Until an engine's capacity is
  known, requests to it are not KV-limited (and nothing is reserved).
- A scraper reads every engine's ``/metrics`` once per ``SCRAPE_S`` and feeds the engine's
  ``AdmissionController`` (``ratelimit.aimd``): the admitted limit shrinks when KV usage or the
  waiting queue passes its threshold, preemptions rise or metrics go stale, and grows back
  slowly while healthy.
- A request reserves ``prompt estimate + max_tokens`` rounded up to the engine's block size, as
  a lease in the shared store (``ratelimit.kvbudget``: Redis when configured, so all replicas
  share one budget), renewed by one task per process while the request runs, released when it
  ends however it ends; a crashed replica's leases expire after ``LEASE_TTL_S``.
- Routing: candidates are tried in order of free budget (limit − reserved), most first; the
  fair-share and priority rules (``ratelimit.fairness``) decide admit / wait / reject.
- When no engine admits: wait up to ``ADMISSION_WAIT_MS`` (woken by any release or limit
  change in this process, re-checked at least every 50 ms for other replicas' releases), then
  429 ``kv_budget_exhausted`` with ``retry-after`` — the cluster is full *for now*, which a
  client should retry; 503 is kept for no engine at all. ``sheddable`` work under pressure is
  refused at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx

from gateway.circuit import Circuit
from gateway.errors import InvalidRequest, RateLimited, ServiceUnavailable
from gateway.settings import Settings
from gateway.upstream import Upstream
from ratelimit.aimd import AdmissionController, Tuning
from ratelimit.engine_metrics import EngineSnapshot, parse_engine_metrics
from ratelimit.fairness import Priority, Request, decide
from ratelimit.kvbudget import KVBudgetStore, Lease, round_to_blocks

log = logging.getLogger("thinkgate")

SCRAPE_S = 1.0
LEASE_TTL_S = 30.0
RECHECK_S = 0.05
DEFAULT_BLOCK_SIZE = 16


@dataclass(slots=True)
class EngineState:
    controller: AdmissionController | None  # None until the capacity is known
    block_size: int = DEFAULT_BLOCK_SIZE
    snapshot: EngineSnapshot | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    upstream: Upstream | None
    lease: Lease | None = None


@dataclass(slots=True)
class KVAdmission:
    store: Circuit[KVBudgetStore]
    transport: httpx.AsyncBaseTransport
    fixed_capacity: int | None
    tuning: Tuning
    wait_s: float
    clock: Callable[[], float] = time.monotonic
    close_store: Callable[[], Awaitable[None]] | None = None
    engines: dict[str, EngineState] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def engine(self, upstream: Upstream) -> EngineState:
        state = self.engines.get(upstream.base_url)
        if state is None:
            controller = None
            if self.fixed_capacity:
                controller = AdmissionController(self.fixed_capacity, self.tuning,
                                                 capacity_fixed=True)  # fmt: skip
            state = self.engines[upstream.base_url] = EngineState(controller)
        return state

    async def admit(
        self, candidates: Sequence[Upstream], tenant: str, priority: Priority, tokens: int
    ) -> tuple[Grant, list[Upstream]]:
        """The grant and the candidates reordered (the granted engine first)."""
        deadline = self.clock() + self.wait_s
        while True:
            ordered = await self._by_free_budget(candidates)
            for upstream in ordered:
                grant = await self._try(upstream, tenant, priority, tokens)
                if grant is not None:
                    rest = [u for u in ordered if u is not upstream]
                    return grant, [upstream, *rest]
            if priority == "sheddable" or self.clock() >= deadline:
                raise RateLimited(
                    "The model servers' KV cache is fully booked; please try again shortly.",
                    retry_after=1.0,
                    code="kv_budget_exhausted",
                )
            await self._wait(min(RECHECK_S, deadline - self.clock()))

    async def _try(
        self, upstream: Upstream, tenant: str, priority: Priority, tokens: int
    ) -> Grant | None:
        state = self.engine(upstream)
        if state.controller is None:
            return Grant(upstream)  # capacity unknown: not KV-limited
        need = round_to_blocks(tokens, state.block_size)
        limit = state.controller.limit
        engine = upstream.base_url
        by_tenant = await self.store.call(lambda s: s.by_tenant(engine))
        verdict = decide(Request(tenant, need, priority), limit=limit,
                         reserved=sum(by_tenant.values()), by_tenant=by_tenant)  # fmt: skip
        if verdict == "reject":
            raise RateLimited("The model servers are under pressure: sheddable work is refused.",
                              retry_after=1.0, code="kv_budget_exhausted")  # fmt: skip
        if verdict != "admit":
            return None
        lease = Lease(upstream.base_url, secrets.token_hex(8), need, tenant, priority)
        admitted, _ = await self.store.call(lambda s: s.try_reserve(lease, limit, LEASE_TTL_S))
        if not admitted:
            return None
        self.leases[lease.lease_id] = lease
        return Grant(upstream, lease)

    async def _by_free_budget(self, candidates: Sequence[Upstream]) -> list[Upstream]:
        async def free(upstream: Upstream) -> float:
            state = self.engine(upstream)
            if state.controller is None:
                return float("inf")
            engine = upstream.base_url
            return state.controller.limit - await self.store.call(lambda s: s.reserved(engine))

        budgets = [await free(u) for u in candidates]
        order = sorted(range(len(candidates)), key=lambda i: (-budgets[i], candidates[i].in_flight))
        return [candidates[i] for i in order]

    async def _wait(self, seconds: float) -> None:
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(seconds, 0.001))

    async def aclose(self) -> None:
        if self.close_store is not None:
            await self.close_store()

    async def release(self, grant: Grant) -> None:
        if grant.lease is None:
            return
        lease = grant.lease
        self.leases.pop(lease.lease_id, None)
        with contextlib.suppress(ServiceUnavailable):  # closed and away: the lease expires
            await self.store.call(lambda s: s.release(lease))
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- the background work: scraping and lease renewal -----------------------------------

    async def scrape_forever(self, upstreams: Sequence[Upstream]) -> None:
        async with httpx.AsyncClient(transport=self.transport, timeout=2.0) as client:
            while True:
                await asyncio.gather(*(self._scrape(client, u) for u in upstreams))
                await self._notify()
                await asyncio.sleep(SCRAPE_S)

    async def _scrape(self, client: httpx.AsyncClient, upstream: Upstream) -> None:
        now = self.clock()
        snapshot = await _read_metrics(client, upstream)
        state = self.engine(upstream)
        if snapshot is not None and snapshot.kv_capacity_tokens and state.controller is None:
            state.controller = AdmissionController(snapshot.kv_capacity_tokens, self.tuning)
        if snapshot is not None and snapshot.block_size:
            state.block_size = snapshot.block_size
        state.snapshot = snapshot or state.snapshot
        if state.controller is not None:
            state.controller.observe(snapshot, now)
            state.controller.tick(now)

    async def renew_forever(self) -> None:
        while True:
            await asyncio.sleep(LEASE_TTL_S / 3)
            for lease in list(self.leases.values()):
                with contextlib.suppress(ServiceUnavailable):
                    if not await self.store.call(functools.partial(_renew, lease=lease)):
                        self.leases.pop(lease.lease_id, None)


async def _renew(store: KVBudgetStore, *, lease: Lease) -> bool:
    return await store.renew(lease, LEASE_TTL_S)


async def _read_metrics(client: httpx.AsyncClient, upstream: Upstream) -> EngineSnapshot | None:
    url = upstream.base_url.removesuffix("/v1") + "/metrics"
    try:
        response = await client.get(url)
        if response.status_code != 200:
            return None
        return parse_engine_metrics(response.text)
    except (httpx.HTTPError, ValueError):
        return None


def open_admission(settings: Settings, transport: httpx.AsyncBaseTransport) -> KVAdmission:
    """The shared store is Redis when ``REDIS_URL`` is set (one budget for all replicas),
    otherwise this process's memory."""
    from ratelimit.kvbudget import MemoryKVBudgetStore

    local = MemoryKVBudgetStore()
    store: Circuit[KVBudgetStore] = Circuit("KV budget", local, local, fail="open", errors=())
    close: Callable[[], Awaitable[None]] | None = None
    if settings.redis_url:
        from redis.exceptions import RedisError

        from gateway.limiting import redis_client
        from ratelimit.kvbudget import RedisKVBudgetStore

        client = redis_client(settings.redis_url)
        errors = (RedisError, OSError, TimeoutError)
        shared = RedisKVBudgetStore(client)
        store = Circuit("KV budget", shared, local, fail=settings.ratelimit_fail, errors=errors)
        close = client.aclose
    tuning = Tuning(target_utilization=settings.kv_target_utilization)
    return KVAdmission(store, transport, settings.kv_capacity_tokens, tuning,
                       settings.admission_wait_ms / 1000, close_store=close)  # fmt: skip


def priority_of(header: str | None) -> Priority:
    """``x-thinkgate-priority``: ``critical``, ``standard`` (default) or ``sheddable``."""
    if header is None:
        return "standard"
    value = header.strip().lower()
    if value in ("critical", "standard", "sheddable"):
        return value  # type: ignore[return-value]
    raise InvalidRequest("x-thinkgate-priority must be critical, standard or sheddable.",
                         param="x-thinkgate-priority")  # fmt: skip
