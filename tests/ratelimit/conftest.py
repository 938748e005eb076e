"""The rate-limit suites' backends: each contract test runs on the in-process backend (a fake
clock) and on real Redis. The Redis fixtures themselves (``redis_url``, ``key_prefix``) live in
``tests/conftest.py``: the gateway's end-to-end tests need them too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as redis

from ratelimit.limits import MemoryBackend, RateLimitBackend, RedisBackend
from tests.clock import FakeClock


def redis_client(url: str) -> redis.Redis:
    """A client whose pool really spreads concurrent calls over several connections."""
    return redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, max_connections=32))


@pytest.fixture(params=["memory", "redis"])
def make_backend(request: pytest.FixtureRequest) -> Callable[[], RateLimitBackend]:
    if request.param == "memory":
        return lambda: MemoryBackend(clock=FakeClock())
    url: str = request.getfixturevalue("redis_url")
    prefix: str = request.getfixturevalue("key_prefix")
    return lambda: RedisBackend(redis_client(url), key_prefix=prefix)


@pytest.fixture
async def backend(make_backend: Callable[[], RateLimitBackend]) -> AsyncIterator[RateLimitBackend]:
    backend = make_backend()
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.Redis]:
    client = redis_client(redis_url)
    try:
        yield client
    finally:
        await client.aclose()
