"""Per-key and per-tenant rate limits behind the gateway's ``Limiter`` port
(``ratelimit.limits`` backends).

Rules:

- A key's ``rpm`` and ``tpm`` (``keys create --rpm/--tpm``) and its tenant's (``tenants.<name>``
  in the settings) are four buckets, checked and taken together in one backend call (one
  Redis round trip), all or nothing; unset or 0 is unlimited. A request costs 1 request and
  ``prompt estimate + max_tokens`` tokens (OpenAI's reservation rule). When it ends, the
  unused part of the reservation is refunded to both scopes (a second round trip, in the
  request's ``finally``), in the backend that took the reservation, whatever the circuit says
  by then (``gateway/admission/circuit.py``); a refund that backend cannot take (Redis away) is
  lost: the tokens refill by themselves.
- The headers report the binding limit of each kind: on a refusal the refusing one, else the
  one with the least left (``ratelimit.limits``).
- A refused request gets OpenAI's 429 body and headers: ``type`` ``requests`` or ``tokens``,
  code ``rate_limit_exceeded``, ``retry-after`` / ``retry-after-ms`` (the openai SDK's retry
  honours them), and the ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers,
  which every admitted response carries too.
- Redis failure (``RATELIMIT_FAIL``): the rule of ``gateway/admission/circuit.py``, shared with
  the KV budget.
- Budgets in money (``gateway.admission.spending``) are reserved in the same backend call (one
  script with Redis), all or nothing: a budget's refusal is its 429 ``budget_exceeded``, with
  the limits' headers; the settlement adds what the request cost less what it reserved, in the
  same call as the tokens' refund.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, cast

from audit.record import Usage
from gateway.admission.circuit import Circuit, redis_errors
from gateway.admission.limiter import Admission
from gateway.admission.spending import SpendAsk
from gateway.auth.keys import KeyInfo
from gateway.errors import RateLimited, ServiceUnavailable
from gateway.settings import AdmissionSettings
from ratelimit.limits import (
    Limits,
    MemoryBackend,
    RateLimitBackend,
    RedisBackend,
    Scope,
    Verdict,
    limited,
)

if TYPE_CHECKING:  # redis-py only where a client is made (REDIS_URL)
    from ratelimit.autopipe import AutoPipeline


class KeyLimiter:
    def __init__(self, limits: Circuit[RateLimitBackend], settings: AdmissionSettings) -> None:
        self.circuit = limits
        self._settings = settings

    def scopes(self, key: KeyInfo) -> tuple[Scope, ...]:
        """The limited scopes a key's requests count against: the key's, its tenant's."""
        tenant = self._settings.tenant(key.tenant)
        return tuple(limited([
            Scope(f"key:{key.key_id}", Limits(rpm=key.rpm or 0, tpm=key.tpm or 0)),
            Scope("tenant", Limits(rpm=tenant.rpm, tpm=tenant.tpm)),
        ]))  # fmt: skip

    def at_once(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission | None:
        if spend is None and not self.scopes(key):
            return Admission(key.key_id, key.tenant, tokens)
        return None

    async def admit(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission:
        scopes = self.scopes(key)  # once: ``at_once``'s rule, without building them twice
        if not scopes and spend is None:
            return Admission(key.key_id, key.tenant, tokens)
        money = None if spend is None else spend.money

        async def reserve(backend: RateLimitBackend) -> tuple[Verdict, RateLimitBackend]:
            return await backend.reserve(key.tenant, scopes, tokens, money), backend

        verdict, backend = await self.circuit.call(reserve)
        headers = rate_headers(verdict)
        if spend is not None and verdict.spent is not None:
            if verdict.spent.refused:
                raise spend.refusal(verdict.spent).with_headers(headers)
            spend.granted(verdict.spent)
        if not verdict.allowed:
            raise refusal(verdict, key, tokens, headers)
        return Admission(key.key_id, key.tenant, tokens, headers, scopes, backend, spend)

    async def settle(
        self, admission: Admission, used_tokens: int, usage: Usage | None = None
    ) -> None:
        """Refund the unused tokens, and the money the request did not cost, to the backend
        that took them (one call)."""
        unused = max(admission.reserved_tokens - used_tokens, 0)
        scopes = [s for s in admission.scopes if s.limits.tpm] if unused else []
        spend, counters, delta = admission.spend, cast(tuple[str, ...], ()), 0
        if spend is not None:
            counters, delta = spend.money.counters, spend.cost(usage) - spend.money.amount
        if (scopes or delta) and admission.backend is not None:
            tenant = admission.tenant
            with contextlib.suppress(ServiceUnavailable):  # Redis is away: the tokens refill
                await self.circuit.call_on(admission.backend, lambda b: b.refund(
                    tenant, scopes, unused, counters, delta))  # fmt: skip


def rate_headers(verdict: Verdict) -> tuple[tuple[str, str], ...]:
    """OpenAI's ``x-ratelimit-*`` headers for the binding limits that exist."""
    out: list[tuple[str, str]] = []
    for name, bucket in (("requests", verdict.requests), ("tokens", verdict.tokens)):
        if bucket.limit:
            out += [
                (f"x-ratelimit-limit-{name}", str(bucket.limit)),
                (f"x-ratelimit-remaining-{name}", str(max(0, bucket.decision.remaining))),
                (f"x-ratelimit-reset-{name}", duration(bucket.decision.reset_s)),
            ]
    return tuple(out)


def refusal(
    verdict: Verdict, key: KeyInfo, tokens: int, headers: tuple[tuple[str, str], ...]
) -> RateLimited:
    """OpenAI's wording: "Rate limit reached for <whom> on <limit>: Limit L, Used U, Requested
    R. Please try again in T." (key ids and tenant names are the caller's own, not secrets)."""
    name = verdict.denied_by or "requests"
    bucket = verdict.tokens if name == "tokens" else verdict.requests
    decision, limit = bucket.decision, bucket.limit
    unit = "tokens per min (TPM)" if name == "tokens" else "requests per min (RPM)"
    whom = f"organization {key.tenant}" if bucket.scope == "tenant" else f"key {key.key_id}"
    requested = tokens if name == "tokens" else 1
    used = max(0, limit - decision.remaining)
    if decision.exceeds_limit:  # no wait helps: say so, as OpenAI does
        message = (
            f"Request too large for {whom} on {unit}: Limit {limit}, Requested {requested}. "
            "Lower max_tokens or the prompt, or ask for a higher limit."
        )
    else:
        message = (
            f"Rate limit reached for {whom} on {unit}: Limit {limit}, Used {used}, "
            f"Requested {requested}. Please try again in {duration(decision.retry_after_s)}."
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


def open_limiter(settings: AdmissionSettings, redis: AutoPipeline | None) -> KeyLimiter:
    """In-process limits without Redis; shared Redis limits (on the process's one client,
    ``gateway.admission.redisconn``) with it."""
    if redis is None:
        local = MemoryBackend()
        return KeyLimiter(Circuit("rate limits", local, local, fail="open", errors=()), settings)
    circuit: Circuit[RateLimitBackend] = Circuit(
        "rate limits", RedisBackend(redis), MemoryBackend(), fail=settings.ratelimit_fail,
        errors=redis_errors(),
    )  # fmt: skip
    return KeyLimiter(circuit, settings)
