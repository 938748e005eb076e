"""Bring a schema to its current revision (Alembic, run on the caller's engine).

A ``Schema`` names an Alembic script directory, its own version table, its newest revision and
an advisory-lock id. The ledger's is ``LEDGER`` (``audit/migrations``); the gateway's key store
has its own (``gateway.db``), so each is versioned apart and either can be upgraded alone.

Safe to call at every start and from several replicas at once on PostgreSQL: the upgrade runs
under a transaction-scoped advisory lock, so one replica migrates and the others then find the
schema current. A schema already at its head is recognised with one query and Alembic is not
even imported: a gateway process would otherwise carry Alembic and Mako in memory for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

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
        async with engine.begin() as conn:
            await conn.run_sync(self._upgrade)


LEDGER = Schema("audit:migrations", "ledger_alembic_version", "0004", 0x7467_6C65_6467_6D31)
HEAD, VERSION_TABLE, MIGRATION_LOCK = LEDGER.head, LEDGER.version_table, LEDGER.lock
config, current = LEDGER.config, LEDGER.current


async def upgrade(engine: AsyncEngine) -> None:
    """The ledger's tables at their current revision."""
    await LEDGER.upgrade(engine)
