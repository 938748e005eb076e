"""``CHECKPOINT_INTERVAL_MS`` end to end: a gateway publishing one checkpoint per interval in front
of the simulator, a real RFC 3161 TSA (``openssl ts``) and two witness processes: every
checkpoint it publishes gets a stamp and both witnesses' cosignatures (not only the latest), far
fewer checkpoints than records, ``thinkgate ledger verify`` passes, and Go's
``golang.org/x/mod/sumdb/tlog`` follower proves records against the tiles of the interval
log."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from audit.witness import CosignerKey
from gateway.cli.main import main
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from tests.e2e.conftest import Stack, ledger_files
from tests.e2e.test_timestamps import Tsa, tsa  # noqa: F401 - the fixture
from tests.e2e.test_tlog import auth, follow, leaves, tlogfollow  # noqa: F401 - the fixture
from tests.e2e.test_witness import witness
from tests.waiting import eventually

INTERVAL_MS = 100
BURSTS, PER_BURST = 6, 4
REQUESTS = BURSTS * PER_BURST
ROUND_S = 1.0  # stamping and witnessing rounds: several checkpoints come out between two


async def complete(stack: Stack, count: int) -> None:
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        await asyncio.gather(*(client.chat.completions.create(
            model="deepseek-r1", max_tokens=5, messages=[{"role": "user", "content": f"{i}"}],
        ) for i in range(count)))  # fmt: skip


async def checkpoints(stack: Stack) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=stack.root) as client:
        listed = await client.get("/audit/v1/checkpoints", headers=auth(stack),
                                  params={"limit": 1000})  # fmt: skip
    data: list[dict[str, Any]] = listed.json()["data"]
    return data


async def test_every_interval_checkpoint_is_stamped_and_cosigned_and_followed(
    stack_factory: Any, tsa: tuple[Tsa, str], tlogfollow: Path, tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    service, url = tsa
    ensure_keys(Settings(**ledger_files(tmp_path)), create=True)  # the witnesses need its key
    async with witness(tmp_path, "w1") as w1, witness(tmp_path, "w2") as w2:
        configured = [{"url": u, "key": c.verifier_key} for u, c in (w1, w2)]
        stack = await stack_factory(
            checkpoint_interval_ms=INTERVAL_MS, tsa_url=url, tsa_interval_s=ROUND_S,
            tsa_roots_file=service.dir / "ca.pem", witnesses=configured,
            witness_interval_s=ROUND_S,
        )  # fmt: skip
        for burst in range(1, BURSTS + 1):  # each burst its own checkpoint, within a round
            await complete(stack, PER_BURST)

            async def published(size: int = burst * PER_BURST) -> bool:
                return any(c["size"] == size for c in await checkpoints(stack))

            await eventually(published, within_s=5)
        names = [CosignerKey.parse(c.verifier_key).name for _, c in (w1, w2)]

        async def all_done() -> list[dict[str, Any]] | None:
            found = await checkpoints(stack)
            if not found or max(c["size"] for c in found) != REQUESTS:
                return None
            complete_ = all(c["rfc3161"] and all(f"— {n} " in c["note"] for n in names)
                            for c in found)  # fmt: skip
            return found if complete_ else None

        done = await eventually(all_done, within_s=30)
    assert BURSTS <= len(done) < REQUESTS  # per interval, not per commit; each one stamped
    async with httpx.AsyncClient(base_url=stack.root) as client:
        lines = await leaves(client, stack, [0, REQUESTS // 2, REQUESTS - 1])
    oldest = min(done, key=lambda c: c["size"])
    size, root = oldest["note"].split("\n")[1:3]
    out = await follow(tlogfollow, stack, tmp_path, [*lines, f"old {size} {root}"])
    assert out == f"OK size={REQUESTS} proved=3"
    for name, value in {"DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
                        "LEDGER_KEY_FILE": str(tmp_path / "ledger-keys.json"),
                        "SIGNING_KEY_FILE": str(tmp_path / "signing-key.pem"),
                        "CHECKPOINT_INTERVAL_MS": str(INTERVAL_MS)}.items():  # fmt: skip
        monkeypatch.setenv(f"THINKGATE_{name}", value)
    roots = str(service.dir / "ca.pem")
    assert await asyncio.to_thread(main, ["ledger", "verify", "--tsa-roots", roots]) == 0
