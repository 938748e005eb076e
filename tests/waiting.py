"""Waiting on a condition with a deadline, for states that raise no event a test could await
(a database's rows, a writer's counters, a service coming back)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any


async def eventually(
    condition: Callable[[], Any], within_s: float = 15.0, every: float = 0.01
) -> Any:
    """Return ``condition()``'s first truthy result (sync or async); ``TimeoutError`` after
    ``within_s``."""
    async with asyncio.timeout(within_s):
        while True:
            result = condition()
            value = await result if inspect.isawaitable(result) else result
            if value:
                return value
            await asyncio.sleep(every)
