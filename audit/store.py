"""The ledger's read queries (SQLAlchemy 2 Core, async; SQLite and PostgreSQL alike), and what
a database failure looks like. The one write path is the sequencer's commit script
(``audit.commit``), run by a driver (``audit.drivers``) under the ledger's write lock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, false, func, or_, select
from sqlalchemy.exc import SQLAlchemyError

from audit.commit import Statements, node_lookup
from audit.drivers import DatabaseError
from audit.merkle import NodeID
from audit.schema import checkpoints, cosignatures, entries, nodes, timestamps
from audit.sqlasync import AsyncConnection

# What "the database is away" looks like: SQLAlchemy wraps driver errors; the commit drivers
# raise sqlite3's own and DatabaseError (asyncpg's); a refused or reset connection surfaces as
# OSError, a connect or pool timeout as TimeoutError.
DB_ERRORS = (SQLAlchemyError, OSError, TimeoutError, sqlite3.Error, DatabaseError)


async def tree_size(conn: AsyncConnection) -> int:
    last = (await conn.execute(select(func.max(entries.c.idx)))).scalar()
    return 0 if last is None else int(last) + 1


async def node_hashes(conn: AsyncConnection, ids: Iterable[NodeID]) -> dict[NodeID, bytes]:
    """The stored hashes of ``ids`` (absent ones are left out), in one query. Driver SQL:
    building and compiling a fresh 20-term Core expression cost ~2 ms, more than the query."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    query = node_lookup(Statements(conn.dialect.paramstyle), wanted)
    result = await conn.exec_driver_sql(query.sql, query.params)
    return {NodeID(r.level, r.idx): bytes(r.hash) for r in result}


async def level_hashes(conn: AsyncConnection, level: int, start: int, count: int) -> list[bytes]:
    """The stored node hashes at ``level`` with indexes ``start`` to ``start + count - 1``, in
    order (fewer if they are not all stored)."""
    query = (
        select(nodes.c.hash)
        .where(nodes.c.level == level, nodes.c.idx >= start, nodes.c.idx < start + count)
        .order_by(nodes.c.idx)
    )
    return [bytes(h) for h in (await conn.execute(query)).scalars()]


async def leaf_data(conn: AsyncConnection, start: int, count: int) -> list[tuple[int, bytes]]:
    """``(index, len(header) || header || ciphertext)`` of entries ``start`` to
    ``start + count - 1`` (``audit.record.Sealed.leaf_data``)."""
    query = (
        select(entries.c.idx, entries.c.header, entries.c.ciphertext)
        .where(entries.c.idx >= start, entries.c.idx < start + count)
        .order_by(entries.c.idx)
    )
    rows = await conn.execute(query)
    return [(int(r.idx), len(r.header).to_bytes(4, "big") + bytes(r.header) + bytes(r.ciphertext))
            for r in rows]  # fmt: skip


async def checkpoints_from(
    conn: AsyncConnection, size: int, limit: int
) -> list[tuple[int, float, str]]:
    """``(size, created_at, note)`` of the stored checkpoints of ``size`` or larger, smallest
    first, at most ``limit``."""
    query = (
        select(checkpoints.c.size, checkpoints.c.created_at, checkpoints.c.note)
        .where(checkpoints.c.size >= size)
        .order_by(checkpoints.c.size)
        .limit(limit)
    )
    return [(int(r.size), float(r.created_at), str(r.note)) for r in await conn.execute(query)]


async def cosignature_lines(conn: AsyncConnection, size: int) -> list[str]:
    """The witnesses' cosignature lines stored for the checkpoint of ``size``, by witness."""
    query = (select(cosignatures.c.line).where(cosignatures.c.size == size)
             .order_by(cosignatures.c.witness))  # fmt: skip
    return [str(line) for line in (await conn.execute(query)).scalars()]


async def timestamp_replies(conn: AsyncConnection, sizes: Iterable[int]) -> dict[int, bytes]:
    """The stored RFC 3161 replies of the checkpoints of ``sizes``."""
    wanted = sorted(set(sizes))
    if not wanted:
        return {}
    query = select(timestamps.c.size, timestamps.c.reply).where(timestamps.c.size.in_(wanted))
    return {int(r.size): bytes(r.reply) for r in await conn.execute(query)}


async def all_timestamps(conn: AsyncConnection) -> list[tuple[int, bytes, str]]:
    """``(size, reply, checkpoint note)`` of every stamped checkpoint, by size."""
    query = (select(timestamps.c.size, timestamps.c.reply, checkpoints.c.note)
             .join(checkpoints, checkpoints.c.size == timestamps.c.size)
             .order_by(timestamps.c.size))  # fmt: skip
    return [(int(r.size), bytes(r.reply), str(r.note)) for r in await conn.execute(query)]


async def first_checkpoint(conn: AsyncConnection) -> str | None:
    query = select(checkpoints.c.note).order_by(checkpoints.c.size).limit(1)
    return (await conn.execute(query)).scalar()


async def latest_checkpoint(conn: AsyncConnection) -> str | None:
    query = select(checkpoints.c.note).order_by(checkpoints.c.size.desc()).limit(1)
    return (await conn.execute(query)).scalar()


async def published_checkpoint(
    conn: AsyncConnection, witnesses: Iterable[str], quorum: int, stamped: bool
) -> str | None:
    """The newest checkpoint with cosignatures by ``quorum`` of ``witnesses`` (by name; the
    lines were verified before they were stored) and, if ``stamped``, an RFC 3161 timestamp."""
    query = select(checkpoints.c.note)
    if quorum:
        cosigned = (
            select(cosignatures.c.size)
            .where(cosignatures.c.witness.in_(sorted(set(witnesses))))
            .group_by(cosignatures.c.size)
            .having(func.count() >= quorum)
        )
        query = query.where(checkpoints.c.size.in_(cosigned))
    if stamped:
        query = query.where(checkpoints.c.size.in_(select(timestamps.c.size)))
    query = query.order_by(checkpoints.c.size.desc()).limit(1)
    return (await conn.execute(query)).scalar()


async def checkpoint_at(conn: AsyncConnection, size: int) -> str | None:
    query = select(checkpoints.c.note).where(checkpoints.c.size == size)
    return (await conn.execute(query)).scalar()


@dataclass(frozen=True, slots=True)
class Filter:
    tenant: str | None = None
    key_id: str | None = None
    request_id: str | None = None
    model: str | None = None
    status: str | None = None
    kind: str | None = None
    since: float | None = None
    until: float | None = None
    after: int | None = None  # cursor: the last index of the previous page
    up_to: int | None = None  # only indexes below this (a checkpoint's size)


def _conditions(f: Filter) -> list[ColumnElement[bool]]:
    c = entries.c
    equal = [(c.tenant, f.tenant), (c.key_id, f.key_id), (c.request_id, f.request_id),
             (c.model, f.model), (c.status, f.status), (c.kind, f.kind)]  # fmt: skip
    out: list[ColumnElement[bool]] = [col == v for col, v in equal if v is not None]
    if f.since is not None:
        out.append(c.created_at >= f.since)
    if f.until is not None:
        out.append(c.created_at < f.until)
    if f.after is not None:
        out.append(c.idx > f.after)
    if f.up_to is not None:
        out.append(c.idx < f.up_to)
    return out


async def find(conn: AsyncConnection, f: Filter, limit: int) -> list[tuple[int, bytes, bytes]]:
    """``(index, header, leaf_hash)`` of matching entries, by index, at most ``limit``."""
    query = (
        select(entries.c.idx, entries.c.header, entries.c.leaf_hash)
        .where(*_conditions(f))
        .order_by(entries.c.idx)
        .limit(limit)
    )
    return [(int(r.idx), bytes(r.header), bytes(r.leaf_hash)) for r in await conn.execute(query)]


async def last_index(conn: AsyncConnection, f: Filter) -> int | None:
    """The largest index of the entries ``f`` matches (``None``: none does)."""
    last = (await conn.execute(select(func.max(entries.c.idx)).where(*_conditions(f)))).scalar()
    return None if last is None else int(last)


async def entry(conn: AsyncConnection, index: int) -> tuple[bytes, bytes, bytes] | None:
    """``(header, ciphertext, leaf_hash)`` of one entry."""
    query = select(entries.c.header, entries.c.ciphertext, entries.c.leaf_hash).where(
        entries.c.idx == index
    )
    row = (await conn.execute(query)).first()
    return None if row is None else (bytes(row.header), bytes(row.ciphertext), bytes(row.leaf_hash))


def nodes_completed_by(first: int, end: int) -> ColumnElement[bool]:
    """A condition for every stored node completed by appending leaves ``[first, end)``, that
    is whose last leaf lies there: one index range per level, so each part uses the key."""
    parts = []
    level = 0
    while (1 << level) <= end:
        lo, hi = ((first + (1 << level)) >> level) - 1, end >> level
        if lo < hi:
            parts.append(and_(nodes.c.level == level, nodes.c.idx >= lo, nodes.c.idx < hi))
        level += 1
    return or_(false(), *parts)
