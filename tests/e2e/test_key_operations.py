"""Key operations on a running gateway, each run by the real CLI in another process against the
gateway's own database and key file: a KEK rotation costs no request (the gateway reads the new
file), a key file the gateway cannot use makes it refuse *before* any engine is asked and recover
by itself once the file is right, and a shred is honoured within ``ACTIVE_TTL_S``: new records
are sealed under a fresh data key, readable."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from audit.datakeys import ACTIVE_TTL_S
from gateway.side.sim.app import SimApp
from tests.e2e.conftest import Stack

QUESTION: Any = [{"role": "user", "content": "hi"}]


async def cli(tmp_path: Path, *argv: str, key_file: Path | None = None) -> str:
    """``thinkgate ledger ARGV`` on the stack's files, in a process of its own, waited for
    without blocking this event loop: the gateway under test runs on it and may hold
    SQLite's write lock between two of its turns."""
    env = {**os.environ,
           "THINKGATE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
           "THINKGATE_LEDGER_KEY_FILE": str(key_file or tmp_path / "ledger-keys.json"),
           "THINKGATE_SIGNING_KEY_FILE": str(tmp_path / "signing-key.pem"),
           "THINKGATE_AUDIT_SPOOL_FILE": str(tmp_path / "cli-spool.log")}  # fmt: skip
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "ledger", *argv, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(done.communicate(), timeout=60)
    assert done.returncode == 0, err.decode()
    return out.decode()


async def ask(stack: Stack, *, stream: bool = False) -> str:
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        if stream:
            chunks = await client.chat.completions.create(
                model="deepseek-r1", messages=QUESTION, stream=True, max_tokens=400
            )
            return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        whole = await client.chat.completions.create(
            model="deepseek-r1", messages=QUESTION, max_tokens=400
        )
        return whole.choices[0].message.content or ""


def auditor(stack: Stack) -> dict[str, str]:
    return {"authorization": f"Bearer {stack.keys['auditor']}"}


async def records(stack: Stack) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as client:
        got = await client.get(f"{stack.root}/audit/v1/records", params={"limit": 500},
                               headers=auditor(stack))  # fmt: skip
    rows: list[dict[str, Any]] = got.json()["data"]
    return [r for r in rows if r["header"]["kind"] == "completion"]


async def readable(stack: Stack, index: int) -> bool:
    async with httpx.AsyncClient() as client:
        got = await client.get(f"{stack.root}/audit/v1/records/{index}", headers=auditor(stack))
    return got.status_code == 200 and got.json().get("body") is not None


async def test_a_kek_rotation_costs_no_request(stack_factory: Any, tmp_path: Path) -> None:
    stack = await stack_factory()
    await ask(stack)
    out = await cli(tmp_path, "rotate-kek")
    assert "re-wrapped" in out
    deadline = time.monotonic() + 3 * ACTIVE_TTL_S  # past the cached key's lifetime, twice
    asked = 0
    while time.monotonic() < deadline:
        assert await ask(stack, stream=asked % 2 == 1)  # no 500, no stream cut short
        asked += 1
    rows = await records(stack)
    assert len(rows) == asked + 1 and all(r["header"]["status"] == "ok" for r in rows)
    assert await readable(stack, rows[-1]["index"])


async def test_keys_it_cannot_open_make_it_refuse_before_the_engine_then_recover(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await stack_factory()
    assert isinstance(stack.sim, SimApp)
    await ask(stack)
    elsewhere = tmp_path / "elsewhere-keys.json"
    shutil.copy(tmp_path / "ledger-keys.json", elsewhere)
    await cli(tmp_path, "rotate-kek", key_file=elsewhere)  # the data keys now need a KEK it lacks
    async with httpx.AsyncClient(timeout=10) as client:
        deadline = time.monotonic() + 5
        while (await client.get(f"{stack.root}/readyz")).status_code == 200:
            assert time.monotonic() < deadline, "readiness never noticed the keys"
            await ask(stack)  # the cached key still seals: nothing is lost meanwhile
            await asyncio.sleep(0.05)  # pacing the probe; the condition is the readiness
        asked = len(stack.sim.sim.received)
        refused = await client.post(f"{stack.url}/chat/completions", json={
            "model": "deepseek-r1", "messages": QUESTION},
            headers={"authorization": f"Bearer {stack.keys['visible']}"})  # fmt: skip
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "ledger_unavailable"
        assert len(stack.sim.sim.received) == asked  # refused before any engine was asked
        shutil.copy(elsewhere, tmp_path / "ledger-keys.json")  # the operator rolls the file out
        deadline = time.monotonic() + 5
        while (await client.get(f"{stack.root}/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "never recovered"
            await asyncio.sleep(0.05)
    assert await ask(stack)
    rows = await records(stack)
    assert all(r["header"]["status"] == "ok" for r in rows)
    assert await readable(stack, rows[-1]["index"])


async def test_a_shred_in_another_process_gives_new_records_a_fresh_key(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await stack_factory()
    await ask(stack)
    [first] = await records(stack)
    await cli(tmp_path, "shred", "--tenant", "acme")
    past = time.monotonic() + ACTIVE_TTL_S  # the documented bound: no process's cache outlives
    while True:  # requests begun before it may be sealed under either key; the first past it
        began = time.monotonic()
        await ask(stack)
        latest = (await records(stack))[-1]
        if began > past:
            break
    assert latest["header"]["dek"] != first["header"]["dek"], "past ACTIVE_TTL_S, the old key"
    assert await readable(stack, latest["index"])
    assert not await readable(stack, first["index"])
