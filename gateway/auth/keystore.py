"""The key table and its store, with a short in-process cache.

Lookups are cached for ``ttl`` seconds (``KEY_CACHE_TTL_S``, default 5): a revocation on another
replica takes effect within that bound; on the replica that revokes it takes effect at once.
No database round trip happens per chunk, and none on a request's way while its key is used:

- **One load per key at a time.** Requests that miss together (every request of a busy key,
  the moment its entry expires) share one query, not one connection each.
- **Refreshed ahead.** A hit on an entry older than half the TTL serves the entry and reloads
  it beside the request. A key in steady use is never waited for; the TTL's bound holds, as an
  entry is stamped with the time its query began and is never served past ``ttl``.

While the database is away (``gateway.db.DatabaseHealth``), a key this process found within
``stale_s`` (``KEY_CACHE_STALE_S``, default 900) is served from the cache: its requests go on,
their records spooled. Any other key gets 503 ``database_unavailable`` with ``retry-after``
(unknown is not the same as refused: it may have been made on another replica). The first
lookup once the database answers again reads the key afresh, so a revocation still wins then.
While down, the database is asked at most once per second for a key the cache can answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from sqlalchemy import Column, DateTime, Integer, LargeBinary, String, Table, select, update

from audit.sqlasync import AsyncEngine
from gateway.auth import keys
from gateway.auth.keys import KeyInfo, NewKey, ReasoningPolicy, Role
from gateway.db import DatabaseHealth, is_outage, metadata

log = logging.getLogger("thinkgate")

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(32), primary_key=True),
    Column("secret_hash", LargeBinary(32), nullable=False),
    Column("tenant", String(64), nullable=False, index=True),
    Column("role", String(16), nullable=False),
    Column("reasoning", String(16), nullable=False),
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
)


class KeyStore:
    def __init__(
        self, engine: AsyncEngine, ttl: float = 5.0, clock: Callable[[], float] = time.monotonic,
        *, stale_s: float = 900.0, health: DatabaseHealth | None = None,
    ) -> None:  # fmt: skip
        self._engine = engine
        self._ttl = ttl
        self._stale_s = stale_s
        self._clock = clock
        self.health = health or DatabaseHealth(clock=clock)
        self._cache: dict[str, tuple[float, KeyInfo | None]] = {}
        self._loading: dict[str, asyncio.Future[KeyInfo | None]] = {}  # one load per key

    async def create(
        self,
        *,
        tenant: str,
        role: Role,
        reasoning: ReasoningPolicy = "hidden",
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> tuple[NewKey, KeyInfo]:
        new = keys.generate()
        info = KeyInfo(
            new.key_id, tenant, role, reasoning, rpm, tpm, datetime.now(UTC), None, new.secret_hash
        )
        async with self._engine.begin() as conn:
            await conn.execute(api_keys.insert().values(**_row(info)))
        return new, info

    async def get(self, key_id: str) -> KeyInfo | None:
        """The key, from the cache when fresh; ``None`` when unknown."""
        now = self._clock()
        hit = self._cache.get(key_id)
        if hit is not None and now - hit[0] < self._ttl:
            if (now - hit[0] >= self._ttl / 2 and key_id not in self._loading
                    and not self.health.resting):  # fmt: skip
                refresh = self._loading[key_id] = asyncio.ensure_future(self._fetch(key_id))
                refresh.add_done_callback(self._refreshed)
            return hit[1]
        # a key known within stale_s, while the database is away
        known = hit[1] if hit is not None and now - hit[0] < self._stale_s else None
        if self.health.resting:
            if known is None:
                raise self.health.refusal()
            return known
        loading = self._loading.get(key_id)
        if loading is None:
            loading = self._loading[key_id] = asyncio.ensure_future(self._fetch(key_id))
        try:
            return await asyncio.shield(loading)  # a waiter's cancel is not the others'
        except Exception as exc:
            if not is_outage(exc):
                raise
            refusal = self.health.failed(exc)
            if known is None:
                raise refusal from None
            return known

    async def _fetch(self, key_id: str) -> KeyInfo | None:
        """The key read afresh and cached, stamped with the time its query began (the one load
        of ``key_id`` in flight meanwhile). A load that a revocation here overtook is not cached:
        it may have read the key before the revocation."""
        began, this = self._clock(), asyncio.current_task()
        try:
            info = await self._load(key_id)
        finally:
            current = self._loading.get(key_id) is this
            if current:
                del self._loading[key_id]
        self.health.answered()
        if current:
            if len(self._cache) > 10_000:  # bound the cache against floods of random key ids
                self._cache.clear()
            self._cache[key_id] = (began, info)
        return info

    def _refreshed(self, refresh: asyncio.Future[KeyInfo | None]) -> None:
        """A refresh nobody waited for, over: an outage is marked (the entry then ages out as
        without the refresh), a bug logged. A lookup that joined it got its error itself."""
        if refresh.cancelled():
            return
        exc = refresh.exception()
        if exc is None:
            return
        if is_outage(exc):
            self.health.failed(exc)
        else:
            log.error("the key cache's refresh failed", exc_info=exc)

    async def list(self, tenant: str | None = None) -> Sequence[KeyInfo]:
        query = select(api_keys).order_by(api_keys.c.created_at)
        if tenant is not None:
            query = query.where(api_keys.c.tenant == tenant)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_info(row) for row in rows]

    async def revoke(self, key_id: str) -> bool:
        """Revoke ``key_id``; false when there is no such active key."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(api_keys)
                .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=datetime.now(UTC))
            )
        self._cache.pop(key_id, None)
        self._loading.pop(key_id, None)  # a load begun before: the next lookup reads afresh
        return bool(result.rowcount)

    async def _load(self, key_id: str) -> KeyInfo | None:
        async with self._engine.connect() as conn:
            row = (
                (await conn.execute(select(api_keys).where(api_keys.c.key_id == key_id)))
                .mappings()
                .first()
            )
        return _info(row) if row is not None else None


def _row(info: KeyInfo) -> dict[str, object]:
    return {
        "key_id": info.key_id,
        "secret_hash": info.secret_hash,
        "tenant": info.tenant,
        "role": info.role,
        "reasoning": info.reasoning,
        "rpm": info.rpm,
        "tpm": info.tpm,
        "created_at": info.created_at,
        "revoked_at": info.revoked_at,
    }


def _info(row: object) -> KeyInfo:
    m = dict(row)  # type: ignore[call-overload]
    return KeyInfo(
        key_id=m["key_id"],
        tenant=m["tenant"],
        role=m["role"],
        reasoning=m["reasoning"],
        rpm=m["rpm"],
        tpm=m["tpm"],
        created_at=_utc(m["created_at"]),
        revoked_at=_utc(m["revoked_at"]) if m["revoked_at"] else None,
        secret_hash=bytes(m["secret_hash"]),
    )


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; they were stored in UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)
