"""KV-budget admission: work is admitted against each engine's KV-cache capacity.

Rules:

- Each upstream engine has a capacity in tokens: ``KV_CAPACITY_TOKENS`` when set (fixed), else
  discovered from ``vllm:cache_config_info`` on its ``/metrics``. Until an engine's capacity is
  known, requests to it are not KV-limited (and nothing is reserved); such an engine is
  preferred, since it is unknown rather than full.
- A scraper reads every engine's ``/metrics`` once per ``SCRAPE_S`` (on the upstream pool's
  own client, ``UpstreamPool.get``: an ``httpx`` client's request cost the idle gateway
  more CPU than everything else it does each second) and feeds the engine's
  ``AdmissionController`` (``ratelimit.aimd``): the admitted limit shrinks when KV usage or the
  waiting queue passes its threshold, preemptions rise or metrics go stale, and grows back
  slowly while healthy. An engine whose ``/metrics`` answers 404 exports none there (Ray Serve
  LLM): its budget stays at ``capacity × target`` (``KV_CAPACITY_TOKENS`` must then be set),
  since no signal is not a bad signal; a scrape that fails otherwise counts as unhealthy.
- A request reserves ``prompt estimate + max_tokens`` rounded up to the engine's block size, as
  a lease in the shared store (``ratelimit.kvbudget``: Redis when configured, so all replicas
  share one budget), renewed by one task per process while the request runs, released when it
  ends however it ends; a crashed replica's leases expire after ``lease_ttl_s``
  (``KV_LEASE_TTL_S``).
- A lease is renewed and released in the store that granted it (``Grant.store``), whatever the
  circuit (``gateway.admission.circuit``) says by then: a lease Redis granted goes back to
  Redis even while the circuit is open, one granted in process during an outage goes back
  here after it. A renewal or release the granting Redis cannot take (it is away) is lost: the
  lease expires there; a lease the store no longer knows (Redis restarted) is renewed no more.
- An admission the shared store failed (the circuit then fell back or refused) may have booked
  its lease there all the same: a reply that timed out after the script ran. As for an admission
  whose caller was cancelled, the lease is released there once the client has had every reply
  it waits for (``settled``), outside the circuit's count (a clean-up says nothing of the
  store's health). Best effort: a Redis stalled past the client's timeout may still run the
  admission after that release, and the lease then expires after ``lease_ttl_s``. Each attempt
  of a waiting request asks under a lease id of its own, so a release meant for an earlier
  attempt never takes back a later one's grant.
- One store call per attempt routes and reserves together (``fairness.route``: the engine with
  the most free budget, fair share between tenants weighted by ``tenants.<name>.weight``,
  priority with headroom for ``critical``).
- A request asks the store at once (concurrent requests do so concurrently, sharing Redis
  round trips), unless requests of its tenant already wait in this process: then it queues
  behind them. Told to wait, it joins its tenant's queue, ordered by ``fairness.queue_order``;
  only the head of each tenant's queue asks again, when woken by a release or limit change in
  this process or at least every ``RECHECK_S`` (for other replicas' releases). So a tenant's
  waiting requests are admitted in order, and no tenant's head waits behind another's. At most
  ``ADMISSION_QUEUE_MAX`` requests wait per process; beyond that, and after
  ``ADMISSION_WAIT_MS``, 429 ``kv_budget_exhausted`` with ``retry-after``: the cluster is full
  *for now*, which a client should retry. ``sheddable`` work under pressure is refused at once.
  503 is kept for no engine at all (``no_healthy_upstream``).
- The choice is made before the first byte: the granted engine is tried first. If it fails
  before the first byte and the core retries on the next candidate, the lease stays where it
  was granted (a rare case; it is released when the request ends either way).
- A request that cannot fit even an empty engine at its priority (more than ``capacity ×
  target utilisation``, times the pressure threshold below ``critical``: the rest is headroom it
  may never use) can never run: 400 ``kv_request_too_large`` at once, naming ``max_tokens`` and
  the largest size that fits. (Admitting it when the engine is idle would let one standard
  request take the critical headroom; refusing it says what to change.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from gateway.admission.circuit import Circuit, redis_errors
from gateway.errors import InvalidRequest, PermissionDenied, RateLimited, ServiceUnavailable
from gateway.settings import AdmissionSettings
from gateway.telemetry.metrics import Metrics
from gateway.upstream.engine import Upstream
from ratelimit.aimd import AdmissionController, Tuning
from ratelimit.engine_metrics import EngineSnapshot, parse_engine_metrics
from ratelimit.fairness import PRESSURE_THRESHOLD, RANK, Priority, queue_order
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

if TYPE_CHECKING:  # redis-py only where a client is made (REDIS_URL)
    from ratelimit.autopipe import AutoPipeline

log = logging.getLogger("thinkgate")

# ``GET url`` whole within a timeout: (status, body), ``None`` without an answer.
Get = Callable[[httpx.URL, float], Awaitable[tuple[int, bytes] | None]]

SCRAPE_S = 1.0
SCRAPE_TIMEOUT_S = 2.0
LEASE_TTL_S = 30.0  # the default of KV_LEASE_TTL_S
RECHECK_S = 0.05
DEFAULT_BLOCK_SIZE = 16


@dataclass(slots=True)
class EngineState:
    controller: AdmissionController | None  # None until the capacity is known
    block_size: int = DEFAULT_BLOCK_SIZE
    snapshot: EngineSnapshot | None = None
    no_metrics_logged: bool = False


NO_METRICS = EngineSnapshot(None, None, None, None, None, None)  # a 404: none exported

Granted = tuple[Placement, KVBudgetStore]  # a store's answer, and the store that gave it


@dataclass(frozen=True, slots=True)
class Grant:
    upstream: Upstream | None
    lease: Lease | None = None
    store: KVBudgetStore | None = None  # the store that granted the lease: it takes it back

    def __post_init__(self) -> None:
        if (self.lease is None) != (self.store is None):
            raise ValueError("a lease comes with the store that granted it, and only a lease")


@dataclass(frozen=True, slots=True, eq=False)
class _Waiter:
    priority: Priority
    arrived: float


@dataclass(slots=True)
class KVAdmission:
    store: Circuit[KVBudgetStore]
    fixed_capacity: int | None
    tuning: Tuning
    wait_s: float
    rules: Rules = field(default_factory=Rules)
    queue_max: int = 1024
    lease_ttl_s: float = LEASE_TTL_S
    clock: Callable[[], float] = time.monotonic
    engines: dict[str, EngineState] = field(default_factory=dict)
    leases: dict[str, Grant] = field(default_factory=dict)  # held here, by lease id
    queues: dict[str, list[_Waiter]] = field(default_factory=dict)
    metrics: Metrics | None = None
    _arrivals: itertools.count[int] = field(default_factory=itertools.count)
    _background: set[asyncio.Task[None]] = field(default_factory=set)
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

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def at_once(self, candidates: Sequence[Upstream]) -> tuple[Grant, list[Upstream]] | None:
        """The grant when one of ``candidates`` has no known KV capacity (its budget is not
        kept: that engine, first, with no lease and no store asked); ``None``: ``admit`` asks."""
        for upstream in candidates:
            if self.engine(upstream).controller is None:
                return Grant(upstream), _first(upstream, candidates)
        return None

    async def admit(
        self,
        candidates: Sequence[Upstream],
        tenant: str,
        priority: Priority,
        tokens: int,
        preferred: int = 0,
    ) -> tuple[Grant, list[Upstream]]:
        """The grant and the candidates reordered (the granted engine first); the first
        ``preferred`` are tried first (the router's choice), the rest by free budget."""
        if (unmeasured := self.at_once(candidates)) is not None:
            return unmeasured
        ask = self._ask(candidates, tenant, priority, tokens, preferred)
        started = self.clock()
        try:
            placement, store = await self._queued(ask)
        finally:
            if self.metrics is not None:
                self.metrics.admission_wait.observe(self.clock() - started)
        assert placement.lease is not None
        upstream = next(u for u in candidates if u.base_url == placement.lease.engine)
        grant = self.leases[placement.lease.lease_id] = Grant(upstream, placement.lease, store)
        return grant, _first(upstream, candidates)

    def _ask(
        self,
        candidates: Sequence[Upstream],
        tenant: str,
        priority: Priority,
        tokens: int,
        preferred: int = 0,
    ) -> Ask:
        choices, fits, largest = [], False, 0
        # below critical, the last part of a budget is headroom it may never use (fairness)
        share = 1.0 if priority == "critical" else PRESSURE_THRESHOLD
        for upstream in candidates:
            state = self.engine(upstream)
            assert state.controller is not None
            need = round_to_blocks(max(tokens, 1), state.block_size)
            room = math.floor(state.controller.capacity * self.tuning.target_utilization * share)
            largest = max(largest, room)
            fits = fits or need <= room
            choices.append(Choice(upstream.base_url, state.controller.limit, need))
        if not fits:
            headroom = "" if share == 1.0 else (
                f" at priority {priority} (the rest of an idle engine's budget is headroom "
                "kept for critical work)"
            )  # fmt: skip
            raise InvalidRequest(
                f"This request may need {tokens} tokens of KV cache; at most {largest} fit "
                f"any model server at once{headroom}. Lower max_tokens or the prompt.",
                param="max_tokens", code="kv_request_too_large",
            )  # fmt: skip
        return Ask(secrets.token_hex(8), tenant, priority, tuple(choices), preferred)

    async def _queued(self, ask: Ask) -> Granted:
        """Ask at once unless this tenant already has requests waiting here (they go first);
        told to wait, join the tenant's queue."""
        if ask.tenant not in self.queues:
            placement, store = await self._attempt(ask)
            if placement.decision == "admit":
                return placement, store
            if placement.decision == "reject":
                raise _shed()
        return await self._wait_in_line(ask)

    async def _wait_in_line(self, ask: Ask) -> Granted:
        if self.waiting >= self.queue_max:
            raise _exhausted()
        deadline = self.clock() + self.wait_s
        queue = self.queues.setdefault(ask.tenant, [])
        waiter = _Waiter(ask.priority, next(self._arrivals))
        queue.append(waiter)
        try:
            while self.clock() < deadline:
                await self._wait(min(RECHECK_S, deadline - self.clock()))
                if queue_order(queue)[0] is not waiter:
                    continue
                # an id of its own: an earlier attempt's may still be forgotten (``_attempt``)
                ask = dataclasses.replace(ask, lease_id=secrets.token_hex(8))
                placement, store = await self._attempt(ask)
                if placement.decision == "admit":
                    return placement, store
                if placement.decision == "reject":
                    raise _shed()
            raise _exhausted()
        finally:
            queue.remove(waiter)
            if not queue:
                del self.queues[ask.tenant]
            # the next in line may ask now; not awaited here, where a cancellation would lose
            # the placement just made
            self._spawn(self._notify())

    async def _attempt(self, ask: Ask) -> Granted:
        """One store call; the placement and the store that made it (the circuit picks it).
        Awaited here, not in a task of its own: the script then rides in the same Redis round
        trip as the rate limiter's (``ratelimit.autopipe``)."""
        asked: list[KVBudgetStore] = []  # the stores it went to (the circuit may fall back)

        async def place(store: KVBudgetStore) -> Granted:
            asked.append(store)
            return await store.admit(ask, self.lease_ttl_s, self.rules), store

        try:
            granted = await self.store.call(place)
        except (Exception, asyncio.CancelledError):
            # Cancelled, or refused once the shared store failed (a closed circuit): a script
            # sent may still run. Once it has (``settled``), whatever it reserved is given
            # back. (Released at once instead, the release could reach Redis before the
            # admission, on another pooled connection, and leave the lease booked until it
            # expired.)
            if asked:
                self._spawn(self._forget(ask, asked))
            raise
        if len(asked) > 1:
            # The shared store failed and the local one answered. A shared store whose reply
            # timed out may have run the script all the same: what it booked is given back
            # there, or it would stay reserved until the lease's TTL.
            self._spawn(self._forget(ask, asked[:-1]))
        return granted

    async def _forget(self, ask: Ask, stores: Sequence[KVBudgetStore]) -> None:
        """Release ``ask``'s lease in each of ``stores`` (on every engine it could have got),
        straight to the store: a store that fails here neither opens nor prolongs an outage
        (the lease then expires there)."""
        for store in stores:
            with contextlib.suppress(Exception):
                await store.settled()
            for choice in ask.choices:
                lease = Lease(choice.engine, ask.lease_id, choice.tokens, ask.tenant,
                              ask.priority)  # fmt: skip
                with contextlib.suppress(Exception):
                    await store.release(lease)
        await self._notify()

    def abandon(self, admitting: asyncio.Future[tuple[Grant, list[Upstream]]]) -> None:
        """An ``admit`` whose caller went away: cancelled, and its grant given back should it
        have been made after all (however many times the caller is cancelled meanwhile)."""
        admitting.cancel()

        async def give_back() -> None:
            with contextlib.suppress(BaseException):
                grant, _ = await admitting
                await self.release(grant)

        self._spawn(give_back())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _wait(self, seconds: float) -> None:
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(seconds, 0.001))

    async def release(self, grant: Grant) -> None:
        """Give the lease back to the store that granted it (see the module docstring)."""
        if grant.lease is None or grant.store is None:
            return
        lease = grant.lease
        self.leases.pop(lease.lease_id, None)
        with contextlib.suppress(ServiceUnavailable):  # Redis is away: the lease expires there
            await self.store.call_on(grant.store, functools.partial(_release, lease=lease))
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- the background work: scraping and lease renewal -----------------------------------

    async def scrape_forever(self, upstreams: Sequence[Upstream], get: Get) -> None:
        """Every engine's ``/metrics`` each ``SCRAPE_S``, fetched with ``get``
        (``UpstreamPool.get``)."""
        while True:
            await asyncio.gather(*(self._scrape(get, u) for u in upstreams))
            await self._notify()
            await asyncio.sleep(SCRAPE_S)

    async def _scrape(self, get: Get, upstream: Upstream) -> None:
        now = self.clock()
        snapshot = await _read_metrics(get, upstream)
        state = self.engine(upstream)
        if snapshot is NO_METRICS:  # nothing to adapt to: keep the budget, say so once
            if not state.no_metrics_logged:
                log.warning("%s has no /metrics: its KV budget stays fixed (no AIMD)",
                            upstream.base_url)  # fmt: skip
                state.no_metrics_logged = True
            return
        if snapshot is not None and snapshot.kv_capacity_tokens and state.controller is None:
            state.controller = AdmissionController(snapshot.kv_capacity_tokens, self.tuning)
        if snapshot is not None and snapshot.block_size:
            state.block_size = snapshot.block_size
        state.snapshot = snapshot or state.snapshot
        if state.controller is not None:
            state.controller.observe(snapshot, now)
            state.controller.tick(now)
        if self.metrics is not None:
            await self._export(upstream, state, snapshot)

    async def _export(
        self, upstream: Upstream, state: EngineState, snapshot: EngineSnapshot | None
    ) -> None:
        """The engine's figures as the gateway's gauges (once per scrape, not per request)."""
        assert self.metrics is not None
        m, url = self.metrics, upstream.base_url
        m.upstream_healthy.labels(url).set(1 if upstream.health.serving else 0)
        if snapshot is not None and snapshot.kv_usage is not None:
            m.upstream_kv_usage.labels(url).set(snapshot.kv_usage)
        if snapshot is not None and snapshot.requests_waiting is not None:
            m.upstream_waiting.labels(url).set(snapshot.requests_waiting)
        if state.controller is not None:
            with contextlib.suppress(ServiceUnavailable):
                reserved = await self.store.call(functools.partial(_reserved, engine=url))
                m.kv_budget.labels(url, "reserved").set(reserved)
            m.kv_budget.labels(url, "capacity").set(state.controller.capacity)
            m.kv_budget.labels(url, "admitted_limit").set(state.controller.limit)

    async def renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            for grant in list(self.leases.values()):
                await self._renew_grant(grant)

    async def _renew_grant(self, grant: Grant) -> None:
        """Renew in the store that granted it; a lease it no longer knows is renewed no more,
        one it cannot be asked about now (Redis away) is tried again next time."""
        assert grant.lease is not None and grant.store is not None
        renew = functools.partial(_renew, lease=grant.lease, ttl_s=self.lease_ttl_s)
        with contextlib.suppress(ServiceUnavailable):
            if not await self.store.call_on(grant.store, renew):
                self.leases.pop(grant.lease.lease_id, None)


async def _renew(store: KVBudgetStore, *, lease: Lease, ttl_s: float) -> bool:
    return await store.renew(lease, ttl_s)


async def _reserved(store: KVBudgetStore, *, engine: str) -> int:
    return await store.reserved(engine)


async def _release(store: KVBudgetStore, *, lease: Lease) -> None:
    await store.release(lease)


def _first(upstream: Upstream, candidates: Sequence[Upstream]) -> list[Upstream]:
    return [upstream, *(u for u in candidates if u is not upstream)]


def _exhausted() -> RateLimited:
    return RateLimited("The model servers' KV cache is fully booked; please try again shortly.",
                       retry_after=1.0, code="kv_budget_exhausted")  # fmt: skip


def _shed() -> RateLimited:
    return RateLimited("The model servers are under pressure: sheddable work is refused.",
                       retry_after=1.0, code="kv_budget_exhausted")  # fmt: skip


async def _read_metrics(get: Get, upstream: Upstream) -> EngineSnapshot | None:
    """The engine's snapshot; ``None`` for a failed scrape (unhealthy); ``NO_METRICS`` when
    the engine answers 404: it exports none there (e.g. Ray Serve LLM, whose metrics go to Ray's
    metrics agent), which is no signal rather than a bad one."""
    answer = await get(upstream.root_url("/metrics"), SCRAPE_TIMEOUT_S)
    if answer is None or answer[0] not in (200, 404):
        return None
    if answer[0] == 404:
        return NO_METRICS
    try:
        return parse_engine_metrics(answer[1].decode("utf-8", "replace"))
    except ValueError:
        return None


def open_admission(settings: AdmissionSettings, redis: AutoPipeline | None) -> KVAdmission:
    """The shared store is Redis when there is one (one budget for all replicas, on the
    process's one client, ``gateway.admission.redisconn``), otherwise this process's memory."""
    local = MemoryKVBudgetStore()
    store: Circuit[KVBudgetStore] = Circuit("KV budget", local, local, fail="open", errors=())
    if redis is not None:
        store = Circuit("KV budget", RedisKVBudgetStore(redis), local,
                        fail=settings.ratelimit_fail, errors=redis_errors())  # fmt: skip
    tuning = Tuning(target_utilization=settings.kv_target_utilization)
    weights = {name: p.weight for name, p in settings.tenants.items() if p.weight != 1}
    rules = Rules(weights=weights, waiting_ttl_s=5 * RECHECK_S)
    return KVAdmission(store, settings.kv_capacity_tokens, tuning,
                       settings.admission_wait_ms / 1000, rules,
                       settings.admission_queue_max, settings.kv_lease_ttl_s)  # fmt: skip


def priority_of(header: str | None, ceiling: Priority = "standard") -> Priority:
    """``x-thinkgate-priority``: ``critical``, ``standard`` or ``sheddable``; without the
    header, the key's ``ceiling`` (its policy, default ``standard``). A key may lower its
    priority but not raise it above its ceiling: priority is granted, not claimed."""
    if header is None:
        return ceiling
    value = header.strip().lower()
    if value not in RANK:
        raise InvalidRequest("x-thinkgate-priority must be critical, standard or sheddable.",
                             param="x-thinkgate-priority")  # fmt: skip
    if RANK[value] < RANK[ceiling]:  # type: ignore[index]
        raise PermissionDenied(f"This key may ask for priority `{ceiling}` at most.",
                               code="priority_not_allowed")  # fmt: skip
    return value  # type: ignore[return-value]
