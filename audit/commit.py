"""One sequencer commit as a sans-I/O script: the ledger's write transaction, driver-free.

``commit_script`` is a generator: it yields database operations (``Query``, ``ExecMany``) and
is sent their results; it returns the tree after the commit. A driver (``audit.drivers``) runs
it inside the ledger's write lock: SQLite drives it synchronously in one worker-thread hop,
PostgreSQL awaits asyncpg for each operation. The logic exists once; each driver only moves
rows, in the h11 manner.

Rules of the transaction:

1. read the tree size; when another replica wrote since this process's last commit, reload
   the frontier (the O(log n) complete subtrees that make up the tree) from the node table;
2. on replay, drop records the ledger already holds (by ``(writer, sequence)``);
3. append the leaves: each record gets the next index, and every complete subtree its leaf
   finishes is a new node row (so the node table stays insert-only);
4. insert the data keys made while the database was away, the entries, the nodes, and one
   checkpoint signed over the new root (none when nothing was appended; none either with
   ``checkpoint=False``, the interval mode, where a later script with no batch publishes one
   over the whole tree if its size has none yet);
5. write-ahead intents (``audit.intents``): insert the new ones, delete those the batch's
   records replace (an intent and its record in one commit cancel out), and beat the
   replica's heartbeat in the same transaction. A commit of intents alone takes neither the
   sequencer's lock (``Lock``) nor reads the tree: it appends no leaf.

The caller adopts the returned tree only once the transaction committed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from audit.datakeys import DataKeyRow
from audit.intents import INTENT_COLUMNS, Beat, Intent, cancel_pairs
from audit.merkle import CompactRange, NodeID, frontier, leaf_hash
from audit.note import Checkpoint
from audit.record import Sealed, header_columns, parse_header

ENTRY_COLUMNS = ("idx", "writer", "sequence", "kind", "tenant", "key_id", "request_id",
                 "model", "status", "created_at", "header", "ciphertext", "leaf_hash")  # fmt: skip
Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """A statement whose rows are sent back (a list of tuples)."""

    sql: str
    params: Row = ()


@dataclass(frozen=True, slots=True)
class ExecMany:
    """A statement run once per row (the driver's ``executemany``)."""

    sql: str
    rows: Sequence[Row]


@dataclass(frozen=True, slots=True)
class Lock:
    """Take the sequencer's lock for the rest of the transaction (PostgreSQL's advisory lock;
    SQLite's ``BEGIN IMMEDIATE`` holds the write lock already)."""


Op = Query | ExecMany | Lock
Script = Generator[Op, Any, CompactRange]


@dataclass(frozen=True, slots=True)
class Statements:
    """The SQL of the script in one driver's placeholder style (``qmark``: SQLite's ``?``;
    ``numeric_dollar``: asyncpg's ``$1``)."""

    paramstyle: str

    def marks(self, count: int, start: int = 1) -> list[str]:
        if self.paramstyle == "qmark":
            return ["?"] * count
        if self.paramstyle in ("numeric_dollar", "numeric"):
            sign = "$" if self.paramstyle == "numeric_dollar" else ":"
            return [f"{sign}{i}" for i in range(start, start + count)]
        return ["%s"] * count

    def insert(self, table: str, columns: Sequence[str], tail: str = "") -> str:
        marks = ", ".join(self.marks(len(columns)))
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}){tail}"

    def pairs(self, table: str, a: str, b: str, count: int, select: str) -> str:
        """``SELECT select FROM table WHERE (a = ? AND b = ?) OR ...``: one equality pair per
        row, which both databases answer from the key (SQLite scans the whole table for a
        row-value ``IN`` list)."""
        m = self.marks(2 * count)
        where = " OR ".join(f"({a} = {m[2 * k]} AND {b} = {m[2 * k + 1]})" for k in range(count))
        return f"SELECT {select} FROM {table} WHERE {where}"


def node_lookup(sql: Statements, ids: Sequence[NodeID]) -> Query:
    params = tuple(v for n in ids for v in (n.level, n.index))
    return Query(sql.pairs("ledger_nodes", "level", "idx", len(ids), "level, idx, hash"), params)


@dataclass(frozen=True, slots=True)
class Signing:
    """What a checkpoint needs: the log's name, a signer of note text, a clock."""

    origin: str
    sign: Callable[[str], str]
    now: Callable[[], float]


def commit_script(
    sql: Statements,
    tree: CompactRange,
    batch: Sequence[Sealed],
    keys: Sequence[DataKeyRow],
    signing: Signing,
    *,
    replay: bool = False,
    checkpoint: bool = True,
    intents: Sequence[Intent] = (),
    beat: Beat | None = None,
) -> Script:
    new, done = cancel_pairs(list(intents), [s.replaces for s in batch if s.replaces])
    if batch or keys or checkpoint:
        tree = yield from _sequenced(sql, tree, batch, keys, signing, replay, checkpoint)
    if new:
        insert = sql.insert("ledger_intents", INTENT_COLUMNS, " ON CONFLICT (id) DO NOTHING")
        yield ExecMany(insert, [i.row() for i in new])
    if done:
        yield ExecMany(f"DELETE FROM ledger_intents WHERE id = {sql.marks(1)[0]}",
                       [(d,) for d in done])  # fmt: skip
    if beat is not None:
        yield _beat(sql, beat)
    return tree


def _beat(sql: Statements, beat: Beat) -> ExecMany:
    tail = " ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at"
    return ExecMany(sql.insert("ledger_replicas", ("id", "heartbeat_at", "started_at"), tail),
                    [(beat.replica, beat.at, beat.started_at)])  # fmt: skip


def _sequenced(
    sql: Statements,
    tree: CompactRange,
    batch: Sequence[Sealed],
    keys: Sequence[DataKeyRow],
    signing: Signing,
    replay: bool,
    checkpoint: bool,
) -> Script:
    """Steps 1-4: the leaves, under the sequencer's lock."""
    yield Lock()
    rows = yield Query("SELECT max(idx) FROM ledger_entries")
    size = 0 if rows[0][0] is None else int(rows[0][0]) + 1
    if size != tree.size:
        ids = frontier(size)
        found = (
            {NodeID(r[0], r[1]): bytes(r[2]) for r in (yield node_lookup(sql, ids))} if ids else {}
        )
        tree = CompactRange(size, [found[n] for n in ids])
    else:
        tree = CompactRange(size, tree.hashes)
    if replay and batch:
        batch = yield from _not_stored(sql, batch)
    if keys:
        yield ExecMany(_insert_key(sql), [k.values() for k in keys])
    if batch:
        entries, nodes = _extend(tree, batch)
        yield ExecMany(sql.insert("ledger_entries", ENTRY_COLUMNS), entries)
        yield ExecMany(sql.insert("ledger_nodes", ("level", "idx", "hash")), nodes)
        if checkpoint:
            yield _signed(sql, tree, signing)
    elif checkpoint and tree.size:  # publish: a checkpoint over the tree, if it has none yet
        rows = yield Query("SELECT max(size) FROM ledger_checkpoints")
        if rows[0][0] is None or int(rows[0][0]) < tree.size:
            yield _signed(sql, tree, signing)
    return tree


def _signed(sql: Statements, tree: CompactRange, signing: Signing) -> ExecMany:
    root = tree.root()
    note = signing.sign(Checkpoint(signing.origin, tree.size, root).body())
    checkpoint = (tree.size, root, note, signing.now())
    return ExecMany(sql.insert("ledger_checkpoints", ("size", "root", "note", "created_at")),
                    [checkpoint])  # fmt: skip


def _insert_key(sql: Statements) -> str:
    columns = ("dek_id", "tenant", "kek_id", "wrapped", "created_at", "period")
    return sql.insert("ledger_data_keys", columns, " ON CONFLICT (dek_id) DO NOTHING")


def _not_stored(sql: Statements, batch: Sequence[Sealed]) -> Generator[Op, Any, list[Sealed]]:
    headers = [parse_header(s.header) for s in batch]
    pairs = [(h.writer, h.sequence) for h in headers]
    stored: set[tuple[str, int]] = set()
    for start in range(0, len(pairs), 500):
        chunk = pairs[start : start + 500]
        query = sql.pairs("ledger_entries", "writer", "sequence", len(chunk), "writer, sequence")
        found = yield Query(query, tuple(v for pair in chunk for v in pair))
        stored.update((w, int(q)) for w, q in found)
    return [s for s, h in zip(batch, headers, strict=True) if (h.writer, h.sequence) not in stored]


def _extend(tree: CompactRange, batch: Sequence[Sealed]) -> tuple[list[Row], list[Row]]:
    """Entry rows and new node rows for ``batch``, appended to ``tree`` (which it mutates)."""
    entries: list[Row] = []
    nodes: list[Row] = []
    for sealed in batch:
        index = tree.size
        leaf = leaf_hash(sealed.leaf_data())
        nodes += [(n.level, n.index, digest) for n, digest in tree.append(leaf)]
        columns = sealed.columns or header_columns(parse_header(sealed.header))
        entries.append((index, *columns, sealed.header, sealed.ciphertext, leaf))
    return entries, nodes
