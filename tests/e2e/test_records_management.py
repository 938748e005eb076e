"""Retention and legal holds end to end, on a clock the test controls: records sealed 40 days
ago (by a ledger whose wall clock says so) and today's; a hold placed on one tenant's old
days with the CLI; the gateway's own retention round destroys the other tenant's old days and
keeps the held ones; ``ledger verify`` and Go's tlog follower still pass; a shred is refused
while the hold is in force and done once it is released (admin API)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from audit.record import Body, Facts
from gateway.cli.keys import open_store
from gateway.cli.main import main
from gateway.db import create_engine
from gateway.ledger.sink import ensure_keys, open_ledger
from gateway.settings import Settings
from tests.e2e.conftest import StackFactory, ledger_files
from tests.e2e.test_tlog import follow, leaves, tlogfollow  # noqa: F401 - the fixture
from tests.waiting import eventually

DAY = 86400.0
OLD = time.time() - 40 * DAY


async def seed(settings: Settings) -> None:
    """Two records per tenant, sealed 40 days ago (indexes 0-3)."""
    engine = create_engine(settings.database_url)
    try:
        ledger = await open_ledger(settings.ledger, engine, wall=lambda: OLD)
        for i, tenant in enumerate(("acme", "globex", "acme", "globex")):
            await ledger.append(
                Facts(kind="completion", tenant=tenant, key_id="k" * 12, request_id=f"old-{i}",
                      created_at=OLD + i, model="deepseek-r1"),
                Body(messages=[{"role": "user", "content": f"old question {i}"}],
                     content=(f"old answer {i}",)),
            )  # fmt: skip
        await ledger.aclose()
    finally:
        await engine.dispose()


async def cli(monkeypatch: pytest.MonkeyPatch, settings: Settings, *args: str) -> tuple[int, str]:
    """``thinkgate`` with the stack's settings; its exit code and what it printed."""
    for name in ("database_url", "ledger_key_file", "signing_key_file"):
        monkeypatch.setenv(f"THINKGATE_{name.upper()}", str(getattr(settings, name)))
    out = io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            return main(list(args))

    code = await asyncio.to_thread(run)
    return code, out.getvalue()


async def test_retention_destroys_old_days_keeps_held_ones_and_the_log_still_verifies(
    stack_factory: StackFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    tlogfollow: Path,  # noqa: F811
) -> None:  # fmt: skip
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
                        **ledger_files(tmp_path))  # fmt: skip
    ensure_keys(settings.ledger, create=True)
    await seed(settings)
    code, said = await cli(monkeypatch, settings, "ledger", "hold", "add", "--tenant", "globex",
                           "--reason", "case 7", "--until", str(int(OLD + 10)))  # fmt: skip
    assert code == 0, said
    hold_id = said.split(":")[0]
    code, said = await cli(monkeypatch, settings, "ledger", "retention", "set", "--tenant",
                           "acme", "--days", "30")  # fmt: skip
    assert code == 0, said
    future = str(int(time.time() + 400 * DAY))  # would destroy days within retention
    code, said = await cli(monkeypatch, settings, "ledger", "retention", "run", "--now", future)
    assert code == 2 and "future" in said
    # the gateway: every tenant 30 days by default, a retention round every 200 ms
    stack = await stack_factory(retention_days=30, retention_interval_s=0.2)
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        await client.chat.completions.create(
            model="deepseek-r1", messages=[{"role": "user", "content": "new question"}]
        )
    async with open_store(settings) as store:
        everyone, _ = await store.create(tenant="*", role="auditor")
    auditor = {"authorization": f"Bearer {everyone.secret}"}
    async with httpx.AsyncClient(base_url=stack.root, headers=auditor) as http:

        async def body_of(index: int) -> Any:
            return (await http.get(f"/audit/v1/records/{index}")).json()["body"]

        async def acme_destroyed() -> bool:
            return await body_of(0) is None and await body_of(2) is None

        await eventually(acme_destroyed, within_s=10)
        assert await body_of(1) is not None and await body_of(3) is not None  # globex: held
        listed = (await http.get("/audit/v1/records", params={"tenant": "globex"})).json()
        held = {r["request_id"]: r["held_by"] for r in listed["data"]}
        assert held["old-1"] == [hold_id] and held["old-3"] == [hold_id]
        today = (await http.get("/audit/v1/records", params={"tenant": "acme"})).json()
        newest = max(r["index"] for r in today["data"] if r["kind"] == "completion")
        assert await body_of(newest) is not None  # today's record is within retention
        kept = (await http.get("/audit/v1/retention")).json()["data"]
        by_tenant = {t["tenant"]: t for t in kept}
        assert by_tenant["acme"]["days"] == 30 and by_tenant["acme"]["own"]
        assert [h["id"] for h in by_tenant["globex"]["holds"]] == [hold_id]

        async def retention_runs() -> list[Any]:  # signed once the destruction is a barrier
            found = (await http.get("/audit/v1/records", params={"kind": "retention"})).json()
            return list(found["data"])

        runs = await eventually(retention_runs, within_s=10)
        assert [r["tenant"] for r in runs] == ["acme"]  # globex's old day was held
        lines = await leaves(http, stack, [0, 2, newest])  # acme's (the auditor key's)
    # the tree, the checkpoints and Go's tlog follower are untouched by destroyed keys
    code, said = await cli(monkeypatch, settings, "ledger", "verify")
    assert code == 0, said
    out = await follow(tlogfollow, stack, tmp_path, lines)
    assert out.startswith("OK ") and out.endswith("proved=3")
    # a shred of the held tenant is refused, naming the hold; released, it goes through
    code, said = await cli(monkeypatch, settings, "ledger", "shred", "--tenant", "globex")
    assert code == 1 and hold_id in said and "case 7" in said
    admin = {"authorization": f"Bearer {stack.keys['admin']}"}
    async with httpx.AsyncClient(base_url=stack.root, headers=admin) as http:
        released = await http.post(f"/admin/v1/holds/{hold_id}/release",
                                   json={"reason": "case closed"})  # fmt: skip
        assert released.status_code == 200 and released.json()["released_at"] is not None
        again = await http.post(f"/admin/v1/holds/{hold_id}/release", json={})
        assert again.status_code == 404
    code, said = await cli(monkeypatch, settings, "ledger", "shred", "--tenant", "globex")
    assert code == 0, said


async def test_holds_and_retention_through_the_admin_api(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack = await stack_factory()
    admin = {"authorization": f"Bearer {stack.keys['admin']}"}
    async with httpx.AsyncClient(base_url=stack.root, headers=admin) as http:
        placed = await http.post("/admin/v1/holds", json={
            "tenant": "acme", "reason": "SEC inquiry 2026-11", "key_id": "key-1",
            "since": "2026-11-01T00:00:00Z"})  # fmt: skip
        assert placed.status_code == 201, placed.text
        hold = placed.json()
        assert hold["since"] == 1_793_491_200.0 and hold["until"] is None
        bad = await http.post("/admin/v1/holds", json={"tenant": "acme", "reason": "a\nb"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "reason"
        assert (await http.put("/admin/v1/retention/acme", json={"days": 0})).status_code == 400
        assert (await http.put("/admin/v1/retention/acme", json={"days": 180})).status_code == 200
        listed = (await http.get("/admin/v1/holds", params={"tenant": "acme"})).json()["data"]
        assert [h["id"] for h in listed] == [hold["id"]]
        kept = (await http.get("/admin/v1/retention")).json()
        assert kept["data"] == [{"object": "retention", "tenant": "acme", "days": 180}]
        as_client = await http.get("/admin/v1/holds", headers={
            "authorization": f"Bearer {stack.keys['visible']}"})  # fmt: skip
        assert as_client.status_code == 403
    auditor = {"authorization": f"Bearer {stack.keys['auditor']}"}  # tenant acme
    async with httpx.AsyncClient(base_url=stack.root, headers=auditor) as http:
        seen = (await http.get("/audit/v1/retention")).json()["data"]
        kinds = (await http.get("/audit/v1/records", params={"kind": "hold"})).json()["data"]
    assert seen[0]["tenant"] == "acme" and seen[0]["days"] == 180
    assert [h["reason"] for h in seen[0]["holds"]] == ["SEC inquiry 2026-11"]
    assert [r["request_id"] for r in kinds] == [hold["id"]]  # the hold is a record itself
