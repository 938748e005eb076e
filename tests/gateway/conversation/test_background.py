"""``BackgroundStore`` (``gateway.conversation.background``) on SQLite and on real PostgreSQL,
with real data keys: events kept in order and sealed, ownership checked on every write, the
sweep of a silent owner's responses, cancel requests, tenant scoping, retention."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import select

from audit import migrate
from audit.crypto import FileKeyProvider
from audit.datakeys import DataKeys
from gateway.conversation.background import BackgroundStore, Event, Lost, background, events
from gateway.conversation.visibility import for_key_event
from gateway.db import create_engine, upgrade_schema
from tests.clock import FakeClock

RETENTION_S, STALE_S = 3_600.0, 30.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_767_225_600.0)


@pytest.fixture
async def store(
    database_url: str, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[BackgroundStore]:
    engine = create_engine(database_url)
    try:
        await migrate.upgrade(engine)
        await upgrade_schema(engine)
        FileKeyProvider.create(tmp_path / "keys.json")
        keys = DataKeys(engine, FileKeyProvider.load(tmp_path / "keys.json"))
        yield BackgroundStore(engine, keys, RETENTION_S, STALE_S, clock=clock)
    finally:
        await engine.dispose()


def event(seq: int, name: str = "response.output_text.delta", **body: Any) -> Event:
    return name, orjson.dumps({"type": name, "sequence_number": seq, **body})


def response(response_id: str, status: str = "queued") -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": status, "output": []}


async def started(store: BackgroundStore, rid: str = "resp_a", tenant: str = "acme") -> None:
    first = [event(0, "response.created"), event(1, "response.queued")]
    await store.create(tenant, "k1", "replica-1", response(rid), [{"id": "msg_1"}], first)


async def test_events_come_back_in_order_after_any_point_and_sealed_at_rest(
    store: BackgroundStore,
) -> None:
    await started(store)
    secret = "the-secret-answer-text"
    await store.write("acme", "resp_a", "replica-1", 2, [event(2, delta=secret), event(3)],
                      status="in_progress")  # fmt: skip
    await store.write("acme", "resp_a", "replica-1", 4, [event(4)])
    found = await store.events_after("acme", "resp_a", 2)
    assert found is not None
    status, after = found
    assert status == "in_progress" and [seq for seq, _ in after] == [3, 4]
    everything = await store.events_after("acme", "resp_a", -1)
    assert everything is not None and [s for s, _ in everything[1]] == [0, 1, 2, 3, 4]
    assert everything[1][2][1] == event(2, delta=secret)  # the bytes as written
    async with store._engine.connect() as conn:  # what is at rest
        rows = [bytes(r.sealed) for r in (await conn.execute(select(events.c.sealed))).all()]
        rows += [bytes(r.sealed) for r in (await conn.execute(select(background.c.sealed))).all()]
    assert rows and not any(secret.encode() in r or b"msg_1" in r for r in rows)
    loaded = await store.load("acme", "resp_a")
    assert loaded is not None and loaded.status == loaded.response["status"] == "in_progress"
    assert loaded.input_items == [{"id": "msg_1"}] and loaded.events == 5


async def test_another_tenant_and_an_unknown_id_read_as_nothing(store: BackgroundStore) -> None:
    await started(store)
    assert await store.load("globex", "resp_a") is None
    assert await store.events_after("globex", "resp_a", -1) is None
    assert await store.load("acme", "resp_unknown") is None
    assert not await store.request_cancel("globex", "resp_a")
    assert not await store.delete("globex", "resp_a")


async def test_only_the_owner_writes_and_only_in_sequence(store: BackgroundStore) -> None:
    await started(store)
    with pytest.raises(Lost):
        await store.write("acme", "resp_a", "replica-2", 2, [event(2)])  # not its own
    with pytest.raises(Lost):
        await store.write("acme", "resp_a", "replica-1", 5, [event(5)])  # a hole
    final = response("resp_a", "completed")
    await store.write("acme", "resp_a", "replica-1", 2, [event(2, "response.completed")],
                      status="completed", response=final)  # fmt: skip
    with pytest.raises(Lost):  # ended: nothing more
        await store.write("acme", "resp_a", "replica-1", 3, [event(3)])
    loaded = await store.load("acme", "resp_a")
    assert loaded is not None and loaded.response == final and not loaded.active


async def test_a_cancel_request_reaches_the_owner_at_its_next_write(
    store: BackgroundStore,
) -> None:
    await started(store)
    assert not await store.write("acme", "resp_a", "replica-1", 2, [])
    assert await store.request_cancel("acme", "resp_a")
    assert await store.write("acme", "resp_a", "replica-1", 2, [])


async def test_a_silent_owners_response_is_swept_failed_with_a_terminal_event(
    store: BackgroundStore, clock: FakeClock
) -> None:
    await started(store, "resp_a")
    await started(store, "resp_b")
    clock.now += STALE_S - 1
    await store.write("acme", "resp_b", "replica-1", 2, [])  # resp_b's owner beats
    clock.now += 2

    def failed(final: dict[str, Any], seq: int) -> list[Event]:
        return [event(seq, "response.failed", response=final)]

    assert await store.sweep(failed) == ["resp_a"]
    swept = await store.load("acme", "resp_a")
    assert swept is not None and swept.status == "failed"
    assert swept.response["error"]["code"] == "server_error"
    found = await store.events_after("acme", "resp_a", 1)
    assert found is not None and found[0] == "failed"
    assert [name for _, (name, _) in found[1]] == ["response.failed"]
    with pytest.raises(Lost):  # the owner comes back: no longer its own
        await store.write("acme", "resp_a", "replica-1", 2, [event(2)])
    assert await store.sweep(failed) == []  # once


async def test_limits_count_active_responses_per_key_and_tenant(store: BackgroundStore) -> None:
    await started(store, "resp_a")
    await started(store, "resp_b")
    await store.create("acme", "k2", "replica-1", response("resp_c"), [], [])
    assert await store.active("acme", "k1") == (2, 3)
    await store.write("acme", "resp_a", "replica-1", 2, [], status="cancelled",
                      response=response("resp_a", "cancelled"))  # fmt: skip
    assert await store.active("acme", "k1") == (1, 2)
    assert await store.active("globex", "k1") == (0, 0)


async def test_expired_responses_are_not_served_and_are_purged(
    store: BackgroundStore, clock: FakeClock
) -> None:
    await started(store)
    clock.now += RETENTION_S + 1
    assert await store.load("acme", "resp_a") is None
    assert await store.purge() == 1
    async with store._engine.connect() as conn:  # what is at rest
        assert not (await conn.execute(select(events.c.response_id))).all()


def test_a_hidden_key_replays_no_reasoning_event_and_other_events_unchanged() -> None:
    reasoning_item = {"id": "rs_1", "type": "reasoning", "summary": [],
                      "content": [{"type": "reasoning_text", "text": "trace"}]}  # fmt: skip
    sealed_item = {**reasoning_item, "encrypted_content": "tgr1..."}
    text = orjson.dumps({"type": "response.output_text.delta", "delta": 'answer_text"'})
    assert for_key_event("response.output_text.delta", text, False) == text
    assert for_key_event("response.reasoning_text.delta", b'{"delta":"trace"}', False) is None
    added = orjson.dumps({"type": "response.output_item.added", "item": reasoning_item})
    assert for_key_event("response.output_item.added", added, False) is None
    assert for_key_event("response.output_item.added", added, True) == added
    part = orjson.dumps({"type": "response.content_part.added",
                         "part": {"type": "reasoning_text", "text": ""}})  # fmt: skip
    assert for_key_event("response.content_part.added", part, False) is None
    done = orjson.dumps({"type": "response.output_item.done", "item": sealed_item})
    kept = orjson.loads(for_key_event("response.output_item.done", done, False) or b"")
    assert kept["item"] == {"id": "rs_1", "type": "reasoning", "summary": [],
                            "encrypted_content": "tgr1..."}  # fmt: skip
    final = orjson.dumps({"type": "response.completed", "response": {
        "output": [reasoning_item, {"type": "message"}]}})  # fmt: skip
    shown = orjson.loads(for_key_event("response.completed", final, False) or b"")
    assert shown["response"]["output"] == [{"type": "message"}]
    assert b"trace" not in orjson.dumps(shown)
