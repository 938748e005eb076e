"""Bring the ledger schema to the current revision (Alembic, run on the caller's engine).

Safe to call at every start and from several replicas at once on PostgreSQL: the upgrade runs
under a transaction-scoped advisory lock, so one replica migrates and the others then find the
schema current. A schema already at ``HEAD`` is recognised with one query and Alembic is not
even imported: a gateway process would otherwise carry Alembic and Mako in memory for good.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

if TYPE_CHECKING:
    from alembic.config import Config

HEAD = "0001"  # the newest file in audit/migrations/versions (a test keeps the two equal)
VERSION_TABLE = "ledger_alembic_version"
MIGRATION_LOCK = 0x7467_6C65_6467_6D31  # "tgledgm1": any constant shared by all replicas


def config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    result = Config()
    result.set_main_option("script_location", "audit:migrations")
    result.attributes["connection"] = connection
    return result


def current(connection: Connection) -> str | None:
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    version = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    return None if version is None else str(version)


def _upgrade(connection: Connection) -> None:
    if current(connection) == HEAD:
        return
    from alembic import command

    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
    command.upgrade(config(connection), "head")


async def upgrade(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade)
