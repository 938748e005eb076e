"""Shared KV-cache reservations per upstream engine, held as leases.

A reasoning model keeps every token of a request in the engine's KV cache until the request
ends, so the gateway admits a request only if its worst case fits the engine's admitted limit
(``ratelimit.aimd``). Rules:

- A request reserves ``prompt estimate + max_tokens`` tokens, rounded up to the engine's block
  size (``round_to_blocks``): vLLM allocates the cache in whole blocks (PagedAttention).
- ``admit`` is atomic and one call (one Redis round trip) whatever the number of candidate
  engines: it purges expired leases and waiters, then applies ``fairness.route`` to the
  candidates (admitted limit, the request's blocks, what each tenant holds, who waits) and
  reserves on the chosen engine. A request told to ``wait`` registers its tenant as waiting on
  every candidate for ``Rules.waiting_ttl_s`` (the caller asks again within that time while it
  waits), so other replicas' requests see it and yield their share. A tenant stays listed up to
  that long after its last waiter left: the others yield a fraction of a second too long, never
  too short. A request larger than every limit waits; refusing it is the caller's decision.
- A reservation is a lease with an expiry, so the reservations of a crashed replica come back
  by themselves; the holder ``renew``s while the request runs and ``release``s it when the
  request ends, however it ends. A lease is expired once ``now >= expiry``.
- ``renew`` of an expired lease returns ``False`` and the lease is gone: the request now runs
  unreserved, and the caller decides what that means.
- ``release`` is idempotent. Releasing a lease whose ``admit`` was cancelled mid-flight is safe
  and is how such a reservation comes back before its expiry.
- ``admit`` with a lease id that is already live on a candidate renews it and admits there
  without counting it twice: a retried call after a lost reply cannot double-book.

Backends: ``MemoryKVBudgetStore`` (one process, injectable clock) and ``RedisKVBudgetStore``
(shared by every gateway replica; one Lua script per operation, Redis ``TIME`` as the clock).
Redis errors propagate unchanged (``redis.exceptions.RedisError``, ``OSError``); the gateway
translates them at its one Redis boundary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ratelimit.fairness import (
    PRESSURE_THRESHOLD,
    Decision,
    EngineBook,
    Priority,
    route,
    weight_of,
)
from ratelimit.luascript import LuaScript, ScriptClient


def round_to_blocks(tokens: int, block_size: int) -> int:
    """``tokens`` rounded up to a whole number of ``block_size``-token blocks."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, not {block_size}")
    if tokens < 0:
        raise ValueError(f"tokens must not be negative, not {tokens}")
    return -(-tokens // block_size) * block_size


@dataclass(frozen=True, slots=True)
class Lease:
    engine: str
    lease_id: str
    tokens: int
    tenant: str
    priority: Priority = "standard"

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"a lease holds at least one token, not {self.tokens}")
        if not self.engine or not self.lease_id:
            raise ValueError("a lease needs an engine and a lease id")


@dataclass(frozen=True, slots=True)
class Choice:
    """A candidate engine for one request: its admitted limit now (``ratelimit.aimd``) and the
    request's reservation on it (rounded to that engine's block size)."""

    engine: str
    limit: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Ask:
    """One admission: a lease id chosen by the caller (a retried call with the same id cannot
    double-book), who asks, how urgently, and the candidate engines in tie-break order.
    ``preferred``: how many of the first choices are tried first, in their order, before the
    rest by free budget (the router's choice: the engine holding the prompt's prefix)."""

    lease_id: str
    tenant: str
    priority: Priority
    choices: tuple[Choice, ...]
    preferred: int = 0

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError("an admission needs at least one candidate engine")
        if len({c.engine for c in self.choices}) != len(self.choices):
            raise ValueError("candidate engines must be distinct")


@dataclass(frozen=True, slots=True)
class Rules:
    """The fairness inputs (``ratelimit.fairness``) and how long a waiter counts as waiting."""

    weights: Mapping[str, int] = field(default_factory=dict)
    pressure_threshold: float = PRESSURE_THRESHOLD
    waiting_ttl_s: float = 0.25

    def __post_init__(self) -> None:
        # Checked here, once, for both stores: the in-process one would only notice a bad weight
        # when fairness needs it, and the Lua script not at all for a bad threshold.
        for tenant in self.weights:
            weight_of(self.weights, tenant)
        if not 0 < self.pressure_threshold <= 1:
            raise ValueError(f"pressure_threshold must be in (0, 1], not {self.pressure_threshold}")
        _check_ttl(self.waiting_ttl_s)


@dataclass(frozen=True, slots=True)
class Placement:
    decision: Decision
    lease: Lease | None = None  # the reservation, when admitted


class KVBudgetStore(Protocol):
    async def admit(self, ask: Ask, ttl_s: float, rules: Rules) -> Placement:
        """Atomically purge expired leases and waiters, then route and reserve by
        ``fairness.route``; a request told to wait is registered as waiting on every candidate
        for ``rules.waiting_ttl_s``."""
        ...

    async def renew(self, lease: Lease, ttl_s: float) -> bool:
        """Extend a live lease to now + ttl_s; ``False`` if it had expired (it is then gone)."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give the lease's tokens back; idempotent."""
        ...

    async def settled(self) -> None:
        """Until every call sent so far has run (a cancelled caller's admission included)."""
        ...

    async def reserved(self, engine: str) -> int:
        """Tokens held by live leases on ``engine``."""
        ...

    async def by_tenant(self, engine: str) -> dict[str, int]:
        """Tokens held by live leases on ``engine``, per tenant (tenants holding none omitted)."""
        ...


def _check_ttl(ttl_s: float) -> None:
    if not ttl_s > 0:
        raise ValueError(f"a lease's ttl must be positive, not {ttl_s}")


# --- in-process ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Book:
    """One engine's leases, with running totals so a reservation costs O(1) between expiries."""

    leases: dict[str, tuple[float, Lease]] = field(default_factory=dict)
    tenants: dict[str, int] = field(default_factory=dict)
    total: int = 0
    earliest: float = math.inf  # no lease expires before this (a lower bound)

    def purge(self, now: float) -> None:
        if now < self.earliest:
            return
        for lease_id in [i for i, (expiry, _) in self.leases.items() if expiry <= now]:
            self.drop(lease_id)
        self.earliest = min((expiry for expiry, _ in self.leases.values()), default=math.inf)

    def add(self, lease: Lease, expiry: float) -> None:
        self.leases[lease.lease_id] = (expiry, lease)
        self.tenants[lease.tenant] = self.tenants.get(lease.tenant, 0) + lease.tokens
        self.total += lease.tokens
        self.earliest = min(self.earliest, expiry)

    def extend(self, lease_id: str, expiry: float) -> bool:
        held = self.leases.get(lease_id)
        if held is None:
            return False
        self.leases[lease_id] = (expiry, held[1])
        self.earliest = min(self.earliest, expiry)  # a renewal may also shorten a lease
        return True

    def drop(self, lease_id: str) -> None:
        held = self.leases.pop(lease_id, None)
        if held is None:
            return
        lease = held[1]
        self.total -= lease.tokens
        left = self.tenants[lease.tenant] - lease.tokens
        if left:
            self.tenants[lease.tenant] = left
        else:
            del self.tenants[lease.tenant]


class MemoryKVBudgetStore:
    """The budget of one process. Each method runs without awaiting, so it is atomic under
    asyncio."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._books: dict[str, _Book] = {}
        self._waiting: dict[str, dict[str, float]] = {}  # engine -> tenant -> until

    def _book(self, engine: str) -> _Book:
        book = self._books.setdefault(engine, _Book())
        book.purge(self._clock())
        return book

    def _waiters(self, engine: str) -> dict[str, float]:
        now = self._clock()
        live = {t: until for t, until in self._waiting.get(engine, {}).items() if until > now}
        self._waiting[engine] = live
        return live

    async def admit(self, ask: Ask, ttl_s: float, rules: Rules) -> Placement:
        _check_ttl(ttl_s)
        expiry = self._clock() + ttl_s
        books = [self._book(c.engine) for c in ask.choices]
        for book in books:
            if book.extend(ask.lease_id, expiry):  # a retried call: already admitted here
                return Placement("admit", book.leases[ask.lease_id][1])
        waiting = [self._waiters(c.engine) for c in ask.choices]
        views = [EngineBook(c.limit, c.tokens, b.tenants, w)
                 for c, b, w in zip(ask.choices, books, waiting, strict=True)]  # fmt: skip
        decision, index = route(ask.tenant, ask.priority, views, weights=rules.weights,
                                pressure_threshold=rules.pressure_threshold,
                                preferred=ask.preferred)  # fmt: skip
        if index is not None:
            choice = ask.choices[index]
            lease = Lease(choice.engine, ask.lease_id, choice.tokens, ask.tenant, ask.priority)
            books[index].add(lease, expiry)
            return Placement("admit", lease)
        if decision == "wait":
            for waiters in waiting:
                waiters[ask.tenant] = self._clock() + rules.waiting_ttl_s
        return Placement(decision)

    async def renew(self, lease: Lease, ttl_s: float) -> bool:
        _check_ttl(ttl_s)
        return self._book(lease.engine).extend(lease.lease_id, self._clock() + ttl_s)

    async def release(self, lease: Lease) -> None:
        self._book(lease.engine).drop(lease.lease_id)

    async def settled(self) -> None:
        return None  # in process: a call has run once it returned

    async def reserved(self, engine: str) -> int:
        return self._book(engine).total

    async def by_tenant(self, engine: str) -> dict[str, int]:
        return dict(self._book(engine).tenants)


# --- Redis --------------------------------------------------------------------------------------


_DECISIONS: Mapping[int, Decision] = {1: "admit", 0: "wait", -1: "reject"}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisKVBudgetStore:
    """The budget shared by every gateway replica through one Redis.

    Every engine's keys carry the one hash tag ``{pool}``, so they share one Redis Cluster slot
    and one script can route a request across all its candidates (a KV budget is a few keys
    per engine: one slot holds it easily). ``prefix`` (no braces) separates deployments or
    tests. Works with ``decode_responses`` on or off.
    """

    _admit = LuaScript(files=("kvbudget_prelude.lua", "kvbudget_admit.lua"))
    _renew = LuaScript(files=("kvbudget_prelude.lua", "kvbudget_renew.lua"))
    _release = LuaScript(files=("kvbudget_prelude.lua", "kvbudget_release.lua"))
    _reserved = LuaScript(files=("kvbudget_prelude.lua", "kvbudget_reserved.lua"))
    _by_tenant = LuaScript(files=("kvbudget_prelude.lua", "kvbudget_by_tenant.lua"))

    def __init__(self, client: ScriptClient, *, prefix: str = "thinkgate:kv:") -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix must not contain braces (they mark the hash tag)")
        self._client = client
        self._prefix = prefix
        self._keys: dict[str, tuple[str, ...]] = {}

    async def settled(self) -> None:
        """Until every script sent so far has run (an auto-pipelined client's ``drained``):
        a release sent after it cannot overtake an admission still in flight."""
        drained = getattr(self._client, "drained", None)
        if drained is not None:
            await drained()

    def keys(self, engine: str) -> tuple[str, ...]:
        """The engine's keys: lease expiries, leases, per-tenant totals, total, waiters (made
        once per engine: they are asked for on every admission and release)."""
        found = self._keys.get(engine)
        if found is None:
            base = f"{self._prefix}{{pool}}:{engine}"
            found = self._keys[engine] = tuple(f"{base}:{name}" for name in _KEY_NAMES)
        return found

    async def admit(self, ask: Ask, ttl_s: float, rules: Rules) -> Placement:
        _check_ttl(ttl_s)
        _check_ttl(rules.waiting_ttl_s)
        keys = [key for choice in ask.choices for key in self.keys(choice.engine)]
        weights = [
            x for t, w in sorted(rules.weights.items()) for x in (t, weight_of(rules.weights, t))
        ]
        per_choice = [x for c in ask.choices for x in (c.limit, c.tokens)]
        reply = await self._admit(
            self._client, keys, ask.lease_id, ask.tenant, ask.priority, _ms(ttl_s),
            _ms(rules.waiting_ttl_s), repr(float(rules.pressure_threshold)),
            len(rules.weights), *weights, *per_choice, ask.preferred,
        )  # fmt: skip
        code, index = _pair(reply)
        if code != 1:
            return Placement(_DECISIONS[code])
        choice = ask.choices[index - 1]
        return Placement("admit", Lease(choice.engine, ask.lease_id, choice.tokens, ask.tenant,
                                        ask.priority))  # fmt: skip

    async def renew(self, lease: Lease, ttl_s: float) -> bool:
        _check_ttl(ttl_s)
        reply = await self._renew(self._client, self.keys(lease.engine), lease.lease_id, _ms(ttl_s))
        return reply == 1

    async def release(self, lease: Lease) -> None:
        await self._release(self._client, self.keys(lease.engine), lease.lease_id)

    async def reserved(self, engine: str) -> int:
        return int(_text(await self._reserved(self._client, self.keys(engine))))

    async def by_tenant(self, engine: str) -> dict[str, int]:
        reply = await self._by_tenant(self._client, self.keys(engine))
        assert isinstance(reply, list)
        return {_text(reply[i]): int(_text(reply[i + 1])) for i in range(0, len(reply), 2)}


_KEY_NAMES = ("expiries", "leases", "tenants", "total", "waiting")


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _pair(reply: object) -> tuple[int, int]:
    assert isinstance(reply, list) and len(reply) == 2
    return int(reply[0]), int(reply[1])
