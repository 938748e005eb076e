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
    double-book), who asks, how urgently, and the candidate engines in tie-break order."""

    lease_id: str
    tenant: str
    priority: Priority
    choices: tuple[Choice, ...]

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
                                pressure_threshold=rules.pressure_threshold)  # fmt: skip
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

    async def reserved(self, engine: str) -> int:
        return self._book(engine).total

    async def by_tenant(self, engine: str) -> dict[str, int]:
        return dict(self._book(engine).tenants)


# --- Redis --------------------------------------------------------------------------------------

# An engine's keys, from base offset ``e`` into KEYS: e+1 expiries (sorted set lease id ->
# expiry ms), e+2 leases (hash lease id -> "tokens|tenant"), e+3 tenants (hash tenant ->
# tokens), e+4 total (string), e+5 waiting (sorted set tenant -> until ms). The running totals
# make a reservation O(log n + expired) instead of a sum over every lease. Every key expires at
# least a second, and at most about two lease TTLs, after the last lease or waiter it holds, so
# an engine nobody uses leaves nothing behind; when no lease is left the totals are reset, so
# they cannot drift even if a key was evicted.
_PRELUDE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function drop(e, id)
  redis.call('ZREM', KEYS[e+1], id)
  local held = redis.call('HGET', KEYS[e+2], id)
  if not held then return end
  redis.call('HDEL', KEYS[e+2], id)
  local bar = string.find(held, '|', 1, true)
  local tokens = tonumber(string.sub(held, 1, bar - 1))
  local tenant = string.sub(held, bar + 1)
  if redis.call('HINCRBY', KEYS[e+3], tenant, -tokens) <= 0 then
    redis.call('HDEL', KEYS[e+3], tenant)
  end
  if redis.call('DECRBY', KEYS[e+4], tokens) <= 0 then redis.call('DEL', KEYS[e+4]) end
end

local function purge(e)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[e+1], '-inf', now)
  if #expired > 0 then
    for _, id in ipairs(expired) do drop(e, id) end
    if redis.call('ZCARD', KEYS[e+1]) == 0 then
      redis.call('DEL', KEYS[e+2], KEYS[e+3], KEYS[e+4])
    end
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[e+5], '-inf', now)
end

local function total(e) return tonumber(redis.call('GET', KEYS[e+4]) or '0') end

-- Keep keys e+j0..e+j1 alive until at least `until_ms` + 1 s. A short expiry is pushed twice
-- as far as needed, so most calls only read one PTTL.
local function outlive(e, j0, j1, until_ms)
  local left = redis.call('PTTL', KEYS[e+j0])
  if left >= 0 and now + left >= until_ms + 1000 then return end
  local horizon = until_ms + 1000 + math.max(until_ms - now, 0)
  for j = j0, j1 do redis.call('PEXPIREAT', KEYS[e+j], horizon) end
end

local function hold(e, id, expiry)
  redis.call('ZADD', KEYS[e+1], expiry, id)
  outlive(e, 1, 4, expiry)
end
"""

# ARGV: lease id, tenant, priority, ttl ms, waiting ttl ms, pressure threshold, the number of
# weights and (tenant, weight) pairs, then (limit, tokens) per candidate; KEYS: five per
# candidate, in the same order. fairness.decide and fairness.route in Lua: the same integer
# expressions in the same order. Returns {1, candidate} admitted, {0, 0} wait, {-1, 0} reject.
_ADMIT = """
local id, tenant, priority = ARGV[1], ARGV[2], ARGV[3]
local ttl, wttl, threshold = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local weights, nw = {}, tonumber(ARGV[7])
for j = 0, nw - 1 do weights[ARGV[8 + 2 * j]] = tonumber(ARGV[9 + 2 * j]) end
local first = 8 + 2 * nw
local n = #KEYS / 5
local function weight(t) return weights[t] or 1 end
local function limit(i) return tonumber(ARGV[first + 2 * (i - 1)]) end
local function tokens(i) return tonumber(ARGV[first + 2 * (i - 1) + 1]) end

for i = 1, n do
  local e = 5 * (i - 1)
  purge(e)
  if redis.call('ZSCORE', KEYS[e+1], id) then hold(e, id, now + ttl); return {1, i} end
end

local function within_share(e, need, cap, waiting)
  local seen, sum, mine = {}, 0, 0
  local held = redis.call('HGETALL', KEYS[e+3])
  for j = 1, #held, 2 do
    local t, h = held[j], tonumber(held[j + 1])
    if t == tenant then mine = h end
    if h > 0 and not seen[t] then seen[t] = true; sum = sum + weight(t) end
  end
  for _, t in ipairs(waiting) do
    if not seen[t] then seen[t] = true; sum = sum + weight(t) end
  end
  if not seen[tenant] then sum = sum + weight(tenant) end
  return (mine + need) * sum <= cap * weight(tenant)
end

local function decide(e, reserved, cap, need)
  local after = reserved + need
  if after > cap * threshold then
    if priority == 'sheddable' then return 'reject' end
    if priority == 'standard' then return 'wait' end
  end
  if after > cap then return 'wait' end
  local waiting = redis.call('ZRANGE', KEYS[e+5], 0, -1)
  local others = false
  for _, t in ipairs(waiting) do if t ~= tenant then others = true end end
  if not others or within_share(e, need, cap, waiting) then return 'admit' end
  return 'wait'
end

local order, free, totals = {}, {}, {}
for i = 1, n do
  totals[i] = total(5 * (i - 1))
  order[i] = i
  free[i] = totals[i] - limit(i)
end
table.sort(order, function(a, b)
  if free[a] ~= free[b] then return free[a] < free[b] end
  return a < b
end)

local waits = false
for _, i in ipairs(order) do
  local e, need = 5 * (i - 1), tokens(i)
  local verdict = decide(e, totals[i], limit(i), need)
  if verdict == 'admit' then
    redis.call('HSET', KEYS[e+2], id, need .. '|' .. tenant)
    redis.call('HINCRBY', KEYS[e+3], tenant, need)
    redis.call('INCRBY', KEYS[e+4], need)
    hold(e, id, now + ttl)
    return {1, i}
  end
  if verdict == 'wait' then waits = true end
end
if not waits then return {-1, 0} end
for i = 1, n do
  local e = 5 * (i - 1)
  redis.call('ZADD', KEYS[e+5], now + wttl, tenant)
  outlive(e, 5, 5, now + wttl)
end
return {0, 0}
"""

# ARGV: lease id, ttl ms. Returns 1 if the lease was live (and now runs to now + ttl), else 0.
_RENEW = """
purge(0)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
hold(0, ARGV[1], now + tonumber(ARGV[2]))
return 1
"""

_RELEASE = """
drop(0, ARGV[1])
purge(0)
return 1
"""

_RESERVED = """
purge(0)
return total(0)
"""

_BY_TENANT = """
purge(0)
return redis.call('HGETALL', KEYS[3])
"""

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

    _admit = LuaScript(_PRELUDE + _ADMIT)
    _renew = LuaScript(_PRELUDE + _RENEW)
    _release = LuaScript(_PRELUDE + _RELEASE)
    _reserved = LuaScript(_PRELUDE + _RESERVED)
    _by_tenant = LuaScript(_PRELUDE + _BY_TENANT)

    def __init__(self, client: ScriptClient, *, prefix: str = "thinkgate:kv:") -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix must not contain braces (they mark the hash tag)")
        self._client = client
        self._prefix = prefix

    def keys(self, engine: str) -> tuple[str, ...]:
        """The engine's keys: lease expiries, leases, per-tenant totals, total, waiters."""
        base = f"{self._prefix}{{pool}}:{engine}"
        return tuple(f"{base}:{name}" for name in _KEY_NAMES)

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
            len(rules.weights), *weights, *per_choice,
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
