"""The ledger's queries (SQLAlchemy 2 Core, async; SQLite and PostgreSQL alike).

Reads are plain; the one write path is ``append`` inside a ``sequencing`` transaction, which
holds the ledger's single-writer lock: a transaction-scoped PostgreSQL advisory lock (so several
gateway replicas may write to one database, one sequencer at a time), or SQLite's own write
lock taken up front with ``BEGIN IMMEDIATE`` (so the size read and the inserts cannot race
another process).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, false, func, or_, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from audit.merkle import NodeID
from audit.record import Header
from audit.schema import checkpoints, entries, nodes

SEQUENCER_LOCK = 0x7467_6C65_6467_7371  # "tgledgsq"

# What "the database is away" looks like: SQLAlchemy wraps driver errors, a refused or reset
# connection surfaces as OSError, a connect or pool timeout as TimeoutError.
DB_ERRORS = (SQLAlchemyError, OSError, TimeoutError)


@contextlib.asynccontextmanager
async def sequencing(conn: AsyncConnection) -> AsyncIterator[AsyncConnection]:
    """A transaction on ``conn`` that holds the ledger's write lock; commits on success."""
    if conn.dialect.name == "sqlite":
        await conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SEQUENCER_LOCK})
    try:
        yield conn
    except BaseException:
        await conn.rollback()
        raise
    await conn.commit()


async def tree_size(conn: AsyncConnection) -> int:
    last = (await conn.execute(select(func.max(entries.c.idx)))).scalar()
    return 0 if last is None else int(last) + 1


async def node_hashes(conn: AsyncConnection, ids: Iterable[NodeID]) -> dict[NodeID, bytes]:
    """The stored hashes of ``ids`` (absent ones are left out), in one query.

    Written as driver SQL: one equality pair per node, OR'ed, which both databases answer from
    the primary key (SQLite scans the whole table for a row-value ``IN`` list: 200 ms at a
    million records), and without Core, whose building and compiling of a fresh 20-term
    expression cost more than the query (~2 ms) on a proof's hot path."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    marks = _marks(conn.dialect.paramstyle, 2 * len(wanted))
    where = " OR ".join(f"(level = {marks[2 * k]} AND idx = {marks[2 * k + 1]})"
                        for k in range(len(wanted)))  # fmt: skip
    params = tuple(v for n in wanted for v in (n.level, n.index))
    result = await conn.exec_driver_sql(
        f"SELECT level, idx, hash FROM ledger_nodes WHERE {where}", params
    )
    return {NodeID(r.level, r.idx): bytes(r.hash) for r in result}


async def stored_pairs(
    conn: AsyncConnection, pairs: Sequence[tuple[str, int]]
) -> set[tuple[str, int]]:
    """Which ``(writer, sequence)`` pairs the ledger already holds (replay deduplication)."""
    found: set[tuple[str, int]] = set()
    for start in range(0, len(pairs), 500):
        chunk = pairs[start : start + 500]
        query = select(entries.c.writer, entries.c.sequence).where(
            or_(*(and_(entries.c.writer == w, entries.c.sequence == q) for w, q in chunk))
        )
        found.update((r.writer, int(r.sequence)) for r in await conn.execute(query))
    return found


@dataclass(frozen=True, slots=True)
class EntryRow:
    index: int
    header: Header
    header_bytes: bytes
    ciphertext: bytes
    leaf_hash: bytes


_ENTRY_COLUMNS = ("idx", "writer", "sequence", "kind", "tenant", "key_id", "request_id",
                  "model", "status", "created_at", "header", "ciphertext", "leaf_hash")  # fmt: skip


def entry_values(row: EntryRow) -> tuple[object, ...]:
    h = row.header
    return (row.index, h.writer, h.sequence, h.kind, h.tenant, h.key_id, h.request_id, h.model,
            h.status, h.created_at, row.header_bytes, row.ciphertext, row.leaf_hash)  # fmt: skip


def _marks(paramstyle: str, count: int) -> list[str]:
    """``count`` positional placeholders in the driver's own style."""
    if paramstyle == "qmark":
        return ["?"] * count
    if paramstyle in ("numeric_dollar", "numeric"):
        sign = "$" if paramstyle == "numeric_dollar" else ":"
        return [f"{sign}{i}" for i in range(1, count + 1)]
    return ["%s"] * count


def _insert_sql(paramstyle: str, table: str, columns: Sequence[str]) -> str:
    marks = ", ".join(_marks(paramstyle, len(columns)))
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


async def _insert_many(
    conn: AsyncConnection, table: str, columns: Sequence[str], rows: list[tuple[object, ...]]
) -> None:
    """Bulk insert through the driver's own ``executemany``: the batch is the hot path of the
    ledger (thousands of rows per second), and Core's per-row parameter processing costs
    several times the insert itself here. Values are bytes, str, int and float, which both
    drivers bind natively."""
    dialect = conn.dialect
    sql = _insert_sql(dialect.paramstyle, table, columns)
    await conn.exec_driver_sql(sql, rows)


async def append(
    conn: AsyncConnection,
    rows: Sequence[EntryRow],
    new_nodes: Sequence[tuple[NodeID, bytes]],
    checkpoint: tuple[int, bytes, str, float],
) -> None:
    if rows:
        await _insert_many(conn, "ledger_entries", _ENTRY_COLUMNS, [entry_values(r) for r in rows])
    if new_nodes:
        values: list[tuple[object, ...]] = [(n.level, n.index, h) for n, h in new_nodes]
        await _insert_many(conn, "ledger_nodes", ("level", "idx", "hash"), values)
    await _insert_many(conn, "ledger_checkpoints", ("size", "root", "note", "created_at"),
                       [checkpoint])  # fmt: skip


async def latest_checkpoint(conn: AsyncConnection) -> str | None:
    query = select(checkpoints.c.note).order_by(checkpoints.c.size.desc()).limit(1)
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
