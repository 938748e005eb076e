"""Waiting on a condition with a deadline, for states that raise no event a test could await
(a database's rows, a writer's counters, a service coming back)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]], within_s: float = 15.0, every: float = 0.01
) -> None:
    """Return once ``condition()`` (sync or async) holds; ``TimeoutError`` after ``within_s``."""
    async with asyncio.timeout(within_s):
        while True:
            result = condition()
            if await result if inspect.isawaitable(result) else result:
                return
            await asyncio.sleep(every)
