"""Where the SIEM export stands, and which replica runs it: one row in the gateway's database.

``gateway_siem_export`` (migration 0005) has one row per export (``name``; there is one,
``siem``): ``next_index``, the first ledger index not yet accepted by every sink, and the
lease, ``holder`` (a replica's id) and ``lease_until`` (its wall clock, seconds).

Rules:

- **One exporter at a time, by lease.** ``claim`` takes the lease when it is free or expired,
  or renews it when this replica holds it, in one conditional ``UPDATE`` (atomic on SQLite and
  PostgreSQL alike, so two replicas cannot both win it), and says where to resume. A lease row
  rather than PostgreSQL's advisory lock: it works the same on SQLite, it needs no connection
  held for as long as the export runs, and it survives a database failover.
- **The cursor only moves forward, and only for its holder.** ``advance`` is a compare-and-set
  on ``(holder, next_index)``: a replica that lost its lease (it stalled past ``lease_until``
  and another took over) cannot move the cursor, back or forth. Two replicas sending the same
  batch (a stall, or clocks further apart than the lease) cost duplicates, never a loss: the
  cursor moves only after a batch was delivered.
- ``release`` ends the lease at once (a clean shutdown), so a restarted or another replica
  resumes without waiting for it to expire; a replica that dies keeps it for ``lease_s``.
- Replicas' clocks should agree to well within ``lease_s`` (NTP does); the lease is compared
  against the claiming replica's own clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import BigInteger, Column, Float, String, Table, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from audit.sqlasync import AsyncEngine
from gateway.db import metadata

EXPORT = "siem"

siem_export = Table(
    "gateway_siem_export",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("next_index", BigInteger, nullable=False),
    Column("holder", String(128), nullable=False),
    Column("lease_until", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)


class ExportCursor:
    """The export's row, as seen by one replica (``holder``)."""

    def __init__(self, engine: AsyncEngine, holder: str, lease_s: float,
                 clock: Callable[[], float] = time.time, name: str = EXPORT) -> None:  # fmt: skip
        self._engine = engine
        self.holder = holder
        self.lease_s = lease_s
        self._clock = clock
        self._name = name

    async def claim(self) -> int | None:
        """Take or renew the lease: the next index to export if this replica holds it now,
        ``None`` if another does. The first claim ever creates the row at index 0."""
        now = self._clock()
        t = siem_export.c
        renew = (
            update(siem_export)
            .where(t.name == self._name, or_(t.holder == self.holder, t.lease_until < now))
            .values(holder=self.holder, lease_until=now + self.lease_s, updated_at=now)
        )
        async with self._engine.begin() as conn:
            if (await conn.execute(renew)).rowcount == 1:
                found = await conn.execute(select(t.next_index).where(t.name == self._name))
                return int(found.scalar_one())
            exists = await conn.execute(select(t.name).where(t.name == self._name))
            if exists.first() is not None:
                return None
        return 0 if await self._create(now) else None

    async def _create(self, now: float) -> bool:
        row = {"name": self._name, "next_index": 0, "holder": self.holder,
               "lease_until": now + self.lease_s, "updated_at": now}  # fmt: skip
        try:
            async with self._engine.begin() as conn:
                await conn.execute(insert(siem_export).values(**row))
        except IntegrityError:  # another replica created it first
            return False
        return True

    async def advance(self, old: int, new: int) -> bool:
        """Move the cursor from ``old`` to ``new``; ``False`` if this replica no longer holds
        the lease or the cursor is not at ``old`` (another replica moved it)."""
        t = siem_export.c
        moved = (
            update(siem_export)
            .where(t.name == self._name, t.holder == self.holder, t.next_index == old)
            .values(next_index=new, updated_at=self._clock())
        )
        async with self._engine.begin() as conn:
            return bool((await conn.execute(moved)).rowcount == 1)

    async def release(self) -> None:
        """End this replica's lease now (another may claim at once)."""
        t = siem_export.c
        ended = (
            update(siem_export)
            .where(t.name == self._name, t.holder == self.holder)
            .values(lease_until=0.0, updated_at=self._clock())
        )
        async with self._engine.begin() as conn:
            await conn.execute(ended)

    async def position(self) -> tuple[int, str, float] | None:
        """``(next_index, holder, lease_until)``, or ``None`` before the first claim."""
        t = siem_export.c
        query = select(t.next_index, t.holder, t.lease_until).where(t.name == self._name)
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return None if row is None else (int(row[0]), str(row[1]), float(row[2]))
