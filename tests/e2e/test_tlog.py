"""Following the log as a third party: the C2SP tlog-tiles API (``gateway.routes.tlog``) read
by Go's own ``golang.org/x/mod/sumdb/tlog`` and ``note`` (Debian's golang-golang-x-mod-dev,
built once per session with no module proxy), the tile layout under growth, entry bundles and
their access rule, every stored checkpoint, and the friction fixes (no trailing newline, a size
past the log named as such)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from audit.record import Body, Facts
from gateway.cli.ledger import opened
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from tests.e2e.conftest import Stack, ledger_files
from tests.e2e.test_audit_api import new_key

GO_SOURCE = Path(__file__).parent / "tlogfollow" / "main.go"
X_MOD = Path("/usr/share/gocode/src/golang.org/x/mod")
RECORDS = 600  # two full leaf tiles, a partial one of 88, and two level-1 nodes


@pytest.fixture(scope="session")
def tlogfollow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go follower, built once: x/mod from Debian's source tree (a ``replace``), x/tools
    (which x/mod's go.mod names, but no package here uses) replaced by an empty module."""
    go = shutil.which("go")
    if go is None or not X_MOD.is_dir():
        pytest.fail("Go and x/mod are not installed (apt-get install golang-go "
                    "golang-golang-x-mod-dev; .ci/run does it)")  # fmt: skip
    build = tmp_path_factory.mktemp("tlogfollow")
    shutil.copy(GO_SOURCE, build / "main.go")
    (build / "tools-stub").mkdir()
    (build / "tools-stub" / "go.mod").write_text("module golang.org/x/tools\n\ngo 1.17\n")
    (build / "go.mod").write_text(
        "module tlogfollow\n\ngo 1.19\n\nrequire golang.org/x/mod v0.0.0\n\n"
        f"replace golang.org/x/mod => {X_MOD}\n\nreplace golang.org/x/tools => ./tools-stub\n"
    )
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off", "GOSUMDB": "off",
           "GOCACHE": str(build / "cache"), "GOPATH": str(build / "gopath")}  # fmt: skip
    subprocess.run([go, "build", "-o", "tlogfollow", "."], cwd=build, env=env, check=True,
                   timeout=300)  # fmt: skip
    return build / "tlogfollow"


async def populate(tmp_path: Path, count: int, batches: int = 3) -> None:
    """``count`` records written straight into the ledger the stack will open, in
    ``batches`` commits (so several checkpoints exist)."""
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
                        **ledger_files(tmp_path))  # fmt: skip
    ensure_keys(settings.ledger, create=True)
    async with opened(settings) as ledger:
        per = count // batches
        for batch in range(batches):
            first = batch * per
            last = count if batch == batches - 1 else first + per
            await asyncio.gather(*(ledger.append(
                Facts(kind="completion", tenant="acme", key_id="k" * 12,
                      request_id=f"req-{i}", created_at=1.7e9 + i, model="m"),
                Body(messages=[{"role": "user", "content": f"question {i}"}],
                     content=(f"answer {i}",)),
            ) for i in range(first, last)))  # fmt: skip


@pytest.fixture
async def log(stack_factory: Any, tmp_path: Path) -> Stack:
    await populate(tmp_path, RECORDS)
    stack: Stack = await stack_factory()
    return stack


def auth(stack: Stack, key: str = "auditor") -> dict[str, str]:
    return {"authorization": f"Bearer {stack.keys.get(key, key)}"}


async def leaves(client: httpx.AsyncClient, stack: Stack, indexes: list[int]) -> list[str]:
    """``<index> <leaf hash>`` lines, each leaf recomputed from the record's raw bytes."""
    out = []
    for index in indexes:
        raw = (await client.get(f"/audit/v1/records/{index}/raw", headers=auth(stack))).json()
        header, cipher = base64.b64decode(raw["header"]), base64.b64decode(raw["ciphertext"])
        leaf = hashlib.sha256(b"\x00" + len(header).to_bytes(4, "big") + header + cipher)
        out.append(f"{index} {base64.b64encode(leaf.digest()).decode()}")
    return out


async def run_follower(
    tlogfollow: Path, stack: Stack, tmp_path: Path, lines: list[str]
) -> tuple[int | None, str, str]:
    """The Go follower's exit code, stdout and stderr, given the log's URL, its public key
    (fetched with no credentials: all public) and ``lines`` to prove."""
    async with httpx.AsyncClient(base_url=stack.root) as client:
        key = await client.get("/tlog/public-key")
    (tmp_path / "log.pub").write_text(key.text)
    proc = await asyncio.create_subprocess_exec(
        str(tlogfollow), f"{stack.root}/tlog", str(tmp_path / "log.pub"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate("\n".join(lines).encode()), timeout=60)
    return proc.returncode, out.decode().strip(), err.decode()


async def follow(tlogfollow: Path, stack: Stack, tmp_path: Path, lines: list[str]) -> str:
    code, out, err = await run_follower(tlogfollow, stack, tmp_path, lines)
    assert code == 0, err
    return out


async def test_a_go_monitor_follows_the_log_from_tiles_alone(
    log: Stack, tlogfollow: Path, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=log.root) as client:
        lines = await leaves(client, log, [0, 1, 255, 256, 511, 512, 599])
        older = (await client.get("/audit/v1/checkpoints", headers=auth(log))).json()["data"][0]
    size, root = older["note"].split("\n")[1:3]
    assert int(size) < RECORDS
    out = await follow(tlogfollow, log, tmp_path, [*lines, f"old {size} {root}"])
    assert out == f"OK size={RECORDS} proved=7"


async def test_a_go_monitor_refuses_a_wrong_leaf(
    log: Stack, tlogfollow: Path, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=log.root) as client:
        (line,) = await leaves(client, log, [300])
    wrong = line.replace("300 ", "301 ")  # record 300's leaf claimed for 301
    code, _, err = await run_follower(tlogfollow, log, tmp_path, [wrong])
    assert code == 1 and "record 301" in err


async def test_tiles_are_the_stored_nodes_in_the_specs_layout(log: Stack) -> None:
    async with httpx.AsyncClient(base_url=log.root) as client:
        listed = (await client.get("/audit/v1/records", headers=auth(log),
                                   params={"limit": 1000})).json()["data"]  # fmt: skip
        leaf_hashes = b"".join(base64.b64decode(r["leaf_hash"]) for r in listed)
        assert len(leaf_hashes) == 32 * RECORDS
        full = await client.get("/tlog/tile/0/001")
        partial = await client.get("/tlog/tile/0/002.p/88")
        older = await client.get("/tlog/tile/0/001.p/5")
        level1 = await client.get("/tlog/tile/1/000.p/2")
        for missing in (
            "/tlog/tile/0/002",
            "/tlog/tile/0/002.p/89",
            "/tlog/tile/1/000",
            "/tlog/tile/2/000.p/1",
            "/tlog/tile/0/2",
            "/tlog/tile/0/x000/001",
        ):
            response = await client.get(missing)
            assert response.status_code == 404, missing
            assert response.json()["error"]["code"] == "tile_not_found"
    assert full.content == leaf_hashes[256 * 32 : 512 * 32]
    assert full.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert partial.content == leaf_hashes[512 * 32 :]
    assert partial.headers["cache-control"] == "no-cache"
    assert older.content == leaf_hashes[256 * 32 : 261 * 32]
    # level 1 holds the roots of the two complete 256-leaf subtrees
    assert level1.content[:32] == subtree_root(leaf_hashes[: 256 * 32])
    assert level1.content[32:] == subtree_root(leaf_hashes[256 * 32 : 512 * 32])


def subtree_root(hashes: bytes) -> bytes:
    level = [hashes[i : i + 32] for i in range(0, len(hashes), 32)]
    while len(level) > 1:
        pairs = zip(level[::2], level[1::2], strict=True)
        level = [hashlib.sha256(b"\x01" + a + b).digest() for a, b in pairs]
    return level[0]


async def test_tiles_under_growth_widen_and_never_change(
    log: Stack, tlogfollow: Path, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=log.root) as client:
        before = {path: (await client.get(path)).content
                  for path in ("/tlog/tile/0/000", "/tlog/tile/0/001", "/tlog/tile/0/002.p/88",
                               "/tlog/tile/1/000.p/2")}  # fmt: skip
    async with openai.AsyncOpenAI(base_url=log.url, api_key=log.keys["visible"],
                                  max_retries=0) as sdk:  # fmt: skip
        await asyncio.gather(
            *(
                sdk.chat.completions.create(
                    model="deepseek-r1",
                    max_tokens=5,
                    messages=[{"role": "user", "content": f"q{i}"}],
                )
                for i in range(12)
            )
        )  # fmt: skip  concurrent appends
    async with httpx.AsyncClient(base_url=log.root) as client:
        after = {path: (await client.get(path)).content for path in before}
        wider = await client.get("/tlog/tile/0/002.p/100")
    assert after == before  # full tiles and old partial widths keep their bytes
    assert wider.status_code == 200 and wider.content[: 88 * 32] == before["/tlog/tile/0/002.p/88"]
    assert await follow(tlogfollow, log, tmp_path, []) == f"OK size={RECORDS + 12} proved=0"


async def test_entry_bundles_are_for_all_tenant_auditors_or_public_when_configured(
    log: Stack, tmp_path: Path, stack_factory: Any
) -> None:
    star = await new_key(tmp_path, "*", "auditor")
    async with httpx.AsyncClient(base_url=log.root) as client:
        anonymous = await client.get("/tlog/tile/entries/002.p/88")
        scoped = await client.get("/tlog/tile/entries/002.p/88", headers=auth(log))
        bundle = await client.get("/tlog/tile/entries/002.p/88", headers=auth(log, star))
        hashes = (await client.get("/tlog/tile/0/002.p/88")).content
    assert anonymous.status_code == 401 and scoped.status_code == 403
    entries, at = [], 0
    while at < len(bundle.content):
        size = int.from_bytes(bundle.content[at : at + 2], "big")
        entries.append(bundle.content[at + 2 : at + 2 + size])
        at += 2 + size
    assert len(entries) == 88
    assert b"".join(hashlib.sha256(b"\x00" + e).digest() for e in entries) == hashes
    public = await stack_factory(tlog_public_entries=True)
    async with httpx.AsyncClient(base_url=public.root) as client:
        await client.post(f"{public.url}/chat/completions", headers=auth(public, "visible"),
                          json={"model": "deepseek-r1", "max_tokens": 5,
                                "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert (await client.get("/tlog/tile/entries/000.p/1")).status_code == 200


async def test_every_checkpoint_is_served_and_the_friction_is_gone(log: Stack) -> None:
    async with httpx.AsyncClient(base_url=log.root) as client:
        listed = (await client.get("/audit/v1/checkpoints", headers=auth(log),
                                   params={"limit": 2})).json()  # fmt: skip
        sizes = [c["size"] for c in listed["data"]]
        rest = (await client.get("/audit/v1/checkpoints", headers=auth(log),
                                 params={"size": listed["next_size"]})).json()  # fmt: skip
        exact = await client.get("/audit/v1/checkpoint", headers=auth(log),
                                 params={"size": sizes[0]})  # fmt: skip
        above = await client.get("/audit/v1/checkpoint", headers=auth(log),
                                 params={"size": sizes[0] - 1 or 1})  # fmt: skip
        beyond = await client.get("/audit/v1/checkpoint", headers=auth(log),
                                  params={"size": 10**6})  # fmt: skip
        key = await client.get("/audit/v1/public-key", headers=auth(log))
        public_key = await client.get("/tlog/public-key")
        head = await client.get("/tlog/checkpoint")
        past = await client.get("/audit/v1/proof/inclusion", headers=auth(log),
                                params={"index": 0, "tree_size": 10**6})  # fmt: skip
    assert sizes == sorted(sizes) and len(sizes) == 2
    assert rest["data"][-1]["size"] == RECORDS and rest["next_size"] is None
    assert exact.text.split("\n")[1] == str(sizes[0]) == exact.headers["x-checkpoint-size"]
    assert int(above.headers["x-checkpoint-size"]) >= sizes[0] - 1
    assert beyond.status_code == 404
    assert not key.text.endswith("\n") and key.text == public_key.text
    assert head.text.split("\n")[1] == str(RECORDS) and head.headers["cache-control"] == "no-cache"
    assert past.status_code == 400
    assert past.json()["error"]["message"] == (
        f"No proof: the ledger has {RECORDS} records, fewer than 1000000."
    )
