"""The conversation store (``gateway.conversation.conversations``) against real data keys, on
SQLite and on PostgreSQL (each test runs on both): items in the order added, pages and
cursors, tenant scoping, expiry and purge, deletion with the items, duplicate ids, nothing
readable at rest, the associated data binding each sealed value to its row, and a shredded or
unknown data key reading as not found."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from audit import migrate
from audit.crypto import FileKeyProvider
from audit.datakeys import DataKeys
from gateway.conversation.conversations import (
    ConversationStore,
    DuplicateItem,
    UnknownCursor,
    conversation_items,
    conversations,
)
from gateway.db import create_engine, upgrade_schema
from tests.clock import FakeClock

RETENTION_S = 3_600.0


@dataclass
class Fixture:
    store: ConversationStore
    engine: AsyncEngine
    keys: DataKeys
    clock: FakeClock


@pytest.fixture
async def db(database_url: str, tmp_path: Path) -> AsyncIterator[Fixture]:
    engine = create_engine(database_url)
    try:
        await migrate.upgrade(engine)
        await upgrade_schema(engine)
        FileKeyProvider.create(tmp_path / "keys.json")
        keys = DataKeys(engine, FileKeyProvider.load(tmp_path / "keys.json"))
        clock = FakeClock(1_767_225_600.0)
        yield Fixture(ConversationStore(engine, keys, RETENTION_S, clock=clock), engine, keys,
                      clock)  # fmt: skip
    finally:
        await engine.dispose()


def message(text: str, item_id: str, role: str = "user") -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "id": item_id, "status": "completed", "role": role,
            "content": [{"type": part, "text": text}]}  # fmt: skip


def pairs(*items: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(item, item) for item in items]


def ids(items: list[Any]) -> list[str]:
    return [item.listed["id"] if hasattr(item, "listed") else item["id"] for item in items]


async def count(engine: AsyncEngine, table: Any) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_items_come_back_in_the_order_added_in_pages_either_way(db: Fixture) -> None:
    three = pairs(*(message(f"m{i}", f"msg_{i}") for i in range(3)))
    made = await db.store.create("acme", {"topic": "sky"}, three)
    assert made.id.startswith("conv_") and len(made.id) == 5 + 48
    assert made.created_at == int(db.clock.now) and made.metadata == {"topic": "sky"}
    # ids that sort against the order of insertion: the order is ``seq``'s, not the ids'
    assert await db.store.append(
        "acme", made.id, pairs(message("z", "msg_z"), message("a", "msg_a"))
    )
    order = ["msg_0", "msg_1", "msg_2", "msg_z", "msg_a"]
    assert ids(await db.store.engine_items("acme", made.id) or []) == order
    first = await db.store.page("acme", made.id, limit=2, order="asc")
    assert first is not None and ids(first.items) == order[:2] and first.has_more
    rest = await db.store.page("acme", made.id, limit=3, order="asc", after="msg_1")
    assert rest is not None and ids(rest.items) == order[2:] and not rest.has_more
    newest = await db.store.page("acme", made.id, limit=20)
    assert newest is not None and ids(newest.items) == order[::-1] and not newest.has_more
    older = await db.store.page("acme", made.id, limit=1, order="desc", after="msg_z")
    assert older is not None and ids(older.items) == ["msg_2"] and older.has_more
    with pytest.raises(UnknownCursor):
        await db.store.page("acme", made.id, limit=5, after="msg_nope")
    found = await db.store.item("acme", made.id, "msg_z")
    assert found is not None and found.listed == message("z", "msg_z")


async def test_an_item_keeps_its_engine_form_apart_from_the_listed_one(db: Fixture) -> None:
    made = await db.store.create("acme", {})
    listed = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "tgr1x"}
    engine = {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "the trace"}]}  # fmt: skip
    assert await db.store.append("acme", made.id, [(listed, engine), *pairs(message("hi", "m"))])
    page = await db.store.page("acme", made.id, limit=5, order="asc")
    assert page is not None and [i.listed for i in page.items] == [listed, message("hi", "m")]
    assert await db.store.engine_items("acme", made.id) == [engine, message("hi", "m")]


async def test_another_tenant_finds_nothing_and_changes_nothing(db: Fixture) -> None:
    made = await db.store.create("acme", {"k": "v"}, pairs(message("secret", "msg_1")))
    store = db.store
    assert await store.get("globex", made.id) is None
    assert not await store.exists("globex", made.id)
    assert await store.page("globex", made.id, limit=5) is None
    assert await store.item("globex", made.id, "msg_1") is None
    assert await store.engine_items("globex", made.id) is None
    assert not await store.append("globex", made.id, pairs(message("x", "msg_2")))
    assert await store.update("globex", made.id, {"k": "w"}) is None
    assert not await store.delete_item("globex", made.id, "msg_1")
    assert not await store.delete("globex", made.id)
    assert await store.get("acme", made.id) == made  # untouched
    assert ids(await store.engine_items("acme", made.id) or []) == ["msg_1"]
    assert await store.get("acme", "conv_unknown") is None
    assert await store.get("acme", "conv_" + "0" * 500) is None


async def test_expired_conversations_are_never_returned_and_are_purged(db: Fixture) -> None:
    made = await db.store.create("acme", {}, pairs(message("a", "msg_1")))
    db.clock.now += RETENTION_S / 2
    assert await db.store.append("acme", made.id, pairs(message("b", "msg_2")))
    kept = await db.store.create("acme", {})
    assert await db.store.purge() == 0
    db.clock.now += RETENTION_S / 2 + 1  # the first one's retention is over; items go with it
    assert await db.store.get("acme", made.id) is None
    assert await db.store.page("acme", made.id, limit=5) is None
    assert await db.store.item("acme", made.id, "msg_2") is None
    assert not await db.store.append("acme", made.id, pairs(message("c", "msg_3")))
    assert not await db.store.delete("acme", made.id)
    assert await db.store.purge() == 1
    assert await count(db.engine, conversations) == 1
    assert await count(db.engine, conversation_items) == 0
    assert await db.store.get("acme", kept.id) == kept


async def test_deleting_a_conversation_deletes_its_items(db: Fixture) -> None:
    made = await db.store.create("acme", {}, pairs(message("a", "msg_1"), message("b", "msg_2")))
    other = await db.store.create("acme", {}, pairs(message("c", "msg_1")))
    assert await db.store.delete_item("acme", made.id, "msg_1")
    assert not await db.store.delete_item("acme", made.id, "msg_1")
    assert ids(await db.store.engine_items("acme", made.id) or []) == ["msg_2"]
    assert await db.store.delete("acme", made.id)
    assert not await db.store.delete("acme", made.id)
    assert await db.store.get("acme", made.id) is None
    assert await count(db.engine, conversation_items) == 1  # the other conversation's
    assert ids(await db.store.engine_items("acme", other.id) or []) == ["msg_1"]


async def test_an_item_id_already_in_the_conversation_adds_nothing(db: Fixture) -> None:
    made = await db.store.create("acme", {}, pairs(message("a", "msg_1")))
    with pytest.raises(DuplicateItem) as raised:
        await db.store.append("acme", made.id, pairs(message("b", "msg_2"), message("c", "msg_1")))
    assert raised.value.item_id == "msg_1"
    with pytest.raises(DuplicateItem):
        await db.store.append("acme", made.id, pairs(message("b", "msg_3"), message("c", "msg_3")))
    with pytest.raises(DuplicateItem):
        await db.store.create("acme", {}, pairs(message("b", "msg_4"), message("c", "msg_4")))
    assert ids(await db.store.engine_items("acme", made.id) or []) == ["msg_1"]
    assert await count(db.engine, conversations) == 1
    other = await db.store.create("acme", {}, pairs(message("same id, another one", "msg_1")))
    assert ids(await db.store.engine_items("acme", other.id) or []) == ["msg_1"]


async def test_nothing_is_readable_at_rest(db: Fixture) -> None:
    secrets = ["PLAINTEXT-IN-A-MESSAGE", "PLAINTEXT-REASONING", "PLAINTEXT-METADATA"]
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": secrets[1]}]}  # fmt: skip
    made = await db.store.create("acme", {"note": secrets[2]},
                                 pairs(message(secrets[0], "msg_1"), reasoning))  # fmt: skip
    assert await db.store.update("acme", made.id, {"note": secrets[2] + "!"}) is not None
    async with db.engine.connect() as conn:
        rows = [*(await conn.execute(select(conversations))).all(),
                *(await conn.execute(select(conversation_items))).all()]  # fmt: skip
    assert len(rows) == 3
    for row in rows:
        raw = b"".join(v if isinstance(v, bytes) else str(v).encode() for v in row)
        for secret in secrets:
            assert secret.encode() not in raw
        assert b"input_text" not in raw and b"reasoning_text" not in raw
    got = await db.store.get("acme", made.id)
    assert got is not None and got.metadata == {"note": secrets[2] + "!"}


async def test_a_sealed_value_moved_to_another_row_does_not_open(db: Fixture) -> None:
    made = await db.store.create("acme", {}, pairs(message("a", "msg_1"), message("b", "msg_2")))
    i = conversation_items.c
    async with db.engine.begin() as conn:
        first = (await conn.execute(select(i.sealed).where(i.item_id == "msg_1"))).scalar_one()
        await conn.execute(update(conversation_items).where(i.item_id == "msg_2")
                           .values(sealed=first))  # fmt: skip
    assert await db.store.item("acme", made.id, "msg_1") is not None
    assert await db.store.item("acme", made.id, "msg_2") is None
    assert await db.store.engine_items("acme", made.id) is None


async def test_a_shredded_or_unknown_key_reads_as_not_found(db: Fixture) -> None:
    shredded = await db.store.create("acme", {}, pairs(message("a", "msg_1")))
    unknown = await db.store.create("globex", {}, pairs(message("b", "msg_1")))
    await db.keys.shred("acme", db.clock.now)
    async with db.engine.begin() as conn:
        await conn.execute(update(conversations).where(conversations.c.id == unknown.id)
                           .values(dek_id="dek-0000000000000000"))  # fmt: skip
    for tenant, made in (("acme", shredded), ("globex", unknown)):
        assert await db.store.get(tenant, made.id) is None
        assert not await db.store.exists(tenant, made.id)
        assert await db.store.page(tenant, made.id, limit=5) is None
        assert await db.store.item(tenant, made.id, "msg_1") is None
        assert await db.store.engine_items(tenant, made.id) is None
        assert await db.store.update(tenant, made.id, {"k": "v"}) is None
        assert not await db.store.append(tenant, made.id, pairs(message("c", "msg_2")))
    fresh = await db.store.create("acme", {}, pairs(message("after the shred", "msg_1")))
    assert ids(await db.store.engine_items("acme", fresh.id) or []) == ["msg_1"]
