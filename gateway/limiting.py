"""Per-key rate limits behind the gateway's ``Limiter`` port (``ratelimit.limits`` backends).

Rules:

- A key's ``rpm`` and ``tpm`` (``keys create --rpm/--tpm``; unset or 0 = unlimited) are two
  buckets checked and taken together in one backend call (one Redis round trip): a request
  costs 1 request and ``prompt estimate + max_tokens`` tokens (OpenAI's reservation rule). When
  it ends, the unused part of the reservation is refunded (a second round trip, off the
  response's critical path only in that it happens in ``finally``).
- A refused request gets OpenAI's 429 body and headers: ``type`` ``requests`` or ``tokens``,
  code ``rate_limit_exceeded``, ``retry-after`` / ``retry-after-ms`` (the openai SDK's retry
  honours them), and the ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers,
  which every admitted response carries too.
- Redis failure (``RATELIMIT_FAIL``): the rule of ``gateway/circuit.py``, shared with the KV
  budget.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.circuit import Circuit
from gateway.errors import RateLimited
from gateway.keys import KeyInfo
from gateway.ports import Admission
from gateway.settings import Settings
from ratelimit.limits import Limits, MemoryBackend, RateLimitBackend, Verdict


class KeyLimiter:
    def __init__(self, limits: Circuit[RateLimitBackend]) -> None:
        self._limits = limits

    async def admit(self, key: KeyInfo, tokens: int) -> Admission:
        limits = Limits(rpm=key.rpm or 0, tpm=key.tpm or 0)
        if not (limits.rpm or limits.tpm):
            return Admission(key.key_id, key.tenant, tokens)
        scope = f"key:{key.key_id}"
        verdict = await self._limits.call(lambda b: b.reserve(scope, key.tenant, limits, tokens))
        headers = rate_headers(verdict, limits)
        if not verdict.allowed:
            raise refusal(verdict, limits, tokens, headers)
        return Admission(key.key_id, key.tenant, tokens, headers, limits.tpm)

    async def settle(self, admission: Admission, used_tokens: int) -> None:
        unused = admission.reserved_tokens - used_tokens
        if admission.tokens_per_minute and unused > 0:
            limits = Limits(rpm=0, tpm=admission.tokens_per_minute)
            scope, tenant = f"key:{admission.key_id}", admission.tenant
            await self._limits.call(lambda b: b.refund(scope, tenant, limits, unused))

    async def aclose(self) -> None:
        await self._limits.shared.aclose()


def rate_headers(verdict: Verdict, limits: Limits) -> tuple[tuple[str, str], ...]:
    """OpenAI's ``x-ratelimit-*`` headers for the limits that exist."""
    out: list[tuple[str, str]] = []
    for name, limit, decision in (
        ("requests", limits.rpm, verdict.requests),
        ("tokens", limits.tpm, verdict.tokens),
    ):
        if limit:
            out += [
                (f"x-ratelimit-limit-{name}", str(limit)),
                (f"x-ratelimit-remaining-{name}", str(max(0, decision.remaining))),
                (f"x-ratelimit-reset-{name}", duration(decision.reset_s)),
            ]
    return tuple(out)


def refusal(
    verdict: Verdict, limits: Limits, tokens: int, headers: tuple[tuple[str, str], ...]
) -> RateLimited:
    name = verdict.denied_by or "requests"
    decision = verdict.tokens if name == "tokens" else verdict.requests
    limit, unit = (limits.tpm, "tokens per min (TPM)") if name == "tokens" else (
        limits.rpm, "requests per min (RPM)")  # fmt: skip
    requested = tokens if name == "tokens" else 1
    used = max(0, limit - decision.remaining)
    if decision.exceeds_limit:  # no wait helps: say so, as OpenAI does
        message = (
            f"Request too large on {unit}: Limit {limit}, Requested {requested}. "
            "Lower max_tokens or the prompt, or ask for a higher limit."
        )
    else:
        message = (
            f"Rate limit reached on {unit}: Limit {limit}, Used {used}, Requested {requested}. "
            f"Please try again in {duration(decision.retry_after_s)}."
        )
    return RateLimited(message, retry_after=decision.retry_after_s, limit_type=name,
                       headers=dict(headers))  # fmt: skip


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``120ms``."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    rest_text = f"{rest:.3g}s" if rest != int(rest) else f"{int(rest)}s"
    return f"{int(minutes)}m{rest_text}" if minutes else rest_text


def redis_client(url: str) -> Any:
    """A client whose pool waits (briefly) for a free connection rather than failing past 100:
    a burst of admissions must not look like a Redis outage."""
    import redis.asyncio as redis

    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=256, timeout=0.5, socket_connect_timeout=0.5, socket_timeout=0.5
    )
    return redis.Redis.from_pool(pool)  # the client owns the pool: closing it closes them all


def open_limiter(settings: Settings) -> KeyLimiter:
    """In-process limits without ``REDIS_URL``; shared Redis limits with it. Short socket
    timeouts: a Redis that hangs must cost a request milliseconds, not seconds, before the
    ``RATELIMIT_FAIL`` policy takes over."""
    if not settings.redis_url:
        local = MemoryBackend()
        return KeyLimiter(Circuit("rate limits", local, local, fail="open", errors=()))
    from redis.exceptions import RedisError

    from ratelimit.limits import RedisBackend

    client = redis_client(settings.redis_url)
    circuit: Circuit[RateLimitBackend] = Circuit(
        "rate limits", RedisBackend(client), MemoryBackend(), fail=settings.ratelimit_fail,
        errors=(RedisError, OSError, TimeoutError),
    )  # fmt: skip
    return KeyLimiter(circuit)
