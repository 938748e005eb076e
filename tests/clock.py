"""A clock a test moves by hand (``clock.now += 1``), for sans-I/O code that takes a clock."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
