"""Write-ahead intents through the gateway (SQLite ledger, the simulator as the engine): a
stream's intent is in the database, sealed, while its answer streams and gone once its record
is; an intent that can be stored nowhere refuses the stream before any byte of it; a whole
answer needs none. The two-replica kill is ``tests/e2e/test_replica_lost.py``."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import Stack, spool_cannot_take
from tests.e2e.test_audit_api import (
    MESSAGES,
    assert_error,
    audit_client,
    database,
    only_record,
    post_chat,
    raw_sql,
)
from tests.e2e.test_audit_api import MODEL as AUDIT_MODEL


def intent_rows(tmp_path: Path) -> list[Any]:
    with sqlite3.connect(database(tmp_path)) as conn:
        return conn.execute("SELECT request_id, owner, ciphertext FROM ledger_intents").fetchall()


QUESTION = MESSAGES[0]["content"]
# every streaming API, with the same question
STREAMS = {
    "chat/completions": {"messages": MESSAGES, "max_tokens": 60},
    "completions": {"prompt": QUESTION, "max_tokens": 60},
    "responses": {"input": QUESTION, "max_output_tokens": 60},
    "messages": {"messages": MESSAGES, "max_tokens": 60},
}


@pytest.mark.parametrize("path", list(STREAMS))
async def test_a_streams_intent_is_stored_sealed_while_it_streams_and_replaced_by_its_record(
    stack_factory: Any, tmp_path: Path, path: str
) -> None:
    stack: Stack = await stack_factory(sim=SimConfig(ttft_ms=20, itl_ms=30))
    body = {"model": AUDIT_MODEL, "stream": True, **STREAMS[path]}
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with (
        httpx.AsyncClient(timeout=20) as client,
        client.stream("POST", f"{stack.url}/{path}", json=body, headers=headers) as live,
    ):
        assert live.status_code == 200
        request_id = live.headers["x-request-id"]
        chunks = live.aiter_raw()
        await anext(chunks)  # the first bytes are out: the intent is durable by now
        [row] = intent_rows(tmp_path)
        assert row[0] == request_id
        assert QUESTION.encode() not in row[2]  # sealed
        async for _ in chunks:
            pass
    assert intent_rows(tmp_path) == []  # its record took its place
    async with audit_client(stack) as audit:
        record = await only_record(audit, request_id)
    assert record["header"]["status"] == "ok"


async def test_a_stream_whose_intent_cannot_be_stored_is_refused_before_any_byte(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack: Stack = await stack_factory(audit_fail="closed", sim=SimConfig(ttft_ms=50, itl_ms=50))
    assert (await post_chat(stack)).status_code == 200
    spool_cannot_take(tmp_path / "spool.log")  # the spool cannot take anything
    with raw_sql(tmp_path) as conn:  # off the loop: the gateway shares it
        await asyncio.to_thread(
            conn.execute, "ALTER TABLE ledger_intents RENAME TO ledger_intents_away"
        )
        try:
            refused = await post_chat(stack, stream=True)
        finally:
            await asyncio.to_thread(
                conn.execute, "ALTER TABLE ledger_intents_away RENAME TO ledger_intents"
            )
    assert_error(refused, 503, "ledger_unavailable")  # a status, not a stream cut short
    assert stack.sim is not None  # the engine's request was closed, not read out
    await stack.sim.state.sim.wait_for(lambda sim: sim.cancelled >= 1, timeout=5)


async def test_a_whole_answer_writes_no_intent(stack_factory: Any, tmp_path: Path) -> None:
    stack: Stack = await stack_factory()
    assert (await post_chat(stack)).status_code == 200  # the ledger's tables are made
    with raw_sql(tmp_path) as conn:  # off the loop: the gateway shares it
        await asyncio.to_thread(
            conn.execute,
            "CREATE TRIGGER no_intents BEFORE INSERT ON ledger_intents "
            "BEGIN SELECT RAISE(ABORT, 'no intent expected'); END",
        )
    response = await post_chat(stack)
    assert response.status_code == 200, response.text
    async with audit_client(stack) as audit:
        await only_record(audit, response.headers["x-request-id"])
