"""Stored responses (``store: true``): tenant-scoped, encrypted at rest, kept for a while.

``ResponseStore`` keeps what ``GET /v1/responses/{id}``, ``/input_items`` and a later
``previous_response_id`` need, one row per response in ``gateway_responses``:

- Clear columns: the id, tenant, key id, model, creation and expiry times, the previous
  response's id, and the data key id. Nothing a prompt or an answer says.
- Sealed: ``{"response", "input_items", "conversation", "reasoning"}`` as JSON, with
  AES-256-GCM under ``HKDF-SHA256(the tenant's ledger data key, salt,
  "thinkgate/responses/v1")``, the id and the tenant as associated data. ``conversation`` is
  the chat messages a follow-up replays (this request's turns after the instructions, which
  the reference does not carry over, and the answer, its reasoning in ``reasoning``);
  ``reasoning`` is the text of each reasoning item of the output, by its id (what an
  ``item_reference`` to it gives the engine). Shredding the tenant makes every row
  unreadable: it then reads as gone (404).
- Tenant-scoped: every lookup is by id *and* tenant, so another tenant's id is a 404 exactly
  like an unknown one. An item (``items``, for ``item_reference``) is looked up in the one
  response its id names, the same way.
- Retention: ``RESPONSES_RETENTION_S`` (default 30 days) from creation; an expired row is never
  returned and ``purge`` deletes them (the app runs it every ten minutes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from sqlalchemy import Column, Float, Index, LargeBinary, String, Table, delete, select

from gateway.conversation.retention import EVERY_S, purge_forever
from gateway.conversation.sealedstore import SealedStore
from gateway.db import metadata
from gateway.names.ids import response_of

_INFO = b"thinkgate/responses/v1"

responses = Table(
    "gateway_responses",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("key_id", String(32), nullable=False),
    Column("model", String(256), nullable=False),
    Column("previous_response_id", String(64), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("dek_id", String(64), nullable=False),
    Column("salt", LargeBinary, nullable=False),
    Column("sealed", LargeBinary, nullable=False),
    Index("ix_gateway_responses_expires_at", "expires_at"),
)


@dataclass(frozen=True, slots=True)
class StoredItem:
    """An item of a stored response: as listed (the key that made it was shown it so), and
    as the engine reads it when an ``item_reference`` names it (reasoning with its text)."""

    listed: dict[str, Any]
    engine: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored response, opened."""

    id: str
    model: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]
    reasoning: dict[str, str] = field(default_factory=dict)  # reasoning item id -> its text

    def items(self, ids: list[str]) -> dict[str, StoredItem]:
        """The input and output items of this response that ``ids`` name, by id. An output
        reasoning item reads as its text for the engine, whatever its key was shown (the
        same rule as ``previous_response_id``: the client may hold it only sealed)."""
        listed = [*self.input_items, *(self.response.get("output") or [])]
        by_id = {item.get("id"): item for item in listed if isinstance(item, dict)}
        found = {}
        for item_id in ids:
            item = by_id.get(item_id)
            if item is not None:
                found[item_id] = StoredItem(item, self._engine(item))
        return found

    def _engine(self, item: dict[str, Any]) -> dict[str, Any]:
        text = self.reasoning.get(item["id"]) if item.get("type") == "reasoning" else None
        if text is None:
            return item
        return {"id": item["id"], "type": "reasoning", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def _aad(response_id: str, tenant: str) -> bytes:
    return response_id.encode() + b"\0" + tenant.encode()


class ResponseStore(SealedStore):
    info = _INFO

    async def save(self, tenant: str, key_id: str, stored: Stored, previous: str | None) -> None:
        dek_id, salt, box = await self.new_box(tenant)
        plain = orjson.dumps({"response": stored.response, "input_items": stored.input_items,
                              "conversation": stored.conversation,
                              "reasoning": stored.reasoning})  # fmt: skip
        sealed = self.seal(box, plain, _aad(stored.id, tenant))
        now = self._clock()
        async with self._engine.begin() as conn:
            await conn.execute(responses.insert().values(
                id=stored.id, tenant=tenant, key_id=key_id, model=stored.model,
                previous_response_id=previous, created_at=now,
                expires_at=now + self._retention_s, dek_id=dek_id, salt=salt, sealed=sealed,
            ))  # fmt: skip

    async def load(self, tenant: str, response_id: str) -> Stored | None:
        """The tenant's unexpired response ``response_id``, or ``None`` (unknown, another
        tenant's, expired, or unreadable because its keys were destroyed)."""
        query = select(responses.c.model, responses.c.dek_id, responses.c.salt,
                       responses.c.sealed).where(
            responses.c.id == response_id, responses.c.tenant == tenant,
            responses.c.expires_at > self._clock(),
        )  # fmt: skip
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
        if row is None:
            return None
        dek = await self._keys.opening(row.dek_id, tenant=tenant)
        if dek is None:
            return None
        try:
            box = self.box(dek, bytes(row.salt))
            plain = self.open(box, bytes(row.sealed), _aad(response_id, tenant))
        except InvalidTag:
            return None
        data = orjson.loads(plain)
        return Stored(response_id, row.model, data["response"], data["input_items"],
                      data["conversation"], data.get("reasoning") or {})  # fmt: skip

    async def items(self, tenant: str, ids: list[str]) -> dict[str, StoredItem]:
        """The items of the tenant's stored responses that ``ids`` name, by id. An id is
        looked up in the one response it names (``gateway.api.items.item_id``); one not found
        (unknown, not made here, another tenant's, expired, deleted) is absent, whatever the
        reason."""
        wanted: dict[str, list[str]] = {}
        for item_id in ids:
            response_id = response_of(item_id)
            if response_id is not None:
                wanted.setdefault(response_id, []).append(item_id)
        found: dict[str, StoredItem] = {}
        for response_id, named in wanted.items():
            stored = await self.load(tenant, response_id)
            if stored is not None:
                found.update(stored.items(named))
        return found

    async def delete(self, tenant: str, response_id: str) -> bool:
        async with self._engine.begin() as conn:
            result = await conn.execute(
                delete(responses).where(
                    responses.c.id == response_id, responses.c.tenant == tenant,
                    responses.c.expires_at > self._clock(),
                )
            )  # fmt: skip
        return bool(result.rowcount)

    async def purge_forever(self, every_s: float = EVERY_S) -> None:
        await purge_forever(self.purge, "stored responses", every_s)

    async def purge(self) -> int:
        """Delete every expired response; how many went."""
        async with self._engine.begin() as conn:
            result = await conn.execute(
                delete(responses).where(responses.c.expires_at <= self._clock())
            )
        return int(result.rowcount or 0)
