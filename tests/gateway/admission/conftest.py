"""Fixtures the admission tests share: each contract runs on the in-process backends and on
real Redis."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["memory", "redis"])
def redis_at(request: pytest.FixtureRequest) -> tuple[str, str] | None:
    """Redis's URL and this test's key prefix, or ``None`` for the in-process backends."""
    if request.param == "memory":
        return None
    return request.getfixturevalue("redis_url"), request.getfixturevalue("key_prefix")
