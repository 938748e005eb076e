"""``KeyLimiter`` and ``open_limiter`` (``gateway/admission/ratelimits.py``): a key's and its
tenant's limits both apply, a refusal is OpenAI's 429 (wording, ``retry-after``,
``x-ratelimit-*`` of the binding limit), settlement refunds the unused part (to the backend
that took the reservation, open circuit or not), and ``RATELIMIT_FAIL`` decides what a Redis
outage does. The contract tests run on the in-process backend and on Redis (a random key
prefix, the circuit ``closed`` so a Redis failure fails the test instead of falling back)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.admission.circuit import Circuit, redis_errors
from gateway.admission.ratelimits import KeyLimiter, open_limiter
from gateway.admission.redisconn import open_redis
from gateway.auth.keys import KeyInfo
from gateway.errors import RateLimited, ServiceUnavailable
from gateway.settings import Settings, TenantPolicy
from ratelimit.autopipe import AutoPipeline
from ratelimit.limits import MemoryBackend, RateLimitBackend, RedisBackend, Scope, Verdict
from ratelimit.money import Money
from tests.clock import FakeClock
from tests.gateway.admission.outage import Outage
from tests.ratelimit.test_autopipe import FakeRedis

LimiterFactory = Callable[..., KeyLimiter]
UNREACHABLE = "redis://127.0.0.1:1/0"


def key(tenant: str, rpm: int | None = None, tpm: int | None = None) -> KeyInfo:
    return KeyInfo(secrets.token_hex(6), tenant, "client", "hidden", rpm, tpm,
                   datetime.now(UTC), None, b"")  # fmt: skip


def tenant_settings(tenant: str, **limits: int) -> Settings:
    return Settings(tenants={tenant: TenantPolicy(**limits)})


@pytest.fixture
async def make_limiter(redis_at: tuple[str, str] | None) -> AsyncIterator[LimiterFactory]:
    """``make_limiter(settings)``: a ``KeyLimiter`` on either backend."""
    clients: list[AutoPipeline] = []
    url, prefix = redis_at or ("", "")

    def make(settings: Settings) -> KeyLimiter:
        redis = open_redis(Settings(redis_url=url)) if url else None
        if redis is None:
            return open_limiter(settings.admission, None)
        clients.append(redis)
        circuit: Circuit[RateLimitBackend] = Circuit(
            "rate limits", RedisBackend(redis, key_prefix=prefix), MemoryBackend(),
            fail="closed", errors=redis_errors())  # fmt: skip
        return KeyLimiter(circuit, settings)

    try:
        yield make
    finally:
        for client in clients:
            await client.aclose()


async def test_without_limits_nothing_is_counted_and_no_headers_are_sent(
    make_limiter: LimiterFactory,
) -> None:
    limiter = make_limiter(Settings())
    admission = await limiter.admit(key("acme"), 10**9)
    assert (admission.headers, admission.scopes, admission.reserved_tokens) == ((), (), 10**9)


async def test_a_keys_limit_refuses_with_openais_wording_and_headers(
    make_limiter: LimiterFactory,
) -> None:
    limiter, caller = make_limiter(Settings()), key("acme", rpm=2)
    first = await limiter.admit(caller, 5)
    assert dict(first.headers)["x-ratelimit-remaining-requests"] == "1"
    assert "x-ratelimit-limit-tokens" not in dict(first.headers)  # no tokens limit: no header
    await limiter.admit(caller, 5)
    with pytest.raises(RateLimited) as refused:
        await limiter.admit(caller, 5)
    error = refused.value
    assert (error.status, error.type, error.code) == (429, "requests", "rate_limit_exceeded")
    assert str(error).startswith(
        f"Rate limit reached for key {caller.key_id} on requests per min (RPM): "
        "Limit 2, Used 2, Requested 1. Please try again in "
    )
    headers = error.headers()
    assert 29 <= error.retry_after <= 30  # one request back of 2 per minute
    assert headers["retry-after"] == "30"
    assert 29_000 < int(headers["retry-after-ms"]) <= 30_000
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"


async def test_the_tenants_limit_applies_across_its_keys(make_limiter: LimiterFactory) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    limiter = make_limiter(tenant_settings(tenant, tpm=100))
    await limiter.admit(key(tenant, tpm=1000), 60)
    other = key(tenant, tpm=1000)  # its own limit has room; the tenant's has not
    with pytest.raises(RateLimited) as refused:
        await limiter.admit(other, 60)
    assert refused.value.type == "tokens"
    assert str(refused.value).startswith(
        f"Rate limit reached for organization {tenant} on tokens per min (TPM): "
        "Limit 100, Used 60, Requested 60."
    )
    assert refused.value.headers()["x-ratelimit-limit-tokens"] == "100"


async def test_all_or_nothing_a_refusal_takes_nothing_from_the_other_scope(
    make_limiter: LimiterFactory,
) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    limiter, caller = make_limiter(tenant_settings(tenant, tpm=1000)), key(tenant, tpm=100)
    with pytest.raises(RateLimited):
        await limiter.admit(caller, 150)
    admitted = await limiter.admit(key(tenant), 1000)  # the tenant's whole minute is still there
    assert dict(admitted.headers)["x-ratelimit-remaining-tokens"] == "0"


async def test_a_request_larger_than_the_limit_is_told_no_wait_helps(
    make_limiter: LimiterFactory,
) -> None:
    caller = key("acme", tpm=100)
    with pytest.raises(RateLimited) as refused:
        await make_limiter(Settings()).admit(caller, 101)
    assert str(refused.value) == (
        f"Request too large for key {caller.key_id} on tokens per min (TPM): Limit 100, "
        "Requested 101. Lower max_tokens or the prompt, or ask for a higher limit."
    )


async def test_the_headers_report_the_limit_with_the_least_left(
    make_limiter: LimiterFactory,
) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    limiter = make_limiter(tenant_settings(tenant, rpm=10, tpm=1000))
    headers = dict((await limiter.admit(key(tenant, rpm=100, tpm=300), 200)).headers)
    assert headers["x-ratelimit-limit-requests"] == "10"  # the tenant's: 9 left of 10
    assert headers["x-ratelimit-remaining-requests"] == "9"
    assert headers["x-ratelimit-limit-tokens"] == "300"  # the key's: 100 left of 300
    assert headers["x-ratelimit-remaining-tokens"] == "100"
    assert headers["x-ratelimit-reset-tokens"].endswith("s")


async def test_settle_refunds_the_unused_part_to_both_scopes(
    make_limiter: LimiterFactory,
) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    limiter = make_limiter(tenant_settings(tenant, tpm=1000))
    caller = key(tenant, tpm=500)
    await limiter.settle(await limiter.admit(caller, 400), used_tokens=100)
    after = dict((await limiter.admit(key(tenant), 100)).headers)
    assert after["x-ratelimit-remaining-tokens"] == "800"  # tenant: 1000 - 100 used - 100
    again = dict((await limiter.admit(caller, 300)).headers)
    assert again["x-ratelimit-remaining-tokens"] == "100"  # key: 500 - 100 used - 300


async def test_settle_never_refunds_more_than_was_reserved(make_limiter: LimiterFactory) -> None:
    limiter, caller = make_limiter(Settings()), key("acme", tpm=1000)
    first = await limiter.admit(caller, 300)
    await limiter.settle(first, used_tokens=500)  # used more than reserved: nothing back
    headers = dict((await limiter.admit(caller, 100)).headers)
    assert headers["x-ratelimit-remaining-tokens"] == "600"


@pytest.mark.parametrize("configured", ["open", "default"])
async def test_fail_open_falls_back_to_in_process_limits(
    configured: str, caplog: pytest.LogCaptureFixture
) -> None:
    fail: dict[str, Any] = {"ratelimit_fail": "open"} if configured == "open" else {}
    settings = Settings(redis_url=UNREACHABLE, **fail)
    redis = open_redis(settings.admission)
    assert redis is not None
    try:
        limiter, caller = open_limiter(settings.admission, redis), key("acme", rpm=1)
        admitted = await limiter.admit(caller, 1)
        assert dict(admitted.headers)["x-ratelimit-limit-requests"] == "1"
        assert limiter.circuit.degraded
        with pytest.raises(RateLimited):  # the in-process limit holds
            await limiter.admit(caller, 1)
    finally:
        await redis.aclose()
    assert "shared backend unreachable" in caplog.text


async def test_fail_closed_answers_service_unavailable() -> None:
    settings = Settings(redis_url=UNREACHABLE, ratelimit_fail="closed")
    redis = open_redis(settings.admission)
    assert redis is not None
    try:
        limiter = open_limiter(settings.admission, redis)
        for _ in range(2):  # the outage's first request, then one while it lasts
            with pytest.raises(ServiceUnavailable) as refused:
                await limiter.admit(key("acme", rpm=10), 1)
            assert refused.value.status == 503
    finally:
        await redis.aclose()


async def test_a_redis_that_hangs_costs_the_pipelines_timeout() -> None:
    """The process's client has no socket timeout of its own (it would wrap every write in a
    task): the auto-pipeline's per-exchange timeout is what bounds a Redis that stops
    answering, and the circuit's policy then takes over."""
    async with FakeRedis() as fake:
        redis = open_redis(Settings(redis_url=f"redis://127.0.0.1:{fake.port}/0").admission)
        assert redis is not None
        try:
            await redis.ping()
            fake.hang = True
            async with asyncio.timeout(5):  # unbounded, it would wait here for ever
                with pytest.raises(TimeoutError):
                    await redis.ping()
        finally:
            await redis.aclose()


# -- a refund goes to the backend that took the reservation -----------------------------------


class FlakyBackend(Outage):
    """In-process limits standing in for Redis, which can be away (``Outage``)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = MemoryBackend()

    async def reserve(
        self, tenant: str, scopes: Sequence[Scope], tokens: int, money: Money | None = None
    ) -> Verdict:
        self._asked("reserve")
        return await self.inner.reserve(tenant, scopes, tokens, money)

    async def refund(
        self, tenant: str, scopes: Sequence[Scope], tokens: int,
        counters: Sequence[str] = (), delta: int = 0,
    ) -> None:  # fmt: skip
        self._asked("refund")
        await self.inner.refund(tenant, scopes, tokens, counters, delta)

    async def spent(self, tenant: str, counters: Sequence[str]) -> list[int]:
        self._asked("spent")
        return await self.inner.spent(tenant, counters)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_refund_goes_to_the_backend_that_took_the_reservation() -> None:
    shared, local = FlakyBackend(), FlakyBackend()
    circuit: Circuit[RateLimitBackend] = Circuit(
        "rate limits", shared, local, fail="open", errors=redis_errors(), clock=FakeClock()
    )
    limiter, caller = KeyLimiter(circuit, Settings()), key("acme", tpm=1000)
    by_shared = await limiter.admit(caller, 400)
    shared.down = True
    by_local = await limiter.admit(caller, 400)  # the circuit opens: reserved in process
    shared.down = False  # back, but the circuit does not know yet
    await limiter.settle(by_shared, used_tokens=100)
    assert (shared.calls["refund"], local.calls["refund"]) == (1, 0)
    assert not circuit.degraded  # the shared backend answered: the outage is over
    await limiter.settle(by_local, used_tokens=100)
    assert (shared.calls["refund"], local.calls["refund"]) == (1, 1)
    again = dict((await limiter.admit(caller, 100)).headers)  # asks the shared backend again
    assert again["x-ratelimit-remaining-tokens"] == "800"  # 1000 - 100 used - 100 now


async def test_a_refund_the_reserving_backend_cannot_take_is_lost_not_misplaced() -> None:
    shared, local = FlakyBackend(), FlakyBackend()
    circuit: Circuit[RateLimitBackend] = Circuit(
        "rate limits", shared, local, fail="open", errors=redis_errors(), clock=FakeClock()
    )
    limiter = KeyLimiter(circuit, Settings())
    admitted = await limiter.admit(key("acme", tpm=1000), 400)
    shared.down = True
    await limiter.settle(admitted, used_tokens=100)  # no error: the tokens refill anyway
    assert (shared.calls["refund"], local.calls["refund"]) == (1, 0)
