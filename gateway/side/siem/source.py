"""What the SIEM export reads: committed rows of the ledger itself, which is its spool.

Nothing is queued in memory or on disk for the export: a round reads the latest checkpoint and
the rows below it from ``ledger_entries`` (headers and leaf hashes, never the ciphertext), so
the request path does no work for it, and a round always starts from what the database holds.
Only rows a checkpoint covers are exported (``idx < size``): each event then names a signed
tree head that includes it. With ``CHECKPOINT_INTERVAL_MS`` that delays an event until the next
checkpoint; with the default (one per commit) it delays nothing.
"""

from __future__ import annotations

from sqlalchemy import select

from audit.schema import checkpoints, entries
from audit.sqlasync import AsyncConnection
from gateway.side.siem.ocsf import LedgerRow, TreeHead


async def tree_head(conn: AsyncConnection) -> TreeHead | None:
    """The latest checkpoint's size and root, ``None`` before the first."""
    query = (
        select(checkpoints.c.size, checkpoints.c.root).order_by(checkpoints.c.size.desc()).limit(1)
    )
    row = (await conn.execute(query)).first()
    return None if row is None else TreeHead(int(row.size), bytes(row.root))


async def ledger_rows(conn: AsyncConnection, start: int, stop: int) -> list[LedgerRow]:
    """The rows with ``start <= idx < stop``, by index."""
    query = (
        select(entries.c.idx, entries.c.header, entries.c.leaf_hash)
        .where(entries.c.idx >= start, entries.c.idx < stop)
        .order_by(entries.c.idx)
    )
    return [LedgerRow(int(r.idx), bytes(r.header), bytes(r.leaf_hash))
            for r in await conn.execute(query)]  # fmt: skip
