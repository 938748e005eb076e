"""Background responses (``background: true``): their state and their events, where every
replica can read them.

``BackgroundStore`` keeps, in the gateway's database (PostgreSQL shared by the replicas, SQLite
on a single node):

- ``gateway_background``: one row per background response. Clear columns: the id, tenant, key
  id, ``status`` (``queued``, ``in_progress``, then ``completed``, ``incomplete``, ``failed``
  or ``cancelled``), the replica running it (``owner``) and its last ``heartbeat_at``,
  ``cancel_requested``, how many events it has (``events``), creation and expiry times, the
  data key id. Sealed: the response object as it stands (``queued`` at first, the final one at
  the end) and its input items.
- ``gateway_background_events``: the stream's events in chunks (one row per flush: events
  ``first_seq`` .. ``first_seq + count - 1``), sealed. Every event is kept as the stream sent
  it (name and data), so a replay is byte for byte what a live client got.

Sealing: AES-256-GCM under ``HKDF-SHA256(the tenant's ledger data key, salt,
"thinkgate/background/v1")``; the associated data binds each blob to its response, tenant and
(for a chunk) first sequence number, so a chunk cannot be moved to another response or place.
Shredding the tenant makes every row unreadable (it then reads as gone).

Ownership: only the replica that owns a row writes its events, and every write checks, in the
same transaction, that the row is still active and still its own. A replica whose heartbeat is
older than ``stale_s`` is presumed dead: ``sweep`` (any replica) marks its responses
``failed`` (``server_error``) and appends the terminal ``response.failed`` event, so a
resumed stream ends; should the presumed-dead owner write again, it finds the row no longer
its own and stops (``Lost``).

Retention: as stored responses (``RESPONSES_RETENTION_S`` from creation); ``purge`` deletes
expired rows and their events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    and_,
    delete,
    func,
    select,
    update,
)

from audit.datakeys import DataKeys
from audit.sqlasync import AsyncConnection, AsyncEngine
from gateway.conversation.retention import EVERY_S, purge_forever
from gateway.conversation.sealedstore import SealedStore
from gateway.db import metadata

_INFO = b"thinkgate/background/v1"
ACTIVE = ("queued", "in_progress")
TERMINAL = ("completed", "incomplete", "failed", "cancelled")

background = Table(
    "gateway_background",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("key_id", String(32), nullable=False),
    Column("status", String(16), nullable=False),
    Column("owner", String(32), nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("events", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("dek_id", String(64), nullable=False),
    Column("salt", LargeBinary, nullable=False),
    Column("sealed", LargeBinary, nullable=False),
    Index("ix_gateway_background_active", "status", "heartbeat_at"),
    Index("ix_gateway_background_tenant", "tenant", "status"),
    Index("ix_gateway_background_expires_at", "expires_at"),
)

events = Table(
    "gateway_background_events",
    metadata,
    Column("response_id", String(64), primary_key=True),
    Column("first_seq", Integer, primary_key=True),
    Column("count", Integer, nullable=False),
    Column("tenant", String(64), nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("sealed", LargeBinary, nullable=False),
    Index("ix_gateway_background_events_expires_at", "expires_at"),
)

Event = tuple[str, bytes]  # the SSE event's name and its data, as sent


class Lost(Exception):
    """This replica no longer runs the response: it ended (cancelled, swept) or was taken."""


@dataclass(frozen=True, slots=True)
class Background:
    """A background response as it stands, opened."""

    id: str
    key_id: str
    status: str
    cancel_requested: bool
    events: int  # how many the stream has so far
    response: dict[str, Any]  # the response object: queued at first, final at the end
    input_items: list[dict[str, Any]]

    @property
    def active(self) -> bool:
        return self.status in ACTIVE


def _aad(response_id: str, tenant: str, first_seq: int | None = None) -> bytes:
    place = b"" if first_seq is None else b"\0" + str(first_seq).encode()
    return response_id.encode() + b"\0" + tenant.encode() + place


class BackgroundStore(SealedStore):
    info = _INFO

    def __init__(
        self, engine: AsyncEngine, keys: DataKeys, retention_s: float, stale_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        super().__init__(engine, keys, retention_s, clock)
        self.stale_s = stale_s
        self._boxes: dict[tuple[str, str], AESGCM] = {}  # (tenant, response id) -> its box

    async def _sealing(self, tenant: str, response_id: str) -> tuple[str, bytes, AESGCM]:
        dek_id, salt, box = await self.new_box(tenant)
        self._boxes[(tenant, response_id)] = box
        return dek_id, salt, box

    async def _opening(self, conn: AsyncConnection, tenant: str, response_id: str) -> AESGCM | None:
        box = self._boxes.get((tenant, response_id))
        if box is not None:
            return box
        row = (await conn.execute(select(background.c.dek_id, background.c.salt).where(
            background.c.id == response_id, background.c.tenant == tenant))).first()  # fmt: skip
        if row is None:
            return None
        dek = await self._keys.opening(row.dek_id, tenant=tenant)
        return None if dek is None else self.box(dek, bytes(row.salt))

    @classmethod
    def _open(cls, box: AESGCM, sealed: bytes, aad: bytes) -> bytes | None:
        try:
            return cls.open(box, sealed, aad)
        except InvalidTag:
            return None

    async def create(
        self, tenant: str, key_id: str, owner: str, response: dict[str, Any],
        input_items: list[dict[str, Any]], first: Sequence[Event],
    ) -> None:  # fmt: skip
        """A new background response, ``queued``, owned by ``owner``, with its first events."""
        response_id = response["id"]
        dek_id, salt, box = await self._sealing(tenant, response_id)
        plain = orjson.dumps({"response": response, "input_items": input_items})
        now = self._clock()
        async with self._engine.begin() as conn:
            await conn.execute(background.insert().values(
                id=response_id, tenant=tenant, key_id=key_id, status="queued", owner=owner,
                heartbeat_at=now, cancel_requested=False, events=len(first), created_at=now,
                expires_at=now + self._retention_s, dek_id=dek_id, salt=salt,
                sealed=self.seal(box, plain, _aad(response_id, tenant)),
            ))  # fmt: skip
            if first:
                await self._insert_events(conn, box, tenant, response_id, 0, first, now)

    async def _insert_events(
        self, conn: AsyncConnection, box: AESGCM, tenant: str, response_id: str,
        first_seq: int, chunk: Sequence[Event], now: float,
    ) -> None:  # fmt: skip
        plain = orjson.dumps([[name, data.decode()] for name, data in chunk])
        await conn.execute(events.insert().values(
            response_id=response_id, first_seq=first_seq, count=len(chunk), tenant=tenant,
            expires_at=now + self._retention_s,
            sealed=self.seal(box, plain, _aad(response_id, tenant, first_seq)),
        ))  # fmt: skip

    async def write(
        self, tenant: str, response_id: str, owner: str, first_seq: int,
        chunk: Sequence[Event], *, status: str | None = None,
        response: dict[str, Any] | None = None,
    ) -> bool:  # fmt: skip
        """Append ``chunk`` (events ``first_seq``...) and beat the heart; with ``status`` (and
        ``response``, the object as it now stands), move the row to it. Whether a cancel was
        asked for. ``Lost`` when the row is no longer this owner's active response."""
        now = self._clock()
        values: dict[str, Any] = {"heartbeat_at": now, "events": first_seq + len(chunk)}
        if status is not None:
            values["status"] = status
        async with self._engine.begin() as conn:
            box = await self._opening(conn, tenant, response_id)
            if box is None:
                raise Lost(response_id)
            if response is not None:
                row = (await conn.execute(select(background.c.sealed).where(
                    background.c.id == response_id))).first()  # fmt: skip
                kept = (
                    self._open(box, bytes(row.sealed), _aad(response_id, tenant)) if row else None
                )
                items = orjson.loads(kept)["input_items"] if kept else []
                plain = orjson.dumps({"response": response, "input_items": items})
                values["sealed"] = self.seal(box, plain, _aad(response_id, tenant))
            result = await conn.execute(update(background).where(
                background.c.id == response_id, background.c.tenant == tenant,
                background.c.owner == owner, background.c.status.in_(ACTIVE),
                background.c.events == first_seq,
            ).values(**values).returning(background.c.cancel_requested))  # fmt: skip
            found = result.first()
            if found is None:
                self._boxes.pop((tenant, response_id), None)
                raise Lost(response_id)
            if chunk:
                await self._insert_events(conn, box, tenant, response_id, first_seq, chunk, now)
        if status in TERMINAL:
            self._boxes.pop((tenant, response_id), None)
        return bool(found.cancel_requested)

    async def load(self, tenant: str, response_id: str) -> Background | None:
        """The tenant's unexpired background response, or ``None`` (unknown, another
        tenant's, expired, or unreadable: its keys were destroyed)."""
        query = select(background).where(
            background.c.id == response_id, background.c.tenant == tenant,
            background.c.expires_at > self._clock(),
        )  # fmt: skip
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
            if row is None:
                return None
            box = await self._opening(conn, tenant, response_id)
        aad = _aad(response_id, tenant)
        plain = None if box is None else self._open(box, bytes(row.sealed), aad)
        if plain is None:
            return None
        data = orjson.loads(plain)
        response = data["response"]
        if row.status in ACTIVE:  # the sealed object is the queued one until the end
            response = {**response, "status": row.status}
        return Background(response_id, row.key_id, row.status, bool(row.cancel_requested),
                          row.events, response, data["input_items"])  # fmt: skip

    async def events_after(
        self, tenant: str, response_id: str, after: int
    ) -> tuple[str, list[tuple[int, Event]]] | None:
        """The row's status and its events with a sequence number above ``after``, read in
        one transaction (status first: a terminal status means these are all there are).
        ``None`` when the response is not found."""
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(background.c.status, background.c.events).where(
                background.c.id == response_id, background.c.tenant == tenant,
                background.c.expires_at > self._clock()))).first()  # fmt: skip
            if row is None:
                return None
            if row.events <= after + 1:
                return row.status, []
            box = await self._opening(conn, tenant, response_id)
            if box is None:
                return None
            chunks = (await conn.execute(select(events.c.first_seq, events.c.count,
                                                events.c.sealed).where(
                events.c.response_id == response_id, events.c.tenant == tenant,
                events.c.first_seq + events.c.count > after + 1,
            ).order_by(events.c.first_seq))).all()  # fmt: skip
        found: list[tuple[int, Event]] = []
        for chunk in chunks:
            plain = self._open(box, bytes(chunk.sealed), _aad(response_id, tenant,
                                                              chunk.first_seq))  # fmt: skip
            if plain is None:
                return None
            for offset, (name, data) in enumerate(orjson.loads(plain)):
                seq = chunk.first_seq + offset
                if seq > after:
                    found.append((seq, (name, data.encode())))
        return row.status, found

    async def request_cancel(self, tenant: str, response_id: str) -> bool:
        """Ask the owner to stop the response (it reads the flag at its next write);
        whether the response was still active."""
        async with self._engine.begin() as conn:
            result = await conn.execute(update(background).where(
                background.c.id == response_id, background.c.tenant == tenant,
                background.c.status.in_(ACTIVE),
            ).values(cancel_requested=True))  # fmt: skip
        return bool(result.rowcount)

    async def active(self, tenant: str, key_id: str) -> tuple[int, int]:
        """How many background responses are active for the key and for its tenant."""
        query = select(func.count().filter(background.c.key_id == key_id), func.count()).where(
            background.c.tenant == tenant, background.c.status.in_(ACTIVE)
        )
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).one()
        return int(row[0] or 0), int(row[1] or 0)

    async def sweep(self, failed: Callable[[dict[str, Any], int], list[Event]]) -> list[str]:
        """Mark ``failed`` every active response whose owner's heartbeat is older than
        ``stale_s``, appending ``failed(response object, next sequence number)``'s events
        (the terminal ``response.failed``) to its stream; the ids swept."""
        cutoff = self._clock() - self.stale_s
        async with self._engine.connect() as conn:
            stale = (await conn.execute(select(background.c.id, background.c.tenant,
                                               background.c.owner).where(
                background.c.status.in_(ACTIVE), background.c.heartbeat_at < cutoff,
            ))).all()  # fmt: skip
        swept = []
        for row in stale:
            if await self._fail_stale(row.tenant, row.id, row.owner, cutoff, failed):
                swept.append(row.id)
        return swept

    async def _fail_stale(
        self, tenant: str, response_id: str, owner: str, cutoff: float,
        failed: Callable[[dict[str, Any], int], list[Event]],
    ) -> bool:  # fmt: skip
        stuck = await self.load(tenant, response_id)
        if stuck is None or not stuck.active:
            return False
        error = {"code": "server_error",
                 "message": "The gateway replica running this response stopped."}  # fmt: skip
        final = {**stuck.response, "status": "failed", "error": error}
        now = self._clock()
        async with self._engine.begin() as conn:
            box = await self._opening(conn, tenant, response_id)
            if box is None:
                return False
            plain = orjson.dumps({"response": final, "input_items": stuck.input_items})
            chunk = failed(final, stuck.events)
            result = await conn.execute(update(background).where(
                background.c.id == response_id, background.c.owner == owner,
                background.c.status.in_(ACTIVE), background.c.heartbeat_at < cutoff,
                background.c.events == stuck.events,
            ).values(status="failed", heartbeat_at=now, events=stuck.events + len(chunk),
                     sealed=self.seal(box, plain, _aad(response_id, tenant))))  # fmt: skip
            if not result.rowcount:
                return False  # it beat, wrote or ended meanwhile
            await self._insert_events(conn, box, tenant, response_id, stuck.events, chunk, now)
        return True

    async def delete(self, tenant: str, response_id: str) -> bool:
        async with self._engine.begin() as conn:
            result = await conn.execute(delete(background).where(
                background.c.id == response_id, background.c.tenant == tenant))  # fmt: skip
            await conn.execute(delete(events).where(
                events.c.response_id == response_id, events.c.tenant == tenant))  # fmt: skip
        self._boxes.pop((tenant, response_id), None)
        return bool(result.rowcount)

    async def purge_forever(self, every_s: float = EVERY_S) -> None:
        await purge_forever(self.purge, "background responses", every_s)

    async def purge(self) -> int:
        """Delete every expired background response and its events; how many went."""
        now = self._clock()
        async with self._engine.begin() as conn:
            await conn.execute(delete(events).where(events.c.expires_at <= now))
            result = await conn.execute(delete(background).where(and_(
                background.c.expires_at <= now)))  # fmt: skip
        return int(result.rowcount or 0)
