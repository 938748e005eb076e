"""Retention for what the gateway keeps besides the ledger (stored responses, conversations,
background responses): each store's ``purge`` run every ten minutes, forever.

A database that is away skips a round (logged with the error's type only); rows past their
expiry are never served in the meantime, since every lookup filters on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("thinkgate")
EVERY_S = 600.0


async def purge_forever(
    purge: Callable[[], Awaitable[int]], what: str, every_s: float = EVERY_S
) -> None:
    """``purge()`` (how many rows went) every ``every_s``; ``what`` names them in the log."""
    while True:
        try:
            purged = await purge()
        except (SQLAlchemyError, OSError) as exc:  # the database is away: next round
            log.warning("purging %s failed: %s", what, type(exc).__name__)
        else:
            if purged:
                log.info("purged %d expired %s", purged, what)
        await asyncio.sleep(every_s)
