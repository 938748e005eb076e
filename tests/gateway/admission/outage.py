"""A shared backend's outage, for test stand-ins of Redis: while ``down``, every operation fails
as a Redis that is away would; ``calls`` counts each operation asked for, failed or not."""

from __future__ import annotations

from collections import Counter

from redis.exceptions import ConnectionError as RedisConnectionError


class Outage:
    def __init__(self) -> None:
        self.down = False
        self.calls: Counter[str] = Counter()

    def _asked(self, operation: str) -> None:
        self.calls[operation] += 1
        if self.down:
            raise RedisConnectionError("away")
