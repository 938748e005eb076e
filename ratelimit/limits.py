"""Requests-per-minute and tokens-per-minute limits over several scopes: two backends, one
semantics.

A *scope* of a *tenant* (in practice the API key's ``key:<id>`` and the tenant's own ``tenant``)
has two GCRA buckets (``ratelimit.gcra``): requests (each request costs 1) and tokens (a request
reserves its estimated tokens up front and gets back what it did not use when it ends: OpenAI's
reservation rule). A limit of 0 is unlimited. Rules:

- ``reserve(tenant, scopes, tokens)`` takes 1 request and ``tokens`` tokens from every limited
  bucket of every scope, at one instant, all or nothing: if any bucket refuses, nothing is taken
  anywhere, and a bucket that would have allowed reports itself untouched (cost 0, ``allowed``).
- The ``Verdict`` names one *binding* bucket per kind (requests, tokens): if buckets of that kind
  refused, the refusing one with the longest ``retry_after_s``; otherwise the limited one with
  the least ``remaining``; ties go to the scope given first. A kind that no scope limits reports
  gcra's unlimited decision (limit 0, ``remaining`` ``UNLIMITED``) under the first scope's name
  ("" without scopes). ``denied_by`` is ``"requests"`` if any requests bucket refused, else
  ``"tokens"``; ``retry_after_s`` is then the wait until every refusing bucket would allow.
- ``refund(tenant, scopes, tokens)`` returns ``tokens`` to every scope's tokens bucket, never
  beyond full. An absent bucket is a full one, so idle state may vanish (nothing to refund).
- Budgets in money ride along (``ratelimit.money``): ``reserve(..., money)`` takes the buckets
  and reserves the money in one call, all or nothing (a refusal by a budget is ``denied_by``
  ``"budget"``, its ``Spent`` in ``Verdict.spent``, every bucket untouched); ``refund(...,
  counters, delta)`` settles the money with the tokens; ``spent(tenant, counters)`` reads them.
- A scope with both limits 0 costs nothing and stores nothing. A call with nothing to do touches
  no state (no Redis round trip): a ``reserve`` without a limited scope (it is allowed), a
  ``refund`` of 0 tokens or without a scope that limits tokens.
- ``tokens`` cannot be negative, and scope names are unique within a call (``ValueError``).

``admit`` is that rule as a pure function; ``MemoryBackend`` applies it to a dict (per process:
with several replicas each holds its own limits), ``RedisBackend`` runs the same rules in one
Lua script per call whatever the number of scopes, so a call is one round trip and atomic across
replicas:

- now is the Redis server's clock (``TIME``), so replicas with skewed clocks agree; seconds are
  counted from ``_EPOCH`` (2025-01-01) to keep doubles precise (ulp ~4 ns rather than ~240 ns).
- state: one hash per limited scope, ``{prefix}rl:{<tenant>}:<scope>``, fields ``r`` and ``t``
  (the two TATs as ``%.17g`` strings, which round-trip a double exactly), with a ``PEXPIRE`` of
  the time until both its buckets are full, so idle keys vanish. The ``{tenant}`` hash tag keeps
  a tenant's keys in one Redis Cluster slot, so one script may touch all the scopes of a call;
  braces and ``%`` in a tenant are %-escaped so that no (tenant, scope) pair can forge another's
  key.
- ``KEYS`` holds one hash per limited scope, then the money counters
  (``{prefix}spend:{<tenant>}:<counter>``, in the tenant's slot too); ``ARGV`` the scope count,
  each one's rpm and tpm, ``tokens``, then the money's amount, TTL and limits.
  The script returns the state it found (now, then both TATs of every scope); Python derives the
  ``Verdict`` with ``admit``, the function the memory backend uses. The Lua ``take`` evaluates
  ``gcra.decide``'s expressions in the same order and the Lua ``admit`` applies the same
  all-or-nothing rule, so both sides decide bit-identically (tests compare them).
- scripts are addressed by SHA-1 (``EVALSHA``); a server that lacks one (restart, ``SCRIPT
  FLUSH``) answers ``NOSCRIPT`` and the script is loaded and the call retried once.
- Redis errors propagate unchanged: the caller owns the fail-open/closed policy.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, Protocol, cast

from ratelimit.gcra import Decision, decide, refund
from ratelimit.luascript import LuaScript, ScriptClient
from ratelimit.money import KEEP_S, MemoryCounters, Money, Spent

LimitName = Literal["requests", "tokens"]

Tats = tuple[float, float]
"""One scope's state: the TATs of its requests bucket and of its tokens bucket."""


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int  # requests per minute; 0 = unlimited
    tpm: int  # tokens per minute; 0 = unlimited

    def __post_init__(self) -> None:
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError(f"limits cannot be negative: {self}")


@dataclass(frozen=True, slots=True)
class Scope:
    name: str  # e.g. "key:abc123" or "tenant"; unique within a call
    limits: Limits


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket's answer: which scope it belongs to, its limit and its decision."""

    scope: str
    limit: int  # per minute; 0 = unlimited
    decision: Decision


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    requests: Bucket  # the binding requests bucket
    tokens: Bucket  # the binding tokens bucket
    denied_by: LimitName | Literal["budget"] | None  # which refused (requests first)
    spent: Spent | None = None  # the money's answer, when money was asked and the buckets allowed

    @property
    def retry_after_s(self) -> float:
        """Seconds until every refusing bucket would allow (0 when allowed)."""
        return max(self.requests.decision.retry_after_s, self.tokens.decision.retry_after_s)


class RateLimitBackend(Protocol):
    async def reserve(
        self, tenant: str, scopes: Sequence[Scope], tokens: int, money: Money | None = None
    ) -> Verdict:
        """Take 1 request and ``tokens`` tokens from every limited bucket, and ``money``,
        all or nothing."""
        ...

    async def refund(
        self, tenant: str, scopes: Sequence[Scope], tokens: int,
        counters: Sequence[str] = (), delta: int = 0,
    ) -> None:  # fmt: skip
        """Return ``tokens`` unused tokens to every scope's tokens bucket, and add ``delta``
        to each money counter (settlement)."""
        ...

    async def spent(self, tenant: str, counters: Sequence[str]) -> list[int]:
        """What each money counter holds."""
        ...

    async def aclose(self) -> None: ...


def limited(scopes: Sequence[Scope]) -> list[Scope]:
    """The scopes that limit something, in order: the only ones that hold state."""
    return [scope for scope in scopes if scope.limits.rpm or scope.limits.tpm]


def admit(
    scopes: Sequence[Scope], tats: Sequence[Tats], now: float, tokens: int
) -> tuple[list[Tats], Verdict]:
    """The reservation rule over ``scopes``, whose limited ones (``limited(scopes)``) have the
    TATs ``tats``, in order. Returns their new TATs (unchanged unless allowed) and the verdict."""
    active = limited(scopes)
    if len(tats) != len(active):
        raise ValueError(f"{len(tats)} states for {len(active)} limited scopes")
    asked = [_ask(scope, tat, now, tokens) for scope, tat in zip(active, tats, strict=True)]
    if all(one.requests.decision.allowed and one.tokens.decision.allowed for one in asked):
        return [one.tats for one in asked], _verdict(True, scopes, asked)
    # Nothing is taken: a bucket that would have allowed reports itself untouched (cost 0).
    untouched = [
        _Asked(tat, _untouched(one.requests, tat[0], now), _untouched(one.tokens, tat[1], now))
        for tat, one in zip(tats, asked, strict=True)
    ]
    return list(tats), _verdict(False, scopes, untouched)


class _Asked(NamedTuple):
    """One scope asked: its TATs should the request be allowed, and its buckets' answers."""

    tats: Tats
    requests: Bucket
    tokens: Bucket


def _ask(scope: Scope, tats: Tats, now: float, tokens: int) -> _Asked:
    """Ask ``scope``'s buckets for 1 request and ``tokens`` tokens."""
    requests_tat, requests = decide(tats[0], now, scope.limits.rpm, 1)
    tokens_tat, tokens_decision = decide(tats[1], now, scope.limits.tpm, tokens)
    return _Asked(
        (requests_tat, tokens_tat),
        Bucket(scope.name, scope.limits.rpm, requests),
        Bucket(scope.name, scope.limits.tpm, tokens_decision),
    )


def by_budget(scopes: Sequence[Scope], tats: Sequence[Tats], now: float, spent: Spent) -> Verdict:
    """The buckets allowed and a budget refused (``spent``): nothing is taken, and every
    bucket reports itself as it stands."""
    asked = [_ask(scope, tat, now, 0) for scope, tat in zip(limited(scopes), tats, strict=True)]
    untouched = [_Asked(tat, _untouched(one.requests, tat[0], now), one.tokens)
                 for tat, one in zip(tats, asked, strict=True)]  # fmt: skip
    return replace(_verdict(True, scopes, untouched), allowed=False, denied_by="budget",
                   spent=spent)  # fmt: skip


def _untouched(bucket: Bucket, tat: float, now: float) -> Bucket:
    """A refusing bucket as it is; an allowing one as it stands with nothing taken."""
    if not bucket.decision.allowed:
        return bucket
    return Bucket(bucket.scope, bucket.limit, decide(tat, now, bucket.limit, 0)[1])


def _verdict(allowed: bool, scopes: Sequence[Scope], asked: Sequence[_Asked]) -> Verdict:
    fallback = scopes[0].name if scopes else ""
    requests = _binding([one.requests for one in asked], fallback)
    tokens = _binding([one.tokens for one in asked], fallback)
    denied_by: LimitName | None = None
    if not allowed:
        denied_by = "tokens" if requests.decision.allowed else "requests"
    return Verdict(allowed, requests, tokens, denied_by)


def _binding(buckets: Sequence[Bucket], fallback: str) -> Bucket:
    """The refusing bucket with the longest wait, else the limited one with the least left
    (``max`` and ``min`` keep the first of equals: ties go to the scope given first)."""
    limited_ = [bucket for bucket in buckets if bucket.limit]
    if refusing := [bucket for bucket in limited_ if not bucket.decision.allowed]:
        return max(refusing, key=lambda bucket: bucket.decision.retry_after_s)
    if limited_:
        return min(limited_, key=lambda bucket: bucket.decision.remaining)
    return Bucket(fallback, 0, decide(0.0, 0.0, 0, 0)[1])


def _check(scopes: Sequence[Scope], tokens: int) -> None:
    if tokens < 0:
        raise ValueError(f"a token count cannot be negative: {tokens}")
    names = [scope.name for scope in scopes]
    if len(set(names)) != len(names):
        raise ValueError(f"scope names must be unique within a call: {names}")


def _with_tokens(scopes: Sequence[Scope]) -> list[Scope]:
    """The scopes a refund concerns: those with a tokens bucket."""
    return [scope for scope in scopes if scope.limits.tpm]


class MemoryBackend:
    """In-process buckets; ``clock`` is any monotonic clock in seconds (tests inject one).

    Atomic under asyncio: no call awaits between reading and writing its state. Full buckets
    are dropped (an absent bucket is full); a sweep runs whenever the table has doubled since
    the last one, so idle scopes cost amortised O(1) and memory stays bounded by active ones.
    """

    _MIN_SWEEP = 1024

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tats: dict[tuple[str, str], Tats] = {}
        self._sweep_at = self._MIN_SWEEP
        self.money = MemoryCounters()

    def __len__(self) -> int:
        """How many scopes hold state (buckets not full)."""
        return len(self._tats)

    async def reserve(
        self, tenant: str, scopes: Sequence[Scope], tokens: int, money: Money | None = None
    ) -> Verdict:
        _check(scopes, tokens)
        now = self._clock()
        keys = [(tenant, scope.name) for scope in limited(scopes)]
        found = [self._tats.get(key, (now, now)) for key in keys]
        new, verdict = admit(scopes, found, now, tokens)
        if verdict.allowed and money is not None:
            spent = self.money.reserve(tenant, money)
            if spent.refused:
                return by_budget(scopes, found, now, spent)
            verdict = _with_money(verdict, spent)
        for key, tats in zip(keys, new, strict=True):
            self._store(key, now, tats)
        return verdict

    async def refund(
        self, tenant: str, scopes: Sequence[Scope], tokens: int,
        counters: Sequence[str] = (), delta: int = 0,
    ) -> None:  # fmt: skip
        _check(scopes, tokens)
        now = self._clock()
        for scope in _with_tokens(scopes):
            key = (tenant, scope.name)
            if (tats := self._tats.get(key)) is not None:
                self._store(key, now, (tats[0], refund(tats[1], now, scope.limits.tpm, tokens)))
        if delta:
            self.money.settle(tenant, counters, delta)

    async def spent(self, tenant: str, counters: Sequence[str]) -> list[int]:
        return self.money.spent(tenant, counters)

    async def aclose(self) -> None:
        self._tats.clear()

    def _store(self, key: tuple[str, str], now: float, tats: Tats) -> None:
        if max(tats) > now:
            self._tats[key] = tats
        else:
            self._tats.pop(key, None)
        if len(self._tats) >= self._sweep_at:
            self._tats = {k: v for k, v in self._tats.items() if max(v) > now}
            self._sweep_at = max(self._MIN_SWEEP, 2 * len(self._tats))


_EPOCH = 1_735_689_600  # 2025-01-01T00:00:00Z, the origin of the Lua clock


# gcra.decide, gcra.refund and admit's all-or-nothing rule in Lua (lua/limits_gcra.lua: the
# same expressions in the same order, so both sides compute bit-identical TATs), the clock and
# the store (lua/limits_state.lua), then each call's body.
_RESERVE = LuaScript(
    files=("limits_gcra.lua", "limits_state.lua", "limits_money.lua", "limits_reserve.lua")
)
_REFUND = LuaScript(
    files=("limits_gcra.lua", "limits_state.lua", "limits_money.lua", "limits_refund.lua")
)
_SPENT = LuaScript(files=("limits_spent.lua",))


class RedisBackend:
    """Buckets shared by every replica through Redis: one script call (one round trip) per
    ``reserve`` and per ``refund``, whatever the number of scopes. The backend owns ``client``:
    ``aclose`` closes it. ``key_prefix`` namespaces the keys (tests use a random one)."""

    def __init__(self, client: ScriptClient, *, key_prefix: str = "") -> None:
        if "{" in key_prefix or "}" in key_prefix:
            raise ValueError("key_prefix cannot contain braces: they would move the hash tag")
        self._client = client
        self._prefix = key_prefix

    def key(self, scope: str, tenant: str) -> str:
        """The Redis key holding ``scope``'s buckets."""
        return f"{self._prefix}rl:{{{_tag(tenant)}}}:{scope}"

    def money_key(self, counter: str, tenant: str) -> str:
        """The Redis key of a money counter (in the tenant's slot, beside its buckets)."""
        return f"{self._prefix}spend:{{{_tag(tenant)}}}:{counter}"

    async def reserve(
        self, tenant: str, scopes: Sequence[Scope], tokens: int, money: Money | None = None
    ) -> Verdict:
        _check(scopes, tokens)
        active = limited(scopes)
        if not active and money is None:  # nothing limited: allowed, no state to read or write
            return admit(scopes, [], 0.0, tokens)[1]
        keys = [self.key(scope.name, tenant) for scope in active]
        args: list[int] = [len(active)]
        args += [n for scope in active for n in (scope.limits.rpm, scope.limits.tpm)]
        args.append(tokens)
        if money is not None:
            keys += [self.money_key(counter, tenant) for counter in money.counters]
            args += [money.amount, KEEP_S, *money.limits]
        reply = await _RESERVE(self._client, keys, *args)
        now, tats, spent = _found(reply, len(active))
        if spent is not None and spent.refused:
            return by_budget(scopes, tats, now, spent)
        verdict = admit(scopes, tats, now, tokens)[1]
        return verdict if spent is None else _with_money(verdict, spent)

    async def refund(
        self, tenant: str, scopes: Sequence[Scope], tokens: int,
        counters: Sequence[str] = (), delta: int = 0,
    ) -> None:  # fmt: skip
        _check(scopes, tokens)
        active = _with_tokens(scopes) if tokens else []
        if not active and not (delta and counters):
            return
        keys = [self.key(scope.name, tenant) for scope in active]
        keys += [self.money_key(counter, tenant) for counter in counters] if delta else []
        tpms = (scope.limits.tpm for scope in active)
        await _REFUND(self._client, keys, len(active), *tpms, tokens, delta)

    async def spent(self, tenant: str, counters: Sequence[str]) -> list[int]:
        if not counters:
            return []
        keys = [self.money_key(counter, tenant) for counter in counters]
        return [int(v) for v in cast(list[int], await _SPENT(self._client, keys))]

    async def aclose(self) -> None:
        await self._client.aclose()


def _with_money(verdict: Verdict, spent: Spent) -> Verdict:
    return Verdict(verdict.allowed, verdict.requests, verdict.tokens, verdict.denied_by, spent)


@functools.lru_cache(maxsize=4096)
def _tag(tenant: str) -> str:
    """The tenant as a hash tag: braces and ``%`` escaped, so no tenant forges another's."""
    return tenant.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def _found(reply: object, scopes: int) -> tuple[float, list[Tats], Spent | None]:
    """The reserve script's reply: now, then two TATs per scope, as strings (bytes unless
    decode_responses), then the money's answer (integers) when it was asked and reached."""
    if not isinstance(reply, Sequence) or len(reply) < 1 + 2 * scopes:
        raise TypeError(f"unexpected reply from the rate-limit script: {reply!r}")
    now, *tats = (float(value) for value in reply[: 1 + 2 * scopes])
    money = reply[1 + 2 * scopes :]
    spent = Spent.of(money) if money else None
    return now, list(zip(tats[::2], tats[1::2], strict=True)), spent
