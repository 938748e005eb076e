"""Tenant data keys (DEKs): created on a tenant's first record, wrapped at rest, shreddable.

Rules:

- A DEK is 32 random bytes, stored only wrapped (AES-KW) under the key provider's primary KEK,
  in ``ledger_data_keys`` with a random ``dek_id`` that every record header names. A tenant may
  own several DEKs (replicas that met the tenant at the same moment each made one; nothing
  breaks, every header says which one it used).
- The DEK used for *new* records is cached for ``ACTIVE_TTL_S`` (1 s: one indexed read per
  tenant per second per process), counted from the moment the database read that found it
  *began* (a slow read cannot stretch it), and a caller never joins a read that began longer
  ago than that: no process hands out a DEK more than ``ACTIVE_TTL_S`` after the database last
  showed it alive. So destroying keys is a **barrier**: ``shred`` and ``destroy`` return only
  once ``ACTIVE_TTL_S`` (and a margin) has passed since their transaction committed, after
  which no replica seals under a destroyed key again: a record of an exchange admitted after
  the command returned is always readable. (Records sealed in that second under the destroyed
  key are as unreadable as the rest of the tenant's, which is what shredding asked for.)
- The key provider failing to open a tenant's DEK (a KEK rotated by another process that this
  one has not read yet, a broken key file) never loses a record: the DEK cached before keeps
  sealing, ``healthy`` turns false (the gateway's readiness fails and it refuses new requests
  before they reach an engine, ``Ledger.accepting``), and ``recover`` (called while unhealthy,
  at most once per ``RECOVER_EVERY_S``) reads the key file again. A tenant with no cached DEK
  then gets ``KeysUnavailable``.
- While the database is away, a new tenant still gets a DEK: it is kept as *unsaved*, and the
  writer puts its wrapped form (never the plain key) in the spool ahead of the tenant's
  records and inserts it in the transaction that commits them.
- A tenant has a DEK per UTC day (``period``): a record is sealed under the key of the day
  of its ``created_at`` (the time retention and holds go by), and a day's first record makes
  the day's key. Retention shreds a tenant's keys of the days
  past its limit (``shred_periods``); keys made before periods existed have none and are
  treated as ending when the tenant's first key with one was made.
- Shredding erases the wrapped key and records when; ``opening`` then answers ``None``
  ("destroyed") for every record it sealed, forever.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

import orjson
from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError

from audit.crypto import (
    DecryptionError,
    KeyFileError,
    KeyProvider,
    WrappedKey,
    new_data_key,
    rewrap,
)
from audit.errors import AuditError
from audit.schema import data_keys
from audit.sqlasync import AsyncConnection, AsyncEngine

log = logging.getLogger("thinkgate")
ACTIVE_TTL_S = 1.0
BARRIER_MARGIN_S = 0.1  # what a destroying command waits beyond ACTIVE_TTL_S (``barrier``)
RECOVER_EVERY_S = 1.0


class KeysUnavailable(AuditError):
    """The key provider cannot open the tenant's data key, and none is cached."""


@dataclass(frozen=True, slots=True)
class DataKeyRow:
    dek_id: str
    tenant: str
    kek_id: str
    wrapped: bytes
    created_at: float
    period: str | None = None  # the UTC day it seals (None: a key made before periods)

    def values(self) -> tuple[str, str, str, bytes, float, str | None]:
        """In the column order of ``ledger_data_keys`` (``dek_id`` … ``period``)."""
        return (self.dek_id, self.tenant, self.kek_id, self.wrapped, self.created_at,
                self.period)  # fmt: skip

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "dek_id": self.dek_id,
                "tenant": self.tenant,
                "kek_id": self.kek_id,
                "wrapped": self.wrapped.hex(),
                "created_at": self.created_at,
                "period": self.period,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> DataKeyRow:
        raw = orjson.loads(data)
        return cls(
            raw["dek_id"], raw["tenant"], raw["kek_id"], bytes.fromhex(raw["wrapped"]),
            float(raw["created_at"]), raw.get("period"),
        )  # fmt: skip


class DataKeys:
    def __init__(
        self,
        engine: AsyncEngine,
        provider: KeyProvider,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._engine = engine
        self._sleep = sleep  # how ``shred`` and ``destroy`` wait out the cache (the barrier)
        self._provider = provider
        self._clock = clock
        self._wall = wall  # whose UTC day a new record's key belongs to
        self._active: dict[tuple[str, str], tuple[float, str, bytes]] = {}  # (tenant, day)
        self._plain: dict[str, bytes] = {}
        # single flight: the read in progress per (tenant, day), and when it began
        self._loading: dict[tuple[str, str], tuple[float, asyncio.Future[tuple[str, bytes]]]] = {}
        self.unsaved: dict[str, DataKeyRow] = {}
        self.healthy = True  # the provider opened the last DEK it was asked for
        self._tried_at = -RECOVER_EVERY_S

    def reload_keys(self) -> None:
        """Read the key file again now (SIGHUP); keys cached so far are looked up again."""
        reload = getattr(self._provider, "reload", None)
        try:
            if reload is not None and reload():
                self.healthy = True
                self._active.clear()
        except (KeyFileError, OSError) as exc:
            log.error("the ledger key file cannot be read again: %s", type(exc).__name__)

    def recover(self) -> bool:
        """While unhealthy: read the key file again (at most once per ``RECOVER_EVERY_S``);
        healthy again when it changed (the next refresh proves it)."""
        if self.healthy:
            return True
        now = self._clock()
        if now - self._tried_at < RECOVER_EVERY_S:
            return False
        self._tried_at = now
        reload = getattr(self._provider, "reload", None)
        try:
            if reload is not None and reload():
                self.healthy = True
                self._active.clear()  # every tenant's key is looked up again, under the new file
        except (KeyFileError, OSError):
            pass
        return self.healthy

    async def for_sealing(self, tenant: str, when: float | None = None) -> tuple[str, bytes]:
        """``(dek_id, dek)`` for a new record of ``tenant`` made at ``when`` (wall clock; now
        when absent): the tenant's key of that UTC day, so retention and holds, which go by
        a record's time, go by its key's day too."""
        slot = (tenant, period_of(self._wall() if when is None else when))
        cached = self._active.get(slot)
        if cached is not None and self._clock() - cached[0] < ACTIVE_TTL_S:
            return cached[1], cached[2]
        # Single flight: a burst of a tenant's first requests makes one lookup, not one each
        # (which would also give the tenant one new key per request); never one that began
        # ``ACTIVE_TTL_S`` ago (what it finds may have been destroyed since).
        loading = self._loading.get(slot)
        if loading is None or self._clock() - loading[0] >= ACTIVE_TTL_S:
            pending = asyncio.ensure_future(self._refresh(*slot))
            loading = self._loading[slot] = (self._clock(), pending)
            pending.add_done_callback(lambda done: self._loaded(slot, done))
        return await asyncio.shield(loading[1])

    def _loaded(self, slot: tuple[str, str], done: asyncio.Future[tuple[str, bytes]]) -> None:
        """A read ended: forget it, unless a newer one took its place meanwhile."""
        if slot in self._loading and self._loading[slot][1] is done:
            del self._loading[slot]

    async def _refresh(self, tenant: str, period: str) -> tuple[str, bytes]:
        slot = (tenant, period)
        began = self._clock()  # the key's cache life counts from here, not from the answer
        try:
            dek_id, dek = await self._load_or_create(tenant, period)
        except (SQLAlchemyError, OSError, TimeoutError):
            dek_id, dek = self._create_unsaved(tenant, period)
        except DecryptionError:
            self.healthy = False
            # the day's key cached before keeps sealing; a record of a day whose key was
            # never cached here takes another cached key of the tenant's (the one exception
            # to a key per day: the gateway refuses new requests meanwhile)
            cached = self._active.get(slot) or next(
                (v for k, v in self._active.items() if k[0] == tenant), None)  # fmt: skip
            if cached is None:
                raise KeysUnavailable(
                    f"the data key of tenant {tenant!r} cannot be opened"
                ) from None
            self._active[slot] = (self._clock(), cached[1], cached[2])  # tried again later
            return cached[1], cached[2]  # keeps sealing; refreshed once the keys are back
        self.healthy = True
        now = self._clock()
        for other in [k for k, v in self._active.items()
                      if k[0] == tenant and k != slot and now - v[0] >= ACTIVE_TTL_S]:  # fmt: skip
            del self._active[other]  # an earlier day's key, no longer in use here
        self._active[slot] = (began, dek_id, dek)
        return dek_id, dek

    async def opening(self, dek_id: str, *, tenant: str | None = None) -> bytes | None:
        """The DEK for reading a record, or ``None`` when it was shredded or never saved (or,
        with ``tenant``, is not that tenant's). The database is asked every time (reads are
        rare): a shred elsewhere counts at once."""
        async with self._engine.connect() as conn:
            query = select(data_keys.c.kek_id, data_keys.c.wrapped).where(
                data_keys.c.dek_id == dek_id
            )
            if tenant is not None:
                query = query.where(data_keys.c.tenant == tenant)
            row = (await conn.execute(query)).first()
        if row is None or row.wrapped is None:
            return None
        if dek_id in self._plain:
            return self._plain[dek_id]
        return self._provider.unwrap(WrappedKey(row.kek_id, bytes(row.wrapped)))

    def saved(self, dek_ids: list[str]) -> None:
        """Only the keys that transaction inserted: one made meanwhile is still unsaved."""
        for dek_id in dek_ids:
            self.unsaved.pop(dek_id, None)

    async def shred(self, tenant: str, now: float) -> int:
        """Destroy every live key of ``tenant``; returns once no process seals under one of
        them again (``barrier``)."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(data_keys)
                .where(data_keys.c.tenant == tenant, data_keys.c.wrapped.is_not(None))
                .values(wrapped=None, destroyed_at=now)
            )
        committed = self._clock()
        for slot in [k for k in self._active if k[0] == tenant]:
            del self._active[slot]
        for dek_id in await self._ids(tenant):
            self._plain.pop(dek_id, None)
        destroyed = int(result.rowcount or 0)
        if destroyed:
            await self.barrier(committed)
        return destroyed

    async def barrier(self, committed: float) -> None:
        """Wait until ``ACTIVE_TTL_S`` and ``BARRIER_MARGIN_S`` have passed since a destroying
        transaction committed (``committed``, on this process's clock): every process's
        cached copy of a key it destroyed has expired by then, on every replica (each counts
        the same second on its own monotonic clock; the margin covers the read that saw the
        key alive ending just before the commit and clocks that run a little apart)."""
        remaining = committed + ACTIVE_TTL_S + BARRIER_MARGIN_S - self._clock()
        if remaining > 0:
            await self._sleep(remaining)

    async def destroy(self, dek_ids: Collection[str], now: float) -> list[str]:
        """Destroy these keys (retention); the ones this call destroyed (not another's)."""
        destroyed = []
        async with self._engine.begin() as conn:
            for dek_id in dek_ids:
                result = await conn.execute(
                    update(data_keys)
                    .where(data_keys.c.dek_id == dek_id, data_keys.c.wrapped.is_not(None))
                    .values(wrapped=None, destroyed_at=now)
                )
                if result.rowcount:
                    destroyed.append(dek_id)
        committed = self._clock()
        gone = set(destroyed)
        for slot in [k for k, v in self._active.items() if v[1] in gone]:
            del self._active[slot]
        for dek_id in destroyed:
            self._plain.pop(dek_id, None)
        if destroyed:
            await self.barrier(committed)
        return destroyed

    async def rewrap_all(self) -> int:
        """Key rotation: re-wrap every live DEK under the provider's primary KEK."""
        moved = 0
        async with self._engine.begin() as conn:
            query = select(data_keys.c.dek_id, data_keys.c.kek_id, data_keys.c.wrapped).where(
                data_keys.c.wrapped.is_not(None), data_keys.c.kek_id != self._provider.primary_id
            )
            for row in (await conn.execute(query)).all():
                new = rewrap(self._provider, WrappedKey(row.kek_id, bytes(row.wrapped)))
                await conn.execute(
                    update(data_keys)
                    .where(data_keys.c.dek_id == row.dek_id)
                    .values(kek_id=new.kek_id, wrapped=new.blob)
                )
                moved += 1
        return moved

    async def _ids(self, tenant: str) -> set[str]:
        async with self._engine.connect() as conn:
            query = select(data_keys.c.dek_id).where(data_keys.c.tenant == tenant)
            return {r.dek_id for r in await conn.execute(query)}

    async def _load_or_create(self, tenant: str, period: str) -> tuple[str, bytes]:
        async with self._engine.begin() as conn:
            query = (
                select(data_keys.c.dek_id, data_keys.c.kek_id, data_keys.c.wrapped)
                .where(
                    data_keys.c.tenant == tenant,
                    data_keys.c.wrapped.is_not(None),
                    data_keys.c.period == period,
                )
                .order_by(data_keys.c.created_at.desc())
                .limit(1)
            )
            row = (await conn.execute(query)).first()
            if row is not None:
                dek = self._provider.unwrap(WrappedKey(row.kek_id, bytes(row.wrapped)))
                self._plain[row.dek_id] = dek
                return row.dek_id, dek
            new, dek = self._new_row(tenant, period)
            await insert_key(conn, new)
        return new.dek_id, dek

    def _create_unsaved(self, tenant: str, period: str) -> tuple[str, bytes]:
        row, dek = self._new_row(tenant, period)
        self.unsaved[row.dek_id] = row
        return row.dek_id, dek

    def _new_row(self, tenant: str, period: str) -> tuple[DataKeyRow, bytes]:
        dek = new_data_key()
        wrapped = self._provider.wrap(dek)
        row = DataKeyRow(
            f"dek-{secrets.token_hex(8)}", tenant, wrapped.kek_id, wrapped.blob, self._wall(),
            period,
        )  # fmt: skip
        self._plain[row.dek_id] = dek
        return row, dek


def period_of(when: float) -> str:
    """The UTC day of a wall-clock time, as a key's ``period`` names it."""
    return time.strftime("%Y-%m-%d", time.gmtime(when))


async def insert_key(conn: AsyncConnection, row: DataKeyRow) -> None:
    """Insert unless present (replay may repeat a key line)."""
    exists = select(data_keys.c.dek_id).where(data_keys.c.dek_id == row.dek_id)
    if (await conn.execute(exists)).first() is None:
        await conn.execute(
            data_keys.insert().values(
                dek_id=row.dek_id,
                tenant=row.tenant,
                kek_id=row.kek_id,
                wrapped=row.wrapped,
                created_at=row.created_at,
                period=row.period,
            )
        )
