"""The database engine: one async SQLAlchemy engine per app, created in the lifespan.

The gateway's own tables (the key store) migrate through Alembic like the ledger's, with their
own version table (``gateway/migrations``): ``upgrade_schema`` at every start of the gateway and
of ``thinkgate keys``, and in ``thinkgate ledger init`` (one migration story: both schemas are
brought to their head wherever the database is first touched; a current one costs one query).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import MetaData, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from audit.migrate import Schema

metadata = MetaData()
# "tggatem1": any constant shared by all replicas, apart from the ledger's
GATEWAY = Schema("gateway:migrations", "gateway_alembic_version", "0002", 0x7467_6761_7465_6D31)


def create_engine(url: str) -> AsyncEngine:
    """An engine for ``url``; for SQLite, the parent directory is created and WAL enabled."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_async_engine(url, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)
    event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


async def upgrade_schema(engine: AsyncEngine) -> None:
    """The gateway's tables at their current revision (the ledger migrates its own)."""
    await GATEWAY.upgrade(engine)
