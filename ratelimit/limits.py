"""Requests-per-minute and tokens-per-minute limits: two backends, one semantics.

A *scope* (for example one API key) of a *tenant* has two GCRA buckets (``ratelimit.gcra``):
requests (each request costs 1) and tokens (a request reserves its estimated tokens up front and
gets back what it did not use when it ends: OpenAI's reservation rule). Rules:

- ``reserve`` checks both buckets at one instant and takes from both only if both allow: a
  request refused for tokens takes nothing from the requests bucket, and the other way round.
  ``denied_by`` names the refusing limit, requests first. On a refusal, a bucket that would have
  allowed reports itself as it stands (``allowed`` true, nothing taken).
- ``refund`` returns unused tokens to the tokens bucket, never beyond full.
- A limit of 0 is unlimited. An absent bucket is a full one, so idle state may vanish.

``admit`` is that rule as a pure function; ``MemoryBackend`` applies it to a dict (per process:
with several replicas each holds its own limits), ``RedisBackend`` runs the same rules in one
Lua script per call, so a call is one round trip and atomic across replicas:

- now is the Redis server's clock (``TIME``), so replicas with skewed clocks agree; seconds are
  counted from ``_EPOCH`` (2025-01-01) to keep doubles precise (ulp ~4 ns rather than ~240 ns).
- state: one hash per scope, ``{prefix}rl:{<tenant>}:<scope>``, fields ``r`` and ``t`` (the two
  TATs as ``%.17g`` strings, which round-trip a double exactly), with a ``PEXPIRE`` of the time
  until both buckets are full, so idle keys vanish. The ``{tenant}`` hash tag keeps a tenant's
  keys in one Redis Cluster slot; braces and ``%`` in a tenant are %-escaped so that no
  (tenant, scope) pair can forge another's key.
- the script returns the state it found (now and both TATs); Python derives the ``Verdict`` with
  ``admit``, the function the memory backend uses. The Lua ``take`` evaluates ``gcra.decide``'s
  expressions in the same order, so both sides decide bit-identically (tests compare them).
- scripts are addressed by SHA-1 (``EVALSHA``); a server that lacks one (restart, ``SCRIPT
  FLUSH``) answers ``NOSCRIPT`` and the script is loaded and the call retried once.
- Redis errors propagate unchanged: the caller owns the fail-open/closed policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from redis.asyncio import Redis

from ratelimit.gcra import Decision, decide, refund
from ratelimit.luascript import LuaScript

LimitName = Literal["requests", "tokens"]


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int  # requests per minute; 0 = unlimited
    tpm: int  # tokens per minute; 0 = unlimited

    def __post_init__(self) -> None:
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError(f"limits cannot be negative: {self}")


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    requests: Decision
    tokens: Decision
    denied_by: LimitName | None  # which limit refused (requests first)

    @property
    def retry_after_s(self) -> float:
        """Seconds until every refusing bucket would allow (0 when allowed)."""
        return max(self.requests.retry_after_s, self.tokens.retry_after_s)


class RateLimitBackend(Protocol):
    async def reserve(self, scope: str, tenant: str, limits: Limits, tokens: int) -> Verdict:
        """Take 1 request and ``tokens`` tokens, both or nothing (atomic)."""
        ...

    async def refund(self, scope: str, tenant: str, limits: Limits, tokens: int) -> None:
        """Return ``tokens`` unused tokens to the tokens bucket (settlement)."""
        ...

    async def aclose(self) -> None: ...


def admit(
    requests_tat: float, tokens_tat: float, now: float, limits: Limits, tokens: int
) -> tuple[float, float, Verdict]:
    """The reservation rule: both buckets or neither. Returns the new TATs and the verdict."""
    new_requests_tat, requests = decide(requests_tat, now, limits.rpm, 1)
    new_tokens_tat, tokens_decision = decide(tokens_tat, now, limits.tpm, tokens)
    if requests.allowed and tokens_decision.allowed:
        return new_requests_tat, new_tokens_tat, Verdict(True, requests, tokens_decision, None)
    # Nothing is taken: a bucket that would have allowed reports itself untouched (cost 0).
    if requests.allowed:
        requests = decide(requests_tat, now, limits.rpm, 0)[1]
    if tokens_decision.allowed:
        tokens_decision = decide(tokens_tat, now, limits.tpm, 0)[1]
    denied_by: LimitName = "tokens" if requests.allowed else "requests"
    return requests_tat, tokens_tat, Verdict(False, requests, tokens_decision, denied_by)


def _check_tokens(tokens: int) -> None:
    if tokens < 0:
        raise ValueError(f"a token count cannot be negative: {tokens}")


class MemoryBackend:
    """In-process buckets; ``clock`` is any monotonic clock in seconds (tests inject one).

    Atomic under asyncio: no call awaits between reading and writing its state. Full buckets
    are dropped (an absent bucket is full); a sweep runs whenever the table has doubled since
    the last one, so idle scopes cost amortised O(1) and memory stays bounded by active ones.
    """

    _MIN_SWEEP = 1024

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tats: dict[tuple[str, str], tuple[float, float]] = {}
        self._sweep_at = self._MIN_SWEEP

    def __len__(self) -> int:
        """How many scopes hold state (buckets not full)."""
        return len(self._tats)

    async def reserve(self, scope: str, tenant: str, limits: Limits, tokens: int) -> Verdict:
        now = self._clock()
        key = (tenant, scope)
        requests_tat, tokens_tat = self._tats.get(key, (now, now))
        requests_tat, tokens_tat, verdict = admit(requests_tat, tokens_tat, now, limits, tokens)
        self._store(key, now, requests_tat, tokens_tat)
        return verdict

    async def refund(self, scope: str, tenant: str, limits: Limits, tokens: int) -> None:
        _check_tokens(tokens)
        now = self._clock()
        key = (tenant, scope)
        if (state := self._tats.get(key)) is not None:
            self._store(key, now, state[0], refund(state[1], now, limits.tpm, tokens))

    async def aclose(self) -> None:
        self._tats.clear()

    def _store(
        self, key: tuple[str, str], now: float, requests_tat: float, tokens_tat: float
    ) -> None:
        if max(requests_tat, tokens_tat) > now:
            self._tats[key] = (requests_tat, tokens_tat)
        else:
            self._tats.pop(key, None)
        if len(self._tats) >= self._sweep_at:
            self._tats = {k: v for k, v in self._tats.items() if max(v) > now}
            self._sweep_at = max(self._MIN_SWEEP, 2 * len(self._tats))


_EPOCH = 1_735_689_600  # 2025-01-01T00:00:00Z, the origin of the Lua clock

# gcra.decide and gcra.refund in Lua, the same expressions in the same order. Lua numbers are
# doubles (Redis embeds Lua 5.1), so both sides compute bit-identical TATs.
_LUA_GCRA = """
local WINDOW, SLACK = 60, 0.001

-- gcra.decide: the new TAT, or nil when `cost` does not fit (limit 0: unlimited)
local function take(tat, now, limit, cost)
  if limit == 0 then return tat end
  local interval = WINDOW / limit
  local base = math.max(tat, now)
  local available = limit - (base - now) / interval
  if cost > limit or cost > available + SLACK then return nil end
  return base + cost * interval
end

-- gcra.refund: back by `amount` units, never before now, never forward
local function give_back(tat, now, limit, amount)
  if limit == 0 then return tat end
  return math.min(tat, math.max(tat - amount * (WINDOW / limit), now))
end

local function fmt(x) return string.format('%.17g', x) end
"""

# Redis >= 5 replicates scripts by their effects, so reading TIME before writing is allowed and
# replicas receive the HSET/PEXPIRE, not the script.
_LUA_STATE = f"""
local function clock()
  local t = redis.call('TIME')
  return (tonumber(t[1]) - {_EPOCH}) + tonumber(t[2]) / 1000000
end

-- keep the key until both buckets are full again; a full bucket is an absent one
local function store(key, now, tat_r, tat_t)
  local ttl = math.ceil((math.max(tat_r, tat_t) - now) * 1000)
  if ttl > 0 then
    redis.call('HSET', key, 'r', fmt(tat_r), 't', fmt(tat_t))
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('DEL', key)
  end
end
"""

# KEYS[1] = the scope's hash; ARGV = rpm, tpm, tokens. Returns now and the TATs it found.
_LUA_RESERVE = """
local key = KEYS[1]
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = clock()
local found = redis.call('HMGET', key, 'r', 't')
local tat_r, tat_t = tonumber(found[1]) or now, tonumber(found[2]) or now
local new_r, new_t = take(tat_r, now, rpm, 1), take(tat_t, now, tpm, tokens)
if new_r and new_t then store(key, now, new_r, new_t) end
return {fmt(now), fmt(tat_r), fmt(tat_t)}
"""

# KEYS[1] = the scope's hash; ARGV = tpm, tokens. An absent bucket is full: nothing to do.
_LUA_REFUND = """
local key = KEYS[1]
local tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2])
local found = redis.call('HMGET', key, 'r', 't')
if not found[2] then return 0 end
local now = clock()
store(key, now, tonumber(found[1]) or now, give_back(tonumber(found[2]), now, tpm, tokens))
return 1
"""


_RESERVE = LuaScript(_LUA_GCRA + _LUA_STATE + _LUA_RESERVE)
_REFUND = LuaScript(_LUA_GCRA + _LUA_STATE + _LUA_REFUND)


class RedisBackend:
    """Buckets shared by every replica through Redis: one script call (one round trip) per
    ``reserve`` and per ``refund``. The backend owns ``client``: ``aclose`` closes it.
    ``key_prefix`` namespaces the keys (tests use a random one)."""

    def __init__(self, client: Redis, *, key_prefix: str = "") -> None:
        if "{" in key_prefix or "}" in key_prefix:
            raise ValueError("key_prefix cannot contain braces: they would move the hash tag")
        self._client = client
        self._prefix = key_prefix

    def key(self, scope: str, tenant: str) -> str:
        """The Redis key holding ``scope``'s buckets."""
        tag = tenant.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
        return f"{self._prefix}rl:{{{tag}}}:{scope}"

    async def reserve(self, scope: str, tenant: str, limits: Limits, tokens: int) -> Verdict:
        _check_tokens(tokens)
        found = await _RESERVE(
            self._client, [self.key(scope, tenant)], limits.rpm, limits.tpm, tokens
        )
        now, requests_tat, tokens_tat = _floats(found)
        return admit(requests_tat, tokens_tat, now, limits, tokens)[2]

    async def refund(self, scope: str, tenant: str, limits: Limits, tokens: int) -> None:
        _check_tokens(tokens)
        await _REFUND(self._client, [self.key(scope, tenant)], limits.tpm, tokens)

    async def aclose(self) -> None:
        await self._client.aclose()


def _floats(reply: object) -> tuple[float, float, float]:
    """The reserve script's reply: three numbers as strings (bytes unless decode_responses)."""
    if not isinstance(reply, Sequence) or len(reply) != 3:
        raise TypeError(f"unexpected reply from the rate-limit script: {reply!r}")
    now, requests_tat, tokens_tat = (float(value) for value in reply)
    return now, requests_tat, tokens_tat
