"""Bring the ledger schema to the current revision (Alembic, run on the caller's engine).

Safe to call at every start and from several replicas at once on PostgreSQL: the upgrade runs
under a transaction-scoped advisory lock, so one replica migrates and the others then find the
schema current.
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATION_LOCK = 0x7467_6C65_6467_6D31  # "tgledgm1": any constant shared by all replicas


def _config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", "audit:migrations")
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
    command.upgrade(_config(connection), "head")


async def upgrade(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade)
