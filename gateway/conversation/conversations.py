"""Conversations (``/v1/conversations``): tenant-scoped, encrypted at rest, kept for a while.

``ConversationStore`` keeps a conversation in ``gateway_conversations`` (clear: id, tenant,
creation and expiry times, data key id, salt; sealed: its metadata) and its items in
``gateway_conversation_items`` (clear: an autoincrement ``seq``, the order, since SQLite's rowid
alias takes ``max + 1`` and PostgreSQL's ``BIGSERIAL`` only grows; the conversation id, tenant,
item id and times; sealed: ``{"listed", "engine"}``, the item as clients list it and as the
engine is given it when a response continues the conversation, ``engine`` ``null`` when the
same, as for every item added through the API).

Sealing: AES-256-GCM, a random 12-byte nonce per value, under one key per conversation,
``HKDF-SHA256(the tenant's ledger data key, the conversation's salt,
"thinkgate/conversations/v1")`` (a conversation never nears the 2^32 encryptions one random-
nonce key may see, NIST SP 800-38D §8.3). The associated data binds each value to its place,
``"meta" 0 id 0 tenant`` or ``"item" 0 id 0 tenant 0 item id``: a value moved to another row
does not open.

Rules:

- Every lookup is by id *and* tenant; another tenant's id reads exactly like an unknown,
  expired, deleted or unreadable one (keys shredded, a value altered): ``None`` / ``False``.
- Retention: ``RESPONSES_RETENTION_S`` from the conversation's creation, for it and every item
  (an item added later expires with it); expired rows are never returned, ``purge`` deletes them.
- Deleting a conversation deletes its items in the same transaction. Appending locks the
  conversation's row (``FOR UPDATE`` on PostgreSQL; SQLite has one writer): no item is added to
  a conversation being deleted.
- An item id is unique within its conversation: one already there (or twice in one call)
  raises ``DuplicateItem`` and nothing of the call is added.
- A request never holds two pooled connections: the data key is looked up between queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    Select,
    String,
    Table,
    UniqueConstraint,
    delete,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from audit.sqlasync import AsyncConnection
from gateway.conversation.retention import EVERY_S, purge_forever
from gateway.conversation.sealedstore import SealedStore
from gateway.conversation.store import StoredItem
from gateway.db import metadata
from gateway.names.ids import new_conversation_id

_INFO = b"thinkgate/conversations/v1"
MAX_ID_CHARS, MAX_ITEM_ID_CHARS = 64, 256

conversations = Table(
    "gateway_conversations",
    metadata,
    Column("id", String(MAX_ID_CHARS), primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("dek_id", String(64), nullable=False),
    Column("salt", LargeBinary, nullable=False),
    Column("sealed", LargeBinary, nullable=False),
    Index("ix_gateway_conversations_expires_at", "expires_at"),
)

_SEQ = BigInteger().with_variant(Integer(), "sqlite")  # SQLite: the rowid itself
conversation_items = Table(
    "gateway_conversation_items",
    metadata,
    Column("seq", _SEQ, primary_key=True, autoincrement=True),
    Column("conversation_id", String(MAX_ID_CHARS), nullable=False),
    Column("tenant", String(64), nullable=False),
    Column("item_id", String(MAX_ITEM_ID_CHARS), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("sealed", LargeBinary, nullable=False),
    UniqueConstraint("conversation_id", "item_id", name="uq_gateway_conversation_items_item"),
    Index("ix_gateway_conversation_items_order", "conversation_id", "seq"),
    Index("ix_gateway_conversation_items_expires_at", "expires_at"),
)

Pair = tuple[dict[str, Any], dict[str, Any]]  # an item as (listed, engine)
Order = Literal["asc", "desc"]


class DuplicateItem(Exception):
    """An item id the conversation already has, or that one call names twice."""

    def __init__(self, item_id: str) -> None:
        super().__init__("an item with this id is already in the conversation")
        self.item_id = item_id


class UnknownCursor(LookupError):
    """``after`` names no item of the conversation."""


@dataclass(frozen=True, slots=True)
class StoredConversation:
    id: str
    created_at: int  # Unix seconds
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)
class Page:
    """Items of a conversation in the order asked, and whether more follow."""

    items: list[StoredItem]
    has_more: bool


@dataclass(frozen=True, slots=True)
class _Opened:
    """A conversation found and opened: its clear columns, its metadata, and the AEAD that
    opens and seals its values."""

    id: str
    tenant: str
    dek_id: str
    created_at: float
    expires_at: float
    box: AESGCM
    meta: dict[str, str]

    def conversation(self) -> StoredConversation:
        return StoredConversation(self.id, int(self.created_at), self.meta)

    def item(self, item_id: str, sealed: bytes) -> StoredItem:
        found = orjson.loads(
            SealedStore.open(self.box, sealed, _aad(b"item", self.id, self.tenant, item_id))
        )
        listed = found["listed"]
        return StoredItem(listed, listed if found["engine"] is None else found["engine"])

    def seal_item(self, listed: dict[str, Any], engine: dict[str, Any]) -> bytes:
        plain = orjson.dumps({"listed": listed, "engine": None if engine == listed else engine})
        return SealedStore.seal(self.box, plain, _aad(b"item", self.id, self.tenant, listed["id"]))

    def seal_meta(self, meta: dict[str, str]) -> bytes:
        return SealedStore.seal(self.box, orjson.dumps(meta), _aad(b"meta", self.id, self.tenant))


def _aad(kind: bytes, *parts: str) -> bytes:
    return b"\0".join((kind, *(p.encode() for p in parts)))


def _distinct(items: Sequence[Pair]) -> None:
    seen: set[str] = set()
    for listed, _engine in items:
        if listed["id"] in seen:
            raise DuplicateItem(listed["id"])
        seen.add(listed["id"])


class ConversationStore(SealedStore):
    info = _INFO

    async def create(
        self, tenant: str, meta: dict[str, str], items: Sequence[Pair] = ()
    ) -> StoredConversation:
        """A new conversation with ``items`` (each ``listed`` with its ``id``), in order."""
        _distinct(items)
        dek_id, salt, box = await self.new_box(tenant)
        now = self._clock()
        opened = _Opened(new_conversation_id(), tenant, dek_id, now, now + self._retention_s,
                         box, meta)  # fmt: skip
        async with self._engine.begin() as conn:
            await conn.execute(conversations.insert().values(
                id=opened.id, tenant=tenant, created_at=now, expires_at=opened.expires_at,
                dek_id=dek_id, salt=salt, sealed=opened.seal_meta(meta)))  # fmt: skip
            await self._insert(conn, opened, items)
        return opened.conversation()

    async def get(self, tenant: str, conversation_id: str) -> StoredConversation | None:
        opened = await self._opened(tenant, conversation_id)
        return opened.conversation() if opened else None

    async def exists(self, tenant: str, conversation_id: str) -> bool:
        return await self._opened(tenant, conversation_id) is not None

    async def update(
        self, tenant: str, conversation_id: str, meta: dict[str, str]
    ) -> StoredConversation | None:
        """The conversation with its metadata replaced, or ``None`` when not found."""
        opened = await self._opened(tenant, conversation_id)
        if opened is None:
            return None
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(conversations).where(*self._same(opened))
                .values(sealed=opened.seal_meta(meta))
            )  # fmt: skip
        if not result.rowcount:
            return None  # deleted meanwhile
        return StoredConversation(opened.id, int(opened.created_at), meta)

    async def delete(self, tenant: str, conversation_id: str) -> bool:
        """Deletes the conversation and its items; whether it was there to delete."""
        c, i = conversations.c, conversation_items.c
        async with self._engine.begin() as conn:
            gone = await conn.execute(delete(conversations).where(
                c.id == conversation_id, c.tenant == tenant, c.expires_at > self._clock(),
            ))  # fmt: skip
            if gone.rowcount:
                await conn.execute(delete(conversation_items).where(
                    i.conversation_id == conversation_id, i.tenant == tenant))  # fmt: skip
        return bool(gone.rowcount)

    async def append(self, tenant: str, conversation_id: str, items: Sequence[Pair]) -> bool:
        """Adds ``items`` (``(listed, engine)``, each ``listed`` with its ``id``) after the
        conversation's, in order; ``False`` when the conversation is not found.
        ``DuplicateItem`` (nothing added) for an id it already has."""
        _distinct(items)
        opened = await self._opened(tenant, conversation_id)
        if opened is None:
            return False
        async with self._engine.begin() as conn:
            locked = select(conversations.c.id).where(*self._same(opened)).with_for_update()
            if (await conn.execute(locked)).first() is None:
                return False  # deleted or expired meanwhile
            await self._insert(conn, opened, items)
        return True

    async def item(self, tenant: str, conversation_id: str, item_id: str) -> StoredItem | None:
        query = self._items(tenant, conversation_id).where(conversation_items.c.item_id == item_id)
        found = await self._read(tenant, conversation_id, query)
        if found is None or not found[1]:
            return None
        return found[1][0]

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> bool:
        i = conversation_items.c
        async with self._engine.begin() as conn:
            result = await conn.execute(delete(conversation_items).where(
                i.conversation_id == conversation_id, i.tenant == tenant, i.item_id == item_id,
                i.expires_at > self._clock()))  # fmt: skip
        return bool(result.rowcount)

    async def page(
        self, tenant: str, conversation_id: str, *, limit: int, order: Order = "desc",
        after: str | None = None,
    ) -> Page | None:  # fmt: skip
        """Up to ``limit`` items in ``order``, those after the item ``after`` names when
        given (``UnknownCursor`` when it names none); ``None`` when not found."""
        i = conversation_items.c
        query = self._items(tenant, conversation_id)
        if after is not None:
            cursor = (
                select(i.seq).where(i.conversation_id == conversation_id, i.tenant == tenant,
                                    i.item_id == after).scalar_subquery()
            )  # fmt: skip
            query = query.where(i.seq > cursor if order == "asc" else i.seq < cursor)
        query = query.order_by(i.seq.asc() if order == "asc" else i.seq.desc()).limit(limit + 1)
        found = await self._read(tenant, conversation_id, query, cursor=after)
        if found is None:
            return None
        return Page(found[1][:limit], len(found[1]) > limit)

    async def engine_items(self, tenant: str, conversation_id: str) -> list[dict[str, Any]] | None:
        """Every item, oldest first, as the engine is given it; ``None`` when not found."""
        query = self._items(tenant, conversation_id).order_by(conversation_items.c.seq.asc())
        found = await self._read(tenant, conversation_id, query)
        return None if found is None else [item.engine for item in found[1]]

    async def purge_forever(self, every_s: float = EVERY_S) -> None:
        await purge_forever(self.purge, "conversations", every_s)

    async def purge(self) -> int:
        """Delete every expired conversation and item; how many conversations went."""
        now = self._clock()
        async with self._engine.begin() as conn:
            result = await conn.execute(
                delete(conversations).where(conversations.c.expires_at <= now)
            )
            await conn.execute(
                delete(conversation_items).where(conversation_items.c.expires_at <= now)
            )
        return int(result.rowcount or 0)

    # -- inside ----------------------------------------------------------------------------

    def _find(self, tenant: str, conversation_id: str) -> Select[Any]:
        c = conversations.c
        return select(conversations).where(
            c.id == conversation_id, c.tenant == tenant, c.expires_at > self._clock()
        )

    def _items(self, tenant: str, conversation_id: str) -> Select[Any]:
        i = conversation_items.c
        return select(i.item_id, i.sealed).where(
            i.conversation_id == conversation_id, i.tenant == tenant,
            i.expires_at > self._clock(),
        )  # fmt: skip

    def _same(self, opened: _Opened) -> tuple[Any, ...]:
        """The conversation's row, unexpired, still under the key it was opened with."""
        c = conversations.c
        return (c.id == opened.id, c.tenant == opened.tenant, c.dek_id == opened.dek_id,
                c.expires_at > self._clock())  # fmt: skip

    async def _opened(self, tenant: str, conversation_id: str) -> _Opened | None:
        if len(conversation_id) > MAX_ID_CHARS:
            return None
        async with self._engine.connect() as conn:
            row = (await conn.execute(self._find(tenant, conversation_id))).first()
        return await self._key(row)

    async def _key(self, row: Any) -> _Opened | None:
        """The conversation opened (called holding no connection); ``None`` when its key is
        gone or its metadata does not open under it."""
        if row is None:
            return None
        dek = await self._keys.opening(row.dek_id, tenant=row.tenant)
        if dek is None:
            return None
        box = self.box(dek, bytes(row.salt))
        try:
            meta = orjson.loads(
                self.open(box, bytes(row.sealed), _aad(b"meta", row.id, row.tenant))
            )
        except (InvalidTag, orjson.JSONDecodeError):
            return None
        return _Opened(row.id, row.tenant, row.dek_id, row.created_at, row.expires_at, box, meta)

    async def _read(
        self, tenant: str, conversation_id: str, query: Select[Any], *, cursor: str | None = None
    ) -> tuple[_Opened, list[StoredItem]] | None:
        """The conversation and the items ``query`` selects, opened; ``None`` when not found
        or when an item does not open (altered: the conversation reads as gone)."""
        if len(conversation_id) > MAX_ID_CHARS:
            return None
        i = conversation_items.c
        async with self._engine.connect() as conn:
            row = (await conn.execute(self._find(tenant, conversation_id))).first()
            rows = (await conn.execute(query)).all() if row is not None else []
            missing = False
            if row is not None and cursor is not None:
                named = self._items(tenant, conversation_id).where(i.item_id == cursor)
                missing = (await conn.execute(named)).first() is None
        opened = await self._key(row)
        if opened is None:
            return None
        if missing:
            raise UnknownCursor(cursor)
        try:
            return opened, [opened.item(r.item_id, bytes(r.sealed)) for r in rows]
        except (InvalidTag, orjson.JSONDecodeError):
            return None

    async def _insert(self, conn: AsyncConnection, opened: _Opened, items: Sequence[Pair]) -> None:
        if not items:
            return
        i = conversation_items.c
        ids = [listed["id"] for listed, _ in items]
        taken = select(i.item_id).where(i.conversation_id == opened.id, i.item_id.in_(ids))
        if (first := (await conn.execute(taken)).first()) is not None:
            raise DuplicateItem(first.item_id)
        now = self._clock()
        rows = [{"conversation_id": opened.id, "tenant": opened.tenant, "item_id": listed["id"],
                 "created_at": now, "expires_at": opened.expires_at,
                 "sealed": opened.seal_item(listed, engine)}
                for listed, engine in items]  # fmt: skip
        try:
            for row in rows:  # one by one: ``seq`` follows the order given
                await conn.execute(conversation_items.insert().values(**row))
        except IntegrityError:  # added by another request meanwhile
            raise DuplicateItem(ids[0]) from None
