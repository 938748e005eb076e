"""Redis for the rate-limit suites, shared with nobody: each test gets its own key prefix and
deletes only the keys under it, so nothing global (no FLUSHDB) touches other tests' data.

Like ``tests/conftest.py``: skip with a clear reason when Redis is unreachable, fail when ``CI``
is set (DESIGN §4).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.settings import Settings


@pytest.fixture
def key_prefix() -> str:
    return f"test:{secrets.token_hex(6)}:"


@pytest.fixture
async def redis_url(key_prefix: str) -> AsyncIterator[str]:
    """``TEST_REDIS_URL`` once Redis answers; at teardown, the keys under ``key_prefix`` go."""
    url = Settings().test_redis_url
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        await client.ping()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        await client.aclose()
        message = f"Redis is not reachable ({type(exc).__name__}); start it or see .ci/run"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield url
    finally:
        keys = [key async for key in client.scan_iter(match=f"{key_prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()
