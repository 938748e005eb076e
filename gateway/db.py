"""The database engine: one async SQLAlchemy engine per app, created in the lifespan.

Schema creation is ``create_all`` at start-up (idempotent); thinkgate owns few, insert-mostly
tables, so migrations are deliberately left to a later issue.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import MetaData, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

metadata = MetaData()


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


async def create_schema(engine: AsyncEngine, *metadatas: MetaData) -> None:
    async with engine.begin() as conn:
        for md in (metadata, *metadatas):
            await conn.run_sync(md.create_all)
