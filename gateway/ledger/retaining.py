"""Retention on a schedule: every ``RETENTION_INTERVAL_S`` a replica runs one retention round
(``audit.ledger.Ledger.apply_retention``: the days past each tenant's retention destroyed
unless held, a signed record per tenant that lost any). Every replica runs it; a key is
destroyed, and recorded, by one of them (docs/records.md)."""

from __future__ import annotations

import logging

from audit.ledger import Ledger
from gateway.ledger.periodic import every

log = logging.getLogger("thinkgate.ledger")


async def retain_forever(ledger: Ledger, default_days: int | None, interval_s: float) -> None:
    async def round_() -> None:
        for run in await ledger.apply_retention(default_days):
            log.info("retention: tenant %s: %d data keys destroyed (days %s)%s", run.tenant,
                     len(run.dek_ids), ", ".join(run.periods),
                     f", held: {', '.join(run.kept_by)}" if run.kept_by else "")  # fmt: skip

    await every(interval_s, round_, "retention")
