"""Bring a schema to its current revision (Alembic, run on the caller's engine).

A ``Schema`` names an Alembic script directory, its own version table, its newest revision and
an advisory-lock id. The ledger's is ``LEDGER`` (``audit/migrations``); the gateway's key store
has its own (``gateway.db``), so each is versioned apart and either can be upgraded alone.

Safe to call at every start and from several processes at once: on PostgreSQL the upgrade runs
under a transaction-scoped advisory lock, on a SQLite file under an exclusive ``flock`` of
``<database>.migrate.lock`` beside it (``serve --workers N`` starts its workers together), so
one process migrates and the others then find the schema current. A schema already at its
head is recognised with one query and Alembic is not even imported: a gateway process would
otherwise carry Alembic and Mako in memory for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

from audit.sqlasync import AsyncEngine

if TYPE_CHECKING:
    from alembic.config import Config


@dataclass(frozen=True, slots=True)
class Schema:
    script_location: str  # "package:folder" of the Alembic scripts
    version_table: str
    head: str  # the newest revision in the folder (a test keeps the two equal)
    lock: int  # a constant every replica shares

    def config(self, connection: Connection | None = None) -> Config:
        from alembic.config import Config

        result = Config()
        result.set_main_option("script_location", self.script_location)
        result.attributes["connection"] = connection
        return result

    def current(self, connection: Connection) -> str | None:
        if not inspect(connection).has_table(self.version_table):
            return None
        version = connection.execute(text(f"SELECT version_num FROM {self.version_table}"))
        found = version.scalar()
        return None if found is None else str(found)

    def _upgrade(self, connection: Connection) -> None:
        if self.current(connection) == self.head:
            return
        from alembic import command

        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": self.lock})
        command.upgrade(self.config(connection), "head")

    async def upgrade(self, engine: AsyncEngine) -> None:
        async with _sqlite_lock(engine), engine.begin() as conn:
            await conn.run_sync(self._upgrade)


@contextlib.asynccontextmanager
async def _sqlite_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    """Held across an upgrade of a SQLite file database: SQLite's own locks do not cover
    Alembic's DDL (no transaction is begun for it), and two processes creating the same
    tables at once fail. Nothing for another database or an in-memory one."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:" or path.startswith("file:"):
        yield
        return
    fd = os.open(f"{path}.migrate.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # lets go of the lock


LEDGER = Schema("audit:migrations", "ledger_alembic_version", "0004", 0x7467_6C65_6467_6D31)
HEAD, VERSION_TABLE, MIGRATION_LOCK = LEDGER.head, LEDGER.version_table, LEDGER.lock
config, current = LEDGER.config, LEDGER.current


async def upgrade(engine: AsyncEngine) -> None:
    """The ledger's tables at their current revision."""
    await LEDGER.upgrade(engine)
