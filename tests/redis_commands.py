"""Counting what a Redis client sends: how tests prove "one round trip per call"."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis


def count_commands(client: Redis, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commands ``client`` sends from now on (one each: no pipelines here)."""
    sent: list[str] = []
    execute = client.execute_command

    async def counting(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return await execute(*args, **options)

    monkeypatch.setattr(client, "execute_command", counting)
    return sent
