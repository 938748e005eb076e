"""The database engine: one async SQLAlchemy engine per app, created in the lifespan.

The gateway's own tables (the key store) migrate through Alembic like the ledger's, with their
own version table (``gateway/migrations``): ``upgrade_schema`` at every start of the gateway and
of ``thinkgate keys``, and in ``thinkgate ledger init`` (one migration story: both schemas are
brought to their head wherever the database is first touched; a current one costs one query).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import MetaData, event
from sqlalchemy import exc as sa
from sqlalchemy.engine import make_url

from audit.migrate import Schema
from audit.sqlasync import AsyncEngine, create_async_engine
from gateway.errors import DatabaseUnavailable

log = logging.getLogger("thinkgate")

metadata = MetaData()
# "tggatem1": any constant shared by all replicas, apart from the ledger's
GATEWAY = Schema("gateway:migrations", "gateway_alembic_version", "0007", 0x7467_6761_7465_6D31)


# What "the database is away" looks like, as opposed to a query the database refused (a bug):
# SQLAlchemy wraps a driver's lost or refused connection as OperationalError or
# InterfaceError (or flags it ``connection_invalidated``); the pool's own wait is its
# TimeoutError; a refused or reset socket surfaces as OSError, a connect timeout as TimeoutError.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    sa.OperationalError, sa.InterfaceError, sa.DisconnectionError, sa.TimeoutError, OSError,
    TimeoutError,
)  # fmt: skip
CONNECT_TIMEOUT_S = 5  # asyncpg's default is 60 s: a partitioned database would hold requests


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is unreachable (not that a query was wrong)."""
    if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OUTAGE_ERRORS)


class DatabaseHealth:
    """The one place a database outage is classified, answered and logged.

    ``failed(exc)`` marks the database down (logging once per outage, not per request) and
    returns the client's answer, 503 ``database_unavailable`` with ``retry-after``;
    ``answered()`` ends the outage (logged once too). ``resting`` is true for ``retry_s`` after
    a failure: callers with something to fall back on (the key cache) use it without asking the
    database again, so an outage costs one failed connect per second, not one per request.
    """

    def __init__(self, retry_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._retry_s = retry_s
        self._clock = clock
        self._failed_at: float | None = None
        self.outages = 0  # how many began in this process

    @property
    def down(self) -> bool:
        return self._failed_at is not None

    @property
    def resting(self) -> bool:
        return self._failed_at is not None and self._clock() - self._failed_at < self._retry_s

    def failed(self, exc: BaseException) -> DatabaseUnavailable:
        if self._failed_at is None:
            self.outages += 1
            log.error("the database is unreachable (%s): known keys are served from the key "
                      "cache, requests that need the database get 503",
                      type(exc).__name__)  # fmt: skip
        self._failed_at = self._clock()
        return self.refusal()

    def translate(self, exc: BaseException) -> DatabaseUnavailable | None:
        """The client's answer when ``exc`` is an outage (``failed``); ``None`` otherwise."""
        return self.failed(exc) if is_outage(exc) else None

    def answered(self) -> None:
        if self._failed_at is not None:
            self._failed_at = None
            log.warning("the database answers again")

    @staticmethod
    def refusal() -> DatabaseUnavailable:
        return DatabaseUnavailable("The gateway's database is unavailable; try again shortly.")


def create_engine(url: str) -> AsyncEngine:
    """An engine for ``url``; for SQLite, the parent directory is created and WAL enabled."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        connect_args = (
            {"timeout": CONNECT_TIMEOUT_S} if parsed.drivername.endswith("asyncpg") else {}
        )
        return create_async_engine(url, pool_pre_ping=True, connect_args=connect_args)
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
