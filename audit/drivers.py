"""The two database drivers that run a commit script (``audit.commit``) under the write lock.

Why not SQLAlchemy here: a commit is the ledger's hot path — in strict mode one per request
at low concurrency — and through the async engine it cost ~2 ms of CPU (SQLite: a thread hop
per statement, cursor and result; PostgreSQL: Core's execution machinery per statement). The
drivers below cost a few hundred µs. Everything else (reads, keys, migrations) stays on the
engine.

- ``SqliteDriver``: its own ``sqlite3`` connection to the same file, used from one worker
  thread; the whole transaction (``BEGIN IMMEDIATE`` … ``COMMIT``, fsync included) is one hop,
  so the event loop never waits on the disk or on another process's write lock.
- ``PostgresDriver``: the asyncpg connection under one engine connection the sequencer keeps;
  a transaction that appends takes ``pg_advisory_xact_lock`` first (the script's ``Lock``), so
  replicas sequence one at a time; one that only writes intents does not wait for it.

A transaction of intents alone (and the heartbeat) is run ``relaxed``: durable against this
process's death, not the database host's. An intent guards against the replica dying between
the answer's first byte and its record; a database that loses its last half second in a power
cut loses the records' commits around it as well, which are not relaxed. So SQLite commits it
with ``synchronous=NORMAL`` (in WAL mode: written to the WAL, which the kernel keeps once this
process dies, without the fsync; the next full commit's fsync covers it) and PostgreSQL with
``synchronous_commit = off`` (the server has it; its WAL writer flushes it within
``3 × wal_writer_delay``). The fsync was most of an intent's cost (``bench/RESULTS.md``).
SQLite runs such a commit on the event loop itself, on a connection of its own that never
waits for the write lock (``busy_timeout`` 0) nor checkpoints the WAL: without the fsync it is
about 20 µs of the loop's time against the 70 µs of CPU a worker thread's hop costs here;
when another connection holds the lock, it goes to the worker thread as any commit does.
PostgreSQL opens it with ``BEGIN; SET LOCAL …`` in one round trip.

Both keep their connection between commits; ``reset`` drops it (it may have died while idle)
and reports whether there was one, so the sequencer retries once on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from audit.commit import ExecMany, Lock, Query, Script, Statements
from audit.errors import AuditError
from audit.merkle import CompactRange
from audit.sqlasync import AsyncConnection, AsyncEngine

SEQUENCER_LOCK = 0x7467_6C65_6467_7371  # "tgledgsq": any constant shared by all replicas


class DatabaseError(AuditError):
    """The database failed the commit (asyncpg's own errors, wrapped so that importing this
    module does not import asyncpg in a gateway that runs on SQLite)."""


class Driver(Protocol):
    statements: Statements

    async def run(self, script: Script, *, relaxed: bool = False) -> CompactRange: ...

    async def reset(self) -> bool: ...

    async def aclose(self) -> None: ...


def open_driver(engine: AsyncEngine) -> Driver:
    url = engine.url
    if url.get_backend_name() == "sqlite":
        if not url.database or url.database == ":memory:":
            raise ValueError("the ledger needs a SQLite file, not an in-memory database")
        return SqliteDriver(url.database)
    if url.get_driver_name() != "asyncpg":
        raise ValueError("the ledger's PostgreSQL driver is asyncpg (postgresql+asyncpg://)")
    return PostgresDriver(engine)


class SqliteDriver:
    def __init__(self, path: str) -> None:
        self.statements = Statements("qmark")
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._relaxed = False  # the connection's synchronous setting: NORMAL, not FULL
        self._here: sqlite3.Connection | None = None  # the event loop's, for relaxed commits
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ledger-sqlite")

    async def run(self, script: Script, *, relaxed: bool = False) -> CompactRange:
        if relaxed:
            tree = self._run_here(script)
            if tree is not None:
                return tree
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._run, script, relaxed)

    def _run_here(self, script: Script) -> CompactRange | None:
        """A relaxed commit on the event loop; ``None`` (nothing done) while another
        connection holds the write lock."""
        if self._here is None:
            conn = sqlite3.connect(
                self._path, timeout=0, isolation_level=None, check_same_thread=False
            )  # closed by ``reset``'s thread
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the writer's connection does it
            self._here = conn
        try:
            self._here.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise
            return None
        return _commit(script, self._here)

    def _run(self, script: Script, relaxed: bool) -> CompactRange:
        conn = self._connection()
        if relaxed != self._relaxed:  # outside a transaction, where SQLite honours it
            conn.execute("PRAGMA synchronous=NORMAL" if relaxed else "PRAGMA synchronous=FULL")
            self._relaxed = relaxed
        conn.execute("BEGIN IMMEDIATE")
        return _commit(script, conn)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self._path, timeout=5, isolation_level=None,
                                   check_same_thread=False)  # fmt: skip
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # strict mode promises a durable commit
            self._conn, self._relaxed = conn, False
        return self._conn

    async def reset(self) -> bool:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._close)

    def _close(self) -> bool:
        conn, self._conn = self._conn, None
        here, self._here = self._here, None  # unused meanwhile: the writer awaits this
        for each in (conn, here):
            if each is not None:
                with contextlib.suppress(sqlite3.Error):
                    each.close()
        return conn is not None or here is not None

    async def aclose(self) -> None:
        await self.reset()
        self._thread.shutdown(wait=True)


def _commit(script: Script, conn: sqlite3.Connection) -> CompactRange:
    """Drive ``script`` in the transaction ``conn`` has begun, and commit it."""
    try:
        tree = _drive_sqlite(script, conn)
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    return tree


def _drive_sqlite(script: Script, conn: sqlite3.Connection) -> CompactRange:
    result: Any = None
    try:
        while True:
            op = script.send(result)
            if isinstance(op, Query):
                result = conn.execute(op.sql, op.params).fetchall()
            elif isinstance(op, Lock):  # BEGIN IMMEDIATE holds the write lock already
                result = None
            else:
                conn.executemany(op.sql, op.rows)
                result = None
    except StopIteration as done:
        tree: CompactRange = done.value
        return tree


class PostgresDriver:
    def __init__(self, engine: AsyncEngine) -> None:
        self.statements = Statements("numeric_dollar")
        self._engine = engine
        self._conn: AsyncConnection | None = None

    async def run(self, script: Script, *, relaxed: bool = False) -> CompactRange:
        import asyncpg  # type: ignore[import-untyped]  # loaded already by the engine

        pg = await self._asyncpg()
        try:
            if not relaxed:
                async with pg.transaction():
                    return await _drive_asyncpg(script, pg)
            await pg.execute("BEGIN; SET LOCAL synchronous_commit = off")
            try:
                tree = await _drive_asyncpg(script, pg)
                await pg.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):  # a broken connection is reset anyway
                    await pg.execute("ROLLBACK")
                raise
            return tree
        except (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError) as exc:
            # InternalClientError: a server that stops sends each connection FATAL 57P01
            # (admin_shutdown) before it closes it; one idle when it comes fails its next
            # statement so ("another operation is in progress"), the database gone all the same
            raise DatabaseError(type(exc).__name__) from exc

    async def _asyncpg(self) -> Any:
        if self._conn is None:
            self._conn = await self._engine.connect()
        raw = await self._conn.get_raw_connection()
        return raw.driver_connection

    async def reset(self) -> bool:
        conn, self._conn = self._conn, None
        if conn is None:
            return False
        with contextlib.suppress(Exception):  # it is being thrown away for being broken
            await conn.invalidate()
        return True

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


async def _drive_asyncpg(script: Script, pg: Any) -> CompactRange:
    result: Any = None
    try:
        while True:
            op = script.send(result)
            if isinstance(op, Lock):
                await pg.execute("SELECT pg_advisory_xact_lock($1)", SEQUENCER_LOCK)
                result = None
            elif isinstance(op, Query):
                result = [tuple(r) for r in await pg.fetch(op.sql, *op.params)]
            elif isinstance(op, ExecMany) and op.rows:
                await pg.executemany(op.sql, op.rows)
                result = None
            else:
                result = None
    except StopIteration as done:
        tree: CompactRange = done.value
        return tree
