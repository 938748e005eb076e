"""Shared KV-cache reservations per upstream engine, held as leases.

A reasoning model keeps every token of a request in the engine's KV cache until the request
ends, so the gateway admits a request only if its worst case fits the engine's admitted limit
(``ratelimit.aimd``). Rules:

- A request reserves ``prompt estimate + max_tokens`` tokens, rounded up to the engine's block
  size (``round_to_blocks``): vLLM allocates the cache in whole blocks (PagedAttention).
- ``try_reserve`` is atomic: it purges expired leases, then admits iff ``reserved + tokens <=
  limit`` and returns ``(admitted, reserved after)``. A request larger than the limit is never
  admitted; refusing it outright is the caller's decision.
- A reservation is a lease with an expiry, so the reservations of a crashed replica come back
  by themselves; the holder ``renew``s while the request runs and ``release``s it when the
  request ends, however it ends. A lease is expired once ``now >= expiry``.
- ``renew`` of an expired lease returns ``False`` and the lease is gone: the request now runs
  unreserved, and the caller decides what that means.
- ``release`` is idempotent. Releasing a lease whose ``try_reserve`` was cancelled mid-flight is
  safe and is how such a reservation comes back before its expiry.
- ``try_reserve`` of a lease id that is already live renews it and admits without counting it
  twice: a retried call after a lost reply cannot double-book.

Backends: ``MemoryKVBudgetStore`` (one process, injectable clock) and ``RedisKVBudgetStore``
(shared by every gateway replica; one Lua script per operation, Redis ``TIME`` as the clock).
Redis errors propagate unchanged (``redis.exceptions.RedisError``, ``OSError``); the gateway
translates them at its one Redis boundary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from redis.asyncio import Redis

from ratelimit.fairness import Priority
from ratelimit.luascript import LuaScript


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


class KVBudgetStore(Protocol):
    async def try_reserve(self, lease: Lease, limit: int, ttl_s: float) -> tuple[bool, int]:
        """Atomically purge expired leases and admit iff reserved + tokens <= limit."""
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

    def _book(self, engine: str) -> _Book:
        book = self._books.setdefault(engine, _Book())
        book.purge(self._clock())
        return book

    async def try_reserve(self, lease: Lease, limit: int, ttl_s: float) -> tuple[bool, int]:
        _check_ttl(ttl_s)
        book = self._book(lease.engine)
        expiry = self._clock() + ttl_s
        if book.extend(lease.lease_id, expiry):
            return True, book.total
        if book.total + lease.tokens > limit:
            return False, book.total
        book.add(lease, expiry)
        return True, book.total

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

# KEYS: expiries (sorted set lease id -> expiry ms), leases (hash lease id -> "tokens|tenant"),
# tenants (hash tenant -> tokens), total (string). The two running totals make a reservation
# O(log n + expired) instead of a sum over every lease. Every key expires a second after the
# last lease does, so an engine nobody uses any more leaves nothing behind; when no lease is
# left the totals are reset, so they cannot drift even if a key was evicted.
_PRELUDE = """
local expiries, leases, tenants, total_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function drop(id)
  redis.call('ZREM', expiries, id)
  local held = redis.call('HGET', leases, id)
  if not held then return end
  redis.call('HDEL', leases, id)
  local bar = string.find(held, '|', 1, true)
  local tokens = tonumber(string.sub(held, 1, bar - 1))
  local tenant = string.sub(held, bar + 1)
  if redis.call('HINCRBY', tenants, tenant, -tokens) <= 0 then
    redis.call('HDEL', tenants, tenant)
  end
  if redis.call('DECRBY', total_key, tokens) <= 0 then redis.call('DEL', total_key) end
end

local function purge()
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', expiries, '-inf', now)) do drop(id) end
  if redis.call('ZCARD', expiries) == 0 then redis.call('DEL', leases, tenants, total_key) end
end

local function total() return tonumber(redis.call('GET', total_key) or '0') end

local function hold(id, expiry)
  redis.call('ZADD', expiries, expiry, id)
  local last = redis.call('ZRANGE', expiries, -1, -1, 'WITHSCORES')
  for _, key in ipairs(KEYS) do redis.call('PEXPIREAT', key, tonumber(last[2]) + 1000) end
end
"""

# ARGV: lease id, tokens, tenant, limit, ttl ms. Returns {admitted 0/1, reserved after}.
_TRY_RESERVE = """
purge()
local id, tokens, limit, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('ZSCORE', expiries, id) then
  hold(id, now + ttl)
  return {1, total()}
end
local reserved = total()
if reserved + tokens > limit then return {0, reserved} end
redis.call('HSET', leases, id, ARGV[2] .. '|' .. ARGV[3])
redis.call('HINCRBY', tenants, ARGV[3], tokens)
redis.call('INCRBY', total_key, tokens)
hold(id, now + ttl)
return {1, reserved + tokens}
"""

# ARGV: lease id, ttl ms. Returns 1 if the lease was live (and now runs to now + ttl), else 0.
_RENEW = """
purge()
if not redis.call('ZSCORE', expiries, ARGV[1]) then return 0 end
hold(ARGV[1], now + tonumber(ARGV[2]))
return 1
"""

_RELEASE = """
drop(ARGV[1])
purge()
return 1
"""

_RESERVED = """
purge()
return total()
"""

_BY_TENANT = """
purge()
return redis.call('HGETALL', tenants)
"""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisKVBudgetStore:
    """The budget shared by every gateway replica through one Redis.

    An engine's keys carry the hash tag ``{engine}``, so they share one Redis Cluster slot and
    one script can touch them all. ``prefix`` (no braces) separates deployments or tests.
    Works with ``decode_responses`` on or off.
    """

    _try_reserve = LuaScript(_PRELUDE + _TRY_RESERVE)
    _renew = LuaScript(_PRELUDE + _RENEW)
    _release = LuaScript(_PRELUDE + _RELEASE)
    _reserved = LuaScript(_PRELUDE + _RESERVED)
    _by_tenant = LuaScript(_PRELUDE + _BY_TENANT)

    def __init__(self, client: Redis, *, prefix: str = "thinkgate:kv:") -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix must not contain braces (they mark the hash tag)")
        self._client = client
        self._prefix = prefix

    def keys(self, engine: str) -> tuple[str, str, str, str]:
        """The engine's keys: lease expiries, leases, per-tenant totals, total."""
        base = f"{self._prefix}{{{engine}}}"
        return (f"{base}:expiries", f"{base}:leases", f"{base}:tenants", f"{base}:total")

    async def try_reserve(self, lease: Lease, limit: int, ttl_s: float) -> tuple[bool, int]:
        _check_ttl(ttl_s)
        reply = await self._try_reserve(
            self._client, self.keys(lease.engine),
            lease.lease_id, lease.tokens, lease.tenant, limit, _ms(ttl_s),
        )  # fmt: skip
        admitted, reserved = _pair(reply)
        return bool(admitted), reserved

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


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _pair(reply: object) -> tuple[int, int]:
    assert isinstance(reply, list) and len(reply) == 2
    return int(reply[0]), int(reply[1])
