"""Files (``/v1/files``): batch input files clients upload and the output and error files
batches produce, kept in the gateway's database under the tenant's keys.

``gateway_files`` holds one row per file: clear columns are the id, tenant, the key that made
it, ``purpose``, size and times; the file's name and its content are sealed (AES-256-GCM
under ``HKDF-SHA256(the tenant's data key of the day, salt, "thinkgate/files/v1")``, bound
to the file's id, tenant and part), so retention, legal hold and shredding, which act on the
tenant's data keys, act on files as on stored responses: a destroyed key leaves the file
unreadable, and it reads as gone. Files are the tenant's: any of its keys may read one.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    and_,
    delete,
    or_,
    select,
)

from audit.datakeys import DataKeys
from audit.sqlasync import AsyncConnection, AsyncEngine
from gateway.conversation.retention import EVERY_S, purge_forever
from gateway.conversation.sealedstore import SealedStore
from gateway.db import metadata

files = Table(
    "gateway_files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("key_id", String(32), nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("dek_id", String(64), nullable=False),
    Column("salt", LargeBinary, nullable=False),
    Column("name", LargeBinary, nullable=False),  # sealed
    Column("content", LargeBinary, nullable=False),  # sealed
    Index("ix_gateway_files_tenant", "tenant", "created_at"),
    Index("ix_gateway_files_expires_at", "expires_at"),
)
PURPOSES = ("batch", "batch_output")
# what describing a file reads (``StoredFile``, its name sealed)
_DESCRIBED = (files.c.id, files.c.purpose, files.c.bytes, files.c.created_at, files.c.dek_id,
              files.c.salt, files.c.name)  # fmt: skip


async def past(conn: AsyncConnection, table: Table, tenant: str, cursor: str, newer: bool) -> Any:
    """The rows of ``table`` (the tenant's, ordered by ``created_at`` then ``id``) past the row
    ``cursor`` names: newer or older; ``None`` when there is no such row (no filter)."""
    at = (await conn.execute(select(table.c.created_at).where(
        table.c.id == cursor, table.c.tenant == tenant))).scalar()  # fmt: skip
    if at is None:
        return None
    if newer:
        return or_(table.c.created_at > at, and_(table.c.created_at == at, table.c.id > cursor))
    return or_(table.c.created_at < at, and_(table.c.created_at == at, table.c.id < cursor))


@dataclass(frozen=True, slots=True)
class StoredFile:
    id: str
    purpose: str
    bytes: int
    created_at: float
    filename: str

    def to_json(self) -> dict[str, Any]:
        """OpenAI's file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": int(self.created_at),
            "expires_at": None,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def _aad(file_id: str, tenant: str, part: bytes) -> bytes:
    return file_id.encode() + b"\0" + tenant.encode() + b"\0" + part


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


class FileStore(SealedStore):
    info = b"thinkgate/files/v1"

    def __init__(
        self,
        engine: AsyncEngine,
        keys: DataKeys,
        retention_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(engine, keys, retention_s, clock)

    async def rows(
        self,
        tenant: str,
        key_id: str,
        purpose: str,
        filename: str,
        content: bytes,
        file_id: str | None = None,
    ) -> tuple[StoredFile, dict[str, Any]]:
        """A new file's object and the row that stores it (for a caller that inserts it in
        its own transaction, as a batch's end does)."""
        file_id = file_id or new_file_id()
        dek_id, salt, box = await self.new_box(tenant)
        now = self._clock()
        row = {
            "id": file_id,
            "tenant": tenant,
            "key_id": key_id,
            "purpose": purpose,
            "bytes": len(content),
            "created_at": now,
            "expires_at": now + self._retention_s,
            "dek_id": dek_id,
            "salt": salt,
            "name": self.seal(box, filename.encode(), _aad(file_id, tenant, b"name")),
            "content": self.seal(box, content, _aad(file_id, tenant, b"content")),
        }
        return StoredFile(file_id, purpose, len(content), now, filename), row

    async def create(
        self, tenant: str, key_id: str, purpose: str, filename: str, content: bytes
    ) -> StoredFile:
        stored, row = await self.rows(tenant, key_id, purpose, filename, content)
        async with self._engine.begin() as conn:
            await conn.execute(files.insert().values(**row))
        return stored

    async def _box(self, row: Any, tenant: str) -> Any:
        dek = await self._keys.opening(row.dek_id, tenant=tenant)
        return None if dek is None else self.box(dek, bytes(row.salt))

    def _opened(self, box: Any, sealed: bytes, aad: bytes) -> bytes | None:
        try:
            return self.open(box, sealed, aad)
        except InvalidTag:
            return None

    async def _find(self, conn: AsyncConnection, tenant: str, file_id: str, *columns: Any) -> Any:
        query = select(*_DESCRIBED, *columns).where(
            files.c.id == file_id, files.c.tenant == tenant, files.c.expires_at > self._clock()
        )
        return (await conn.execute(query)).first()

    async def _described(self, row: Any, tenant: str) -> StoredFile | None:
        box = await self._box(row, tenant)
        name = (
            None
            if box is None
            else self._opened(box, bytes(row.name), _aad(row.id, tenant, b"name"))
        )
        if name is None:
            return None  # its key was destroyed: it reads as gone
        return StoredFile(row.id, row.purpose, row.bytes, row.created_at, name.decode())

    async def get(self, tenant: str, file_id: str) -> StoredFile | None:
        """The tenant's unexpired, readable file; ``None`` otherwise."""
        async with self._engine.connect() as conn:
            row = await self._find(conn, tenant, file_id)
        return None if row is None else await self._described(row, tenant)

    async def content(self, tenant: str, file_id: str) -> tuple[StoredFile, bytes] | None:
        async with self._engine.connect() as conn:
            row = await self._find(conn, tenant, file_id, files.c.content)
        if row is None:
            return None
        described = await self._described(row, tenant)
        box = await self._box(row, tenant)
        if described is None or box is None:
            return None
        plain = self._opened(box, bytes(row.content), _aad(file_id, tenant, b"content"))
        return None if plain is None else (described, plain)

    async def list(
        self,
        tenant: str,
        *,
        purpose: str | None,
        limit: int,
        after: str | None,
        ascending: bool,
    ) -> tuple[list[StoredFile], bool]:
        """A page of the tenant's files by creation time, and whether more follow."""
        query = select(*_DESCRIBED).where(files.c.tenant == tenant,
                                          files.c.expires_at > self._clock())  # fmt: skip
        if purpose is not None:
            query = query.where(files.c.purpose == purpose)
        async with self._engine.connect() as conn:
            if after is not None:
                beyond = await past(conn, files, tenant, after, newer=ascending)
                if beyond is not None:
                    query = query.where(beyond)
            order = (files.c.created_at, files.c.id)
            query = query.order_by(*(order if ascending else (c.desc() for c in order)))
            rows = (await conn.execute(query.limit(limit + 1))).all()
        found = [f for row in rows[:limit] if (f := await self._described(row, tenant))]
        return found, len(rows) > limit

    async def delete(self, tenant: str, file_id: str) -> bool:
        async with self._engine.begin() as conn:
            result = await conn.execute(
                delete(files).where(files.c.id == file_id, files.c.tenant == tenant)
            )
        return bool(result.rowcount)

    async def purge_forever(self, every_s: float = EVERY_S) -> None:
        await purge_forever(self.purge, "files", every_s)

    async def purge(self) -> int:
        async with self._engine.begin() as conn:
            result = await conn.execute(delete(files).where(files.c.expires_at <= self._clock()))
        return int(result.rowcount or 0)
