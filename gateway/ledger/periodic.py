"""Background work a ledger does on an interval (witnessing, timestamping): one round after
another, a failed round logged and never the end of the loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("thinkgate.ledger")


async def every(interval_s: float, work: Callable[[], Awaitable[None]], what: str) -> None:
    """Run ``work`` then sleep ``interval_s``, until cancelled."""
    while True:
        try:
            await work()
        except Exception:  # one bad round must not end the loop
            log.exception("%s round failed", what)
        await asyncio.sleep(interval_s)
