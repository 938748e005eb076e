"""``ledger verify``: recompute the whole ledger from its records and check every claim about it.

One pass over the entries in index order, in chunks (memory stays flat at any size):

1. indexes run 0, 1, 2, ... with no gap (a deleted row is named);
2. every leaf is recomputed from the stored ``header || ciphertext`` and compared with the
   stored leaf hash, and the searchable columns with the header they were derived from;
3. the tree is rebuilt with a compact range, and every complete subtree it completes is compared
   with the stored node (what proofs are served from);
4. every checkpoint's signature is checked with the log's public key, and its root with the
   recomputed root at its size. All checkpoints agreeing with one recomputed history is
   consistency between consecutive checkpoints, checked at every step;
5. the last checkpoint covers the whole tree (a record after it would be unsigned), and none
   claims a size beyond it (records were removed from the end).

The first problem stops the run and is reported with the index (or checkpoint size) it concerns.
Nothing here needs a decryption key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, select

from audit import store
from audit.errors import AuditError
from audit.merkle import CompactRange, NodeID, leaf_hash
from audit.note import NoteError, NoteVerifier, parse_checkpoint
from audit.record import RecordFormatError, Sealed, parse_header
from audit.schema import checkpoints, entries, nodes
from audit.sqlasync import AsyncConnection, AsyncEngine

CHUNK = 2000
_COLUMNS = ("kind", "tenant", "key_id", "request_id", "model", "status", "writer", "sequence")


class LedgerCorrupt(AuditError):
    """The ledger does not verify; the message names the first bad index or checkpoint."""


@dataclass(frozen=True, slots=True)
class Report:
    size: int
    checkpoints: int
    pending: int = 0  # records after the last checkpoint (the interval mode's next covers them)


async def verify(
    engine: AsyncEngine,
    verifier: NoteVerifier,
    origin: str,
    progress: Callable[[int, int], None] = lambda done, total: None,
    *,
    pending_ok: bool = False,
) -> Report:
    """``pending_ok``: records after the last checkpoint are reported (``Report.pending``)
    rather than failing: with ``CHECKPOINT_INTERVAL_MS`` they are there until the next one."""
    async with engine.connect() as conn:
        size = await store.tree_size(conn)
        checker = _Checker(verifier, origin)
        for first in range(0, size, CHUNK):
            end = min(first + CHUNK, size)
            await checker.chunk(conn, first, end)
            progress(end, size)
        pending = await checker.finish(conn, size, pending_ok)
    return Report(size, checker.checkpoints, pending)


class _Checker:
    def __init__(self, verifier: NoteVerifier, origin: str) -> None:
        self._verifier = verifier
        self._origin = origin
        self._tree = CompactRange()
        self._last_signed = 0
        self.checkpoints = 0

    async def chunk(self, conn: AsyncConnection, first: int, end: int) -> None:
        rows = await _entries(conn, first, end)
        stored = await _nodes(conn, first, end)
        heads = await _checkpoints(conn, first + 1, end)
        expected = first
        for row in rows:
            if row.idx != expected:
                raise LedgerCorrupt(f"index {expected}: the record is missing")
            self._leaf(row)
            for node, digest in self._tree.append(bytes(row.leaf_hash)):
                if stored.get(node) != digest:
                    raise LedgerCorrupt(f"index {expected}: stored tree node {node} is wrong")
            expected += 1
            if expected in heads:
                self._checkpoint(expected, *heads[expected])
        if expected != end:
            raise LedgerCorrupt(f"index {expected}: the record is missing")

    def _leaf(self, row: Row[Any]) -> None:
        index = row.idx
        header_bytes = bytes(row.header)
        sealed = Sealed(header_bytes, bytes(row.ciphertext))
        if leaf_hash(sealed.leaf_data()) != bytes(row.leaf_hash):
            raise LedgerCorrupt(f"index {index}: the record does not match its leaf hash")
        try:
            header = parse_header(header_bytes)
        except RecordFormatError:
            raise LedgerCorrupt(f"index {index}: the header is not a ledger header") from None
        for name in _COLUMNS:
            if str(getattr(header, name)) != str(getattr(row, name)):
                raise LedgerCorrupt(f"index {index}: column {name} disagrees with the header")
        if float(row.created_at) != header.created_at:  # time-window searches use the column
            raise LedgerCorrupt(f"index {index}: column created_at disagrees with the header")

    def _checkpoint(self, size: int, root: bytes, note: str) -> None:
        try:
            head = parse_checkpoint(self._verifier.open(note))
        except NoteError:
            raise LedgerCorrupt(f"checkpoint at size {size}: bad signature or format") from None
        if head.size != size or head.root != root or head.origin != self._origin:
            raise LedgerCorrupt(f"checkpoint at size {size}: its columns disagree with its note")
        if head.root != self._tree.root():
            raise LedgerCorrupt(
                f"checkpoint at size {size}: the records do not produce its root "
                f"(a record between index {self._last_signed} and {size - 1} was changed)"
            )
        self._last_signed = size
        self.checkpoints += 1

    async def finish(self, conn: AsyncConnection, size: int, pending_ok: bool) -> int:
        query = select(checkpoints.c.size).where(checkpoints.c.size > size).limit(1)
        beyond = (await conn.execute(query)).scalar()
        if beyond is not None:
            raise LedgerCorrupt(
                f"checkpoint at size {beyond}: the ledger holds only {size} records "
                f"(index {size} and later were removed)"
            )
        if self._last_signed != size and not pending_ok:
            raise LedgerCorrupt(
                f"index {self._last_signed}: records from here on are not covered by a checkpoint"
            )
        return size - self._last_signed


async def _entries(conn: AsyncConnection, first: int, end: int) -> list[Row[Any]]:
    c = entries.c
    query = (
        select(
            c.idx,
            c.header,
            c.ciphertext,
            c.leaf_hash,
            c.created_at,
            *(getattr(c, n) for n in _COLUMNS),
        )
        .where(c.idx >= first, c.idx < end)
        .order_by(c.idx)
    )
    return list((await conn.execute(query)).all())


async def _nodes(conn: AsyncConnection, first: int, end: int) -> dict[NodeID, bytes]:
    query = select(nodes.c.level, nodes.c.idx, nodes.c.hash).where(
        store.nodes_completed_by(first, end)
    )
    return {NodeID(r.level, r.idx): bytes(r.hash) for r in await conn.execute(query)}


async def _checkpoints(conn: AsyncConnection, low: int, high: int) -> dict[int, tuple[bytes, str]]:
    c = checkpoints.c
    query = select(c.size, c.root, c.note).where(c.size >= low, c.size <= high)
    return {int(r.size): (bytes(r.root), r.note) for r in await conn.execute(query)}
