"""Stored responses' items, found for ``item_reference`` (``gateway.conversation.store``) against
real data keys in SQLite: an item is found in the one response its id names, only for that
response's tenant, reasoning as its text for the engine and as its key was shown for listing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from audit import migrate
from audit.crypto import FileKeyProvider
from audit.datakeys import DataKeys
from gateway.conversation.store import ResponseStore, Stored, StoredItem
from gateway.db import create_engine, upgrade_schema
from gateway.names.ids import item_id, new_response_id
from tests.clock import FakeClock

RETENTION_S = 3_600.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_767_225_600.0)


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[ResponseStore]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    try:
        await migrate.upgrade(engine)
        await upgrade_schema(engine)
        FileKeyProvider.create(tmp_path / "keys.json")
        keys = DataKeys(engine, FileKeyProvider.load(tmp_path / "keys.json"))
        yield ResponseStore(engine, keys, RETENTION_S, clock=clock)
    finally:
        await engine.dispose()


def stored(sealed_only: bool = False) -> Stored:
    """A response whose key saw its reasoning (or, ``sealed_only``, held it only sealed)."""
    response_id = new_response_id()
    rs, msg, user = (item_id(k, response_id) for k in ("reasoning", "message", "message"))
    shown: dict[str, Any] = {"encrypted_content": "tgr1..."} if sealed_only else {
        "content": [{"type": "reasoning_text", "text": "the trace"}]}  # fmt: skip
    output = [
        {"id": rs, "type": "reasoning", "summary": [], **shown, "status": "completed"},
        {"id": msg, "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
    ]  # fmt: skip
    listed = [{"id": user, "type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "Why?"}]}]  # fmt: skip
    response = {"id": response_id, "object": "response", "output": output}
    return Stored(response_id, "m", response, listed, [], {rs: "the trace"})


ENGINE_REASONING = {"type": "reasoning", "summary": [],
                    "content": [{"type": "reasoning_text", "text": "the trace"}]}  # fmt: skip


@pytest.mark.parametrize("sealed_only", [False, True])
def test_an_items_reasoning_is_its_text_for_the_engine_as_shown_for_listing(
    sealed_only: bool,
) -> None:
    made = stored(sealed_only)
    (reasoning, message) = made.response["output"]
    (user,) = made.input_items
    found = made.items([reasoning["id"], message["id"], user["id"], "msg_other"])
    assert found[reasoning["id"]] == StoredItem(reasoning, {"id": reasoning["id"],
                                                            **ENGINE_REASONING})  # fmt: skip
    assert found[message["id"]] == StoredItem(message, message)
    assert found[user["id"]] == StoredItem(user, user)
    assert "msg_other" not in found


async def test_items_are_found_only_for_their_tenant_while_kept(
    store: ResponseStore, clock: FakeClock
) -> None:
    first, second = stored(), stored(sealed_only=True)
    await store.save("acme", "k1", first, None)
    await store.save("acme", "k2", second, first.id)
    wanted = [first.response["output"][1]["id"], second.response["output"][0]["id"],
              first.input_items[0]["id"]]  # fmt: skip
    found = await store.items("acme", [*wanted, "msg_1", item_id("message", new_response_id())])
    assert sorted(found) == sorted(wanted)
    assert found[wanted[1]].engine["content"][0]["text"] == "the trace"
    assert "content" not in found[wanted[1]].listed  # as its hidden key was shown it
    assert await store.items("globex", wanted) == {}
    await store.delete("acme", first.id)
    assert list(await store.items("acme", wanted)) == [wanted[1]]
    clock.now += RETENTION_S + 1
    assert await store.items("acme", wanted) == {}


async def test_a_response_stored_before_reasoning_was_kept_reads_without_it(
    store: ResponseStore,
) -> None:
    made = stored()
    older = Stored(made.id, made.model, made.response, made.input_items, [])
    await store.save("acme", "k1", older, None)
    reasoning = made.response["output"][0]
    (found,) = (await store.items("acme", [reasoning["id"]])).values()
    assert found.engine == reasoning  # its content as stored: a visible key's text
