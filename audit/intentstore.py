"""The intents' table and the replicas' heartbeats, read and claimed (``audit.intents``).

Inserting an intent and deleting it when its record commits belong to the writer's commit
(``audit.commit``); this module is what the beat and the sweep do around them:

- ``beat``: the replica's heartbeat, and the progress of its running exchanges (first token,
  tokens so far), one transaction;
- ``lost``: the intents whose owner has not beaten since ``cutoff`` (another replica's), and
  this replica's own that no running exchange holds any more (its record was refused);
- ``claim``: one intent moved to this replica, only while its owner is still presumed dead
  (exactly one claimer wins; this replica's beat covers it from then on), with its bytes and
  progress;
- ``forget_replicas``: heartbeat rows of replicas long gone that own no intent.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Container, Mapping
from dataclasses import dataclass

from sqlalchemy import and_, case, delete, exists, func, select, text, update

from audit.intents import Beat, Progress
from audit.record import Sealed
from audit.schema import intents, replicas
from audit.sqlasync import AsyncConnection, AsyncEngine

_UPSERT = text(
    "INSERT INTO ledger_replicas (id, heartbeat_at, started_at) VALUES (:id, :at, :started) "
    "ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at"
)


@dataclass(frozen=True, slots=True)
class Claimed:
    id: str
    request_id: str
    created_at: float
    sealed: Sealed
    progress: Progress


async def _beat(conn: AsyncConnection, beat: Beat) -> None:
    await conn.execute(_UPSERT, {"id": beat.replica, "at": beat.at, "started": beat.started_at})


@contextlib.asynccontextmanager
async def _autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose every statement is its own transaction: nothing here needs two
    statements to be atomic, and on SQLite a transaction held across the event loop's turns
    would hold the database's write lock that long (the ledger writer waits on it)."""
    async with engine.connect() as conn:
        yield await conn.execution_options(isolation_level="AUTOCOMMIT")


async def beat(engine: AsyncEngine, me: Beat, progress: Mapping[str, Progress]) -> None:
    async with _autocommit(engine) as conn:
        await _beat(conn, me)
        if progress:  # one statement for all of them
            told = {k: p.encode() for k, p in progress.items()}
            await conn.execute(
                update(intents)
                .where(intents.c.id.in_(list(told)), intents.c.owner == me.replica)
                .values(progress=case(told, value=intents.c.id))
            )


async def lost(
    engine: AsyncEngine, me: str, cutoff: float, running: Container[str]
) -> list[tuple[str, str]]:
    """``(intent id, owner)`` of every intent to recover: its owner's last beat is older than
    ``cutoff``, or it is this replica's own, older than ``cutoff``, and not ``running``."""
    stale_owner = exists().where(replicas.c.id == intents.c.owner, replicas.c.heartbeat_at < cutoff)
    mine = and_(intents.c.owner == me, intents.c.created_at < cutoff)
    query = select(intents.c.id, intents.c.owner).where(
        (intents.c.owner != me) & stale_owner | mine
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [(r.id, r.owner) for r in rows if r.owner != me or r.id not in running]


async def claim(
    engine: AsyncEngine, me: Beat, intent_id: str, owner: str, cutoff: float
) -> Claimed | None:
    """Move the intent to ``me`` if ``owner`` still owns it and (when another replica) still
    has not beaten since ``cutoff``; ``None`` when another claimer, or the owner's record,
    came first."""
    where = [intents.c.id == intent_id, intents.c.owner == owner]
    if owner != me.replica:
        where.append(exists().where(replicas.c.id == owner, replicas.c.heartbeat_at < cutoff))
    async with _autocommit(engine) as conn:
        await _beat(conn, me)  # first: the claim is covered by this replica's beat at once
        moved = await conn.execute(update(intents).where(*where).values(owner=me.replica))
        if not moved.rowcount:
            return None
        columns = (intents.c.request_id, intents.c.created_at, intents.c.header,
                   intents.c.ciphertext, intents.c.progress)  # fmt: skip
        row = (await conn.execute(select(*columns).where(intents.c.id == intent_id))).first()
    if row is None:  # its owner's record came between the claim and the read: it is done
        return None
    sealed = Sealed(bytes(row.header), bytes(row.ciphertext))
    return Claimed(intent_id, row.request_id, float(row.created_at), sealed,
                   Progress.decode(row.progress))  # fmt: skip


async def forget_replicas(engine: AsyncEngine, before: float) -> int:
    """Heartbeat rows older than ``before`` of replicas that own no intent."""
    owns = exists().where(intents.c.owner == replicas.c.id)
    async with _autocommit(engine) as conn:
        result = await conn.execute(delete(replicas).where(replicas.c.heartbeat_at < before, ~owns))
    return int(result.rowcount or 0)


async def pending(engine: AsyncEngine) -> int:
    """How many intents wait for their record (a gauge; also what tests look at)."""
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(intents))).scalar() or 0)
