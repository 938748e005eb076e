"""Witnesses against split views: two ``thinkgate witness`` processes (their own keys, their
own SQLite state) cosign the gateway's checkpoints, which are then served with both
cosignatures and pass ``ledger verify`` with a two-of-two policy; a fork (another checkpoint of
a size a witness cosigned, signed with the log's own key) is refused; a witness another
replica moved ahead is caught up with (409, then a proof from its size)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.note import Checkpoint, NoteSigner, load_signing_key, parse_checkpoint
from audit.witness import Cosigner, CosignerKey, WitnessPolicy, add_checkpoint_body
from gateway.cli.main import main
from tests.e2e.conftest import Stack, ledger_files, log_origin
from tests.e2e.test_tlog import auth
from tests.waiting import eventually


@contextlib.asynccontextmanager
async def witness(tmp_path: Path, name: str) -> AsyncIterator[tuple[str, Cosigner]]:
    """A witness process following the stack's log (whose signing key is in ``tmp_path``)."""
    home = tmp_path / name
    home.mkdir()
    key = Ed25519PrivateKey.generate()
    (home / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))  # fmt: skip
    signing_key = load_signing_key(tmp_path / "signing-key.pem")
    log_key = NoteSigner(log_origin(tmp_path), signing_key).verifier_key()
    (home / "log.pub").write_text(log_key)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "witness", "--name", f"witness.test/{name}",
        "--key-file", str(home / "key.pem"), "--log-key", str(home / "log.pub"),
        "--state", str(home / "state.db"), "--port", str(port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        assert b"its verifier key" in line, line
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            for _ in range(300):  # until it accepts connections (it printed before serving)
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        break
                await asyncio.sleep(0.05)
        yield url, Cosigner(f"witness.test/{name}", key)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=15)


async def complete(stack: Stack, count: int) -> None:
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        for i in range(count):
            await client.chat.completions.create(
                model="deepseek-r1", max_tokens=5, messages=[{"role": "user", "content": f"{i}"}]
            )


async def cosigned_by(stack: Stack, policy: WitnessPolicy, above: int = 0) -> str | None:
    """The published checkpoint if it is larger than ``above`` and ``policy`` accepts it."""
    async with httpx.AsyncClient(base_url=stack.root) as client:
        answer = await client.get("/tlog/checkpoint")
    if answer.status_code != 200 or int(answer.text.split("\n")[1]) <= above:
        return None
    policy.check(answer.text)  # what is published must pass, never just "not yet"
    return answer.text


@pytest.fixture
async def witnessed(
    stack_factory: Any, tmp_path: Path
) -> AsyncIterator[tuple[Stack, list[tuple[str, Cosigner]]]]:
    from gateway.ledger.sink import ensure_keys
    from gateway.settings import Settings

    ensure_keys(Settings(**ledger_files(tmp_path)), create=True)  # the witnesses need its key
    async with witness(tmp_path, "w1") as w1, witness(tmp_path, "w2") as w2:
        configured = [{"url": url, "key": c.verifier_key} for url, c in (w1, w2)]
        stack = await stack_factory(witnesses=configured, witness_interval_s=0.1)
        yield stack, [w1, w2]


async def test_two_witnesses_cosign_and_a_two_of_two_policy_verifies(
    witnessed: tuple[Stack, list[tuple[str, Cosigner]]], tmp_path: Path
) -> None:
    stack, witnesses = witnessed
    keys = tuple(CosignerKey.parse(c.verifier_key) for _, c in witnesses)
    await complete(stack, 3)
    note = await eventually(lambda: cosigned_by(stack, WitnessPolicy(keys, 2), above=2))
    size = parse_checkpoint(note.split("\n\n")[0] + "\n").size
    assert size >= 1
    async with httpx.AsyncClient(base_url=stack.root) as client:
        export = (await client.get("/audit/v1/export", headers=auth(stack))).content
        public = (await client.get("/tlog/public-key")).text
    (tmp_path / "export.jsonl").write_bytes(export)
    (tmp_path / "log.pub").write_text(public)
    for (_, cosigner), name in zip(witnesses, ("w1.key", "w2.key"), strict=True):
        (tmp_path / name).write_text(cosigner.verifier_key)
    argv = ["ledger", "verify", "--export", str(tmp_path / "export.jsonl"), "--public-key",
            str(tmp_path / "log.pub"), "--witness-key", str(tmp_path / "w1.key"),
            "--witness-key", str(tmp_path / "w2.key")]  # fmt: skip
    # nothing was appended since: the export is proven against that cosigned checkpoint
    assert await asyncio.to_thread(main, argv) == 0
    stranger = Cosigner("witness.test/w3", Ed25519PrivateKey.generate())
    (tmp_path / "w3.key").write_text(stranger.verifier_key)
    assert (
        await asyncio.to_thread(main, [*argv[:6], "--witness-key", str(tmp_path / "w3.key")]) == 1
    )


async def test_a_fork_is_refused_by_a_witness_that_saw_the_other(
    witnessed: tuple[Stack, list[tuple[str, Cosigner]]], tmp_path: Path
) -> None:
    stack, witnesses = witnessed
    keys = tuple(CosignerKey.parse(c.verifier_key) for _, c in witnesses)
    await complete(stack, 2)
    note = await eventually(lambda: cosigned_by(stack, WitnessPolicy(keys, 2), above=1))
    real = parse_checkpoint(note.split("\n\n")[0] + "\n")
    # the operator, holding the log's key, signs another history of the same size
    origin = log_origin(tmp_path)
    signer = NoteSigner(origin, load_signing_key(tmp_path / "signing-key.pem"))
    forged = signer.sign(Checkpoint(origin, real.size, bytes(32)).body())
    bigger = signer.sign(Checkpoint(origin, real.size + 3, bytes(32)).body())
    async with httpx.AsyncClient() as client:
        for url, _ in witnesses:
            submit = f"{url}/add-checkpoint"
            same = await client.post(submit, content=add_checkpoint_body(real.size, [], forged))
            assert same.status_code == 409 and same.text == f"{real.size}\n"
            assert same.headers["content-type"] == "text/x.tlog.size"
            junk = [bytes(32)] * 3
            grown = await client.post(submit, content=add_checkpoint_body(real.size, junk, bigger))
            assert grown.status_code == 422
            fresh = await client.post(submit, content=add_checkpoint_body(0, [], forged))
            assert fresh.status_code == 409  # it knows a size: "old 0" is stale
    # and the real log goes on being cosigned
    await complete(stack, 2)
    later = await eventually(lambda: cosigned_by(stack, WitnessPolicy(keys, 2), real.size + 1))
    assert parse_checkpoint(later.split("\n\n")[0] + "\n").size == real.size + 2


async def test_a_witness_moved_ahead_by_another_replica_is_caught_up(
    witnessed: tuple[Stack, list[tuple[str, Cosigner]]],
) -> None:
    stack, witnesses = witnessed
    keys = tuple(CosignerKey.parse(c.verifier_key) for _, c in witnesses)
    await complete(stack, 1)
    first = await eventually(lambda: cosigned_by(stack, WitnessPolicy(keys, 2)))
    size = parse_checkpoint(first.split("\n\n")[0] + "\n").size
    await complete(stack, 3)
    async with httpx.AsyncClient(base_url=stack.root) as client:
        listed = (await client.get("/audit/v1/checkpoints", headers=auth(stack),
                                   params={"size": size + 1})).json()["data"]  # fmt: skip
        middle = listed[0]
        between = {"first": size, "second": middle["size"]}
        proof = (await client.get("/audit/v1/proof/consistency", headers=auth(stack),
                                  params=between)).json()  # fmt: skip
        hashes = [base64.b64decode(h) for h in proof["hashes"]]
        text, signatures = middle["note"].split("\n\n", 1)
        plain = f"{text}\n\n{signatures.splitlines()[0]}\n"  # the log's signature alone
        body = add_checkpoint_body(size, hashes, plain)  # what another replica would send
        moved = await client.post(f"{witnesses[0][0]}/add-checkpoint", content=body)
    assert moved.status_code in (200, 409)  # 409: the gateway got there first
    await complete(stack, 1)
    last = await eventually(lambda: cosigned_by(stack, WitnessPolicy(keys, 2), above=4))
    assert parse_checkpoint(last.split("\n\n")[0] + "\n").size == 5


def unreachable_url() -> str:
    """A witness that is away: a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


async def test_the_log_publishes_only_checkpoints_its_quorum_cosigned(
    stack_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from gateway.ledger.sink import ensure_keys
    from gateway.settings import Settings

    ensure_keys(Settings(**ledger_files(tmp_path)), create=True)
    away = Cosigner("witness.test/away", Ed25519PrivateKey.generate())
    async with witness(tmp_path, "w1") as (url, w1):
        configured = [{"url": url, "key": w1.verifier_key},
                      {"url": unreachable_url(), "key": away.verifier_key}]  # fmt: skip
        stack = await stack_factory(witnesses=configured, witness_quorum=1,
                                    witness_interval_s=0.05)  # fmt: skip
        only_w1 = WitnessPolicy((CosignerKey.parse(w1.verifier_key),), 1)
        served: list[str] = []

        async def follow() -> None:  # a monitor polling while requests are committed
            async with httpx.AsyncClient(base_url=stack.root) as client:
                for _ in range(40):
                    answer = await client.get("/tlog/checkpoint")
                    if answer.status_code == 200:
                        served.append(answer.text)
                    else:
                        assert answer.json()["error"]["code"] == "no_checkpoint"

        await asyncio.gather(follow(), complete(stack, 4))
        assert all(only_w1.check(note) for note in served)  # each one carries w1's cosignature
        await eventually(lambda: cosigned_by(stack, only_w1, above=3))
    # the operator's check finds that checkpoint in the database
    monkeypatch.setenv("THINKGATE_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    for name, path in ledger_files(tmp_path).items():
        monkeypatch.setenv(f"THINKGATE_{name.upper()}", str(path))
    (tmp_path / "w1.key").write_text(w1.verifier_key)
    (tmp_path / "away.key").write_text(away.verifier_key)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["ledger", "verify", "--witness-key",
                                          str(tmp_path / "w1.key")]) == 0  # fmt: skip
    assert "checkpoint of size 4 (of 4 records) is cosigned by 1" in capsys.readouterr().out
    assert await asyncio.to_thread(main, ["ledger", "verify", "--witness-key",
                                          str(tmp_path / "away.key")]) == 1  # fmt: skip
    assert "no checkpoint carries cosignatures by 1 of witness.test/away" in capsys.readouterr().err


async def test_without_the_quorum_nothing_is_published(stack_factory: Any, tmp_path: Path) -> None:
    from gateway.ledger.sink import ensure_keys
    from gateway.settings import Settings

    ensure_keys(Settings(**ledger_files(tmp_path)), create=True)
    away = Cosigner("witness.test/away", Ed25519PrivateKey.generate())
    async with witness(tmp_path, "w1") as (url, w1):
        configured = [{"url": url, "key": w1.verifier_key},
                      {"url": unreachable_url(), "key": away.verifier_key}]  # fmt: skip
        stack = await stack_factory(witnesses=configured, witness_interval_s=0.05)
        await complete(stack, 2)
        only_w1 = WitnessPolicy((CosignerKey.parse(w1.verifier_key),), 1)

        async def cosigned_by_w1() -> str | None:  # the auditor's view carries what there is
            async with httpx.AsyncClient(base_url=stack.root) as client:
                note = (await client.get("/audit/v1/checkpoint", headers=auth(stack))).text
            return note if w1.name in note else None

        only_w1.check(await eventually(cosigned_by_w1))
        async with httpx.AsyncClient(base_url=stack.root) as client:
            public = await client.get("/tlog/checkpoint")
        assert public.status_code == 404
        error = public.json()["error"]
        assert error["code"] == "no_checkpoint" and "cosigned by 2 witnesses" in error["message"]


def test_a_quorum_larger_than_the_witnesses_is_refused() -> None:
    from pydantic import ValidationError

    from gateway.settings import Settings

    key = Cosigner("witness.test/w", Ed25519PrivateKey.generate()).verifier_key
    with pytest.raises(ValidationError, match="WITNESS_QUORUM is 2, but WITNESSES names 1"):
        Settings(witnesses=[{"url": "http://w.test", "key": key}], witness_quorum=2)
