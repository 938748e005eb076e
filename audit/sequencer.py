"""The sequencer: one transaction per batch assigns indexes, extends the tree, signs its head.

Inside the ledger's write lock (``store.sequencing``) it reads the tree size, brings its compact
range (the right frontier of the tree, O(log n) hashes) up to date when another replica wrote
since, appends the batch's leaves, inserts the entries, every complete subtree they finish and
one signed checkpoint, and commits. So indexes are contiguous across replicas, the node table
is insert-only, and every batch leaves a signed tree head behind.

The frontier is only adopted after the commit: a failed transaction leaves no trace here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from audit import store
from audit.datakeys import DataKeys
from audit.merkle import CompactRange, NodeID, frontier, leaf_hash
from audit.note import Checkpoint, NoteSigner
from audit.record import Sealed, parse_header


class Sequencer:
    def __init__(
        self,
        engine: AsyncEngine,
        signer: NoteSigner,
        origin: str,
        keys: DataKeys,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._signer = signer
        self._origin = origin
        self._keys = keys
        self._clock = clock
        self._range = CompactRange()
        self._conn: AsyncConnection | None = None

    @property
    def size(self) -> int:
        """The tree size after this process's last commit (others may have written since)."""
        return self._range.size

    async def commit(self, batch: Sequence[Sealed], *, replay: bool = False) -> int:
        """Append ``batch`` in order; with ``replay``, skip records the ledger already holds.
        Returns the new tree size."""
        while True:
            reused = self._conn is not None
            conn = await self._connection()
            try:
                return await self._commit(conn, batch, replay)
            except store.DB_ERRORS:
                await self._drop_connection()
                if not reused:
                    raise
                # The kept connection may have died while idle (database restarted, idle
                # timeout): one more try on a fresh one before calling the database away.
            except BaseException:
                await self._drop_connection()  # its state is unknown: a fresh one next time
                raise

    async def _commit(self, conn: AsyncConnection, batch: Sequence[Sealed], replay: bool) -> int:
        async with store.sequencing(conn):
            tree = await self._current_range(conn)
            if replay:
                batch = await _not_stored(conn, batch)
            rows, new_nodes = _extend(tree, tree.size, batch)
            saved_keys = await self._keys.save_unsaved(conn)
            if rows:  # a replay of records all stored already adds no checkpoint
                root = tree.root()
                note = self._signer.sign(Checkpoint(self._origin, tree.size, root).body())
                await store.append(conn, rows, new_nodes, (tree.size, root, note, self._clock()))
        self._keys.saved(saved_keys)
        self._range = tree
        return tree.size

    async def _connection(self) -> AsyncConnection:
        """The sequencer keeps one connection for itself: a commit then costs its own round
        trips only, not a pool checkout (with its liveness ping) and a reset on return."""
        if self._conn is None:
            self._conn = await self._engine.connect()
        return self._conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(*store.DB_ERRORS):
                await conn.invalidate()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(*store.DB_ERRORS):
                await conn.close()

    async def ping(self) -> bool:
        """Whether the database answers."""
        try:
            async with self._engine.connect() as conn:
                await store.tree_size(conn)
        except store.DB_ERRORS:
            return False
        return True

    async def _current_range(self, conn: AsyncConnection) -> CompactRange:
        size = await store.tree_size(conn)
        if size == self._range.size:
            return CompactRange(size, self._range.hashes)
        ids = frontier(size)
        found = await store.node_hashes(conn, ids)
        return CompactRange(size, [found[n] for n in ids])


async def _not_stored(conn: AsyncConnection, batch: Sequence[Sealed]) -> list[Sealed]:
    headers = [parse_header(s.header) for s in batch]
    stored = await store.stored_pairs(conn, [(h.writer, h.sequence) for h in headers])
    return [s for s, h in zip(batch, headers, strict=True) if (h.writer, h.sequence) not in stored]


def _extend(
    tree: CompactRange, first: int, batch: Sequence[Sealed]
) -> tuple[list[store.EntryRow], list[tuple[NodeID, bytes]]]:
    rows: list[store.EntryRow] = []
    new_nodes: list[tuple[NodeID, bytes]] = []
    for offset, sealed in enumerate(batch):
        leaf = leaf_hash(sealed.leaf_data())
        new_nodes += tree.append(leaf)
        header = parse_header(sealed.header)
        rows.append(store.EntryRow(first + offset, header, sealed.header, sealed.ciphertext, leaf))
    return rows, new_nodes
