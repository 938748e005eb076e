"""The evidence bundle (``thinkgate ledger export --evidence``, ``audit/evidence.py``) checked
the way an auditor would: a ledger of two tenants whose checkpoint a real RFC 3161 TSA
(``openssl ts -reply``, ``tests.e2e.test_timestamps``) stamped and a real witness (the
``thinkgate witness`` app) cosigned, through the gateway's own timestamping and witnessing
rounds; the CLI writes one tenant's bundle; the test extracts it and runs the commands of its
README's ``sh`` block, exactly, from the bundle's directory: ``openssl ts -verify``, ``openssl
pkeyutl -verify``, the bundle's own Go verifier (``go run .``: Go's ``sumdb/note`` and
``sumdb/tlog``, golang.org/x/mod from Debian's source tree placed in a fresh module cache as
v0.7.0, so the bundle's ``go.mod`` and ``go.sum`` are used as shipped, with no proxy) and the
installed ``thinkgate ledger verify --export`` with no database and no secret. Then one byte of
a record, and then the checkpoint's root, are changed, and the checks must refuse them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.applications import Starlette
from starlette.routing import Route

from audit import evidence, timestamps
from audit.note import NoteVerifier
from audit.record import Body, Facts
from audit.witness import Cosigner
from gateway.cli.ledger import opened
from gateway.cli.main import main
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.ledger.timestamping import Timestamping
from gateway.ledger.witnessing import Witnessing
from gateway.settings import Settings, WitnessConfig
from gateway.side.witness import WitnessState, create_witness_app
from tests.e2e.test_timestamps import Tsa, make_pki

X_MOD = Path("/usr/share/gocode/src/golang.org/x/mod")
T0 = 1_767_225_600.0  # created_at of record 0; record i is i seconds later
# Records 0-4 are stamped and cosigned (checkpoint 5); record 5 (globex) came after.
TENANTS = ("acme", "globex", "acme", "globex", "acme")


@dataclass
class Log:
    root: Path
    w1: Cosigner
    capsys: pytest.CaptureFixture[str]

    def export(self, out: Path, *filters: str) -> tuple[int, str]:
        self.capsys.readouterr()
        code = main(["ledger", "export", "--evidence", str(out), *filters])
        return code, self.capsys.readouterr().err

    def bundle(self, *filters: str) -> tuple[Path, str]:
        """The bundle of ``filters``, extracted into a directory of its own, and what the
        export said."""
        out = self.root / "out.tar"
        code, said = self.export(out, *filters)
        assert code == 0, said
        into = self.root / "auditor"
        shutil.rmtree(into, ignore_errors=True)
        with tarfile.open(out) as tar:
            assert all(m.name.split("/")[0] == evidence.ROOT for m in tar.getmembers())
            tar.extractall(into, filter="data")
        return into / evidence.ROOT, said


def facts(index: int, tenant: str) -> Facts:
    return Facts(kind="completion", tenant=tenant, key_id=f"key-{tenant}",
                 request_id=f"req-{index}", created_at=T0 + index, model="deepseek-r1")  # fmt: skip


async def append(settings: Settings, first: int, tenants: tuple[str, ...]) -> None:
    async with opened(settings) as ledger:
        for index, tenant in enumerate(tenants, first):
            body = Body(messages=[{"role": "user", "content": f"secret prompt {index}"}],
                        content=(f"answer {index}",))  # fmt: skip
            await ledger.append(facts(index, tenant), body)  # one commit, one checkpoint each


async def stamp_and_cosign(settings: Settings, tsa: Tsa, w1: Cosigner, state: Path) -> None:
    """The gateway's own rounds: the TSA stamps the latest checkpoint, then the witness
    cosigns the latest stamped one (``stamped=True``, as with a TSA configured)."""
    roots = timestamps.load_roots((tsa.dir / "ca.pem").read_bytes())
    witness_state = WitnessState(state)
    async with opened(settings) as ledger:
        logs = {ledger.origin: NoteVerifier(ledger.verifier_key())}
        tsa_app = Starlette(routes=[Route("/", tsa.reply, methods=["POST"])])
        witness_app = create_witness_app(w1, logs, witness_state)
        async with (
            BackgroundServer(tsa_app) as tsa_server,
            BackgroundServer(witness_app) as witness_server,
            httpx.AsyncClient() as client,
        ):
            await Timestamping(ledger, f"{tsa_server.url}/", roots, 60.0, client).round()
            witness = WitnessConfig(url=witness_server.url, key=w1.verifier_key)
            await Witnessing(ledger, (witness,), 60.0, client, stamped=True).round()
        assert await ledger.timestamps([5]), "the TSA did not stamp checkpoint 5"
        assert w1.name in (await ledger.checkpoint(5) or ""), "w1 did not cosign checkpoint 5"
    witness_state.close()


@pytest.fixture
async def log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Log:
    """Records 0-4 of ``TENANTS``; checkpoint 5 stamped and cosigned by w1 (a second
    configured witness, w2, never answers); then record 5, of globex, unstamped."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed (apt-get install openssl)")
    for name in list(os.environ):
        if name.startswith("THINKGATE_"):
            monkeypatch.delenv(name)
    (tmp_path / "tsa").mkdir()
    make_pki(tmp_path / "tsa", "Evidence")
    w1, w2 = (Cosigner(f"witness.test/{n}", Ed25519PrivateKey.generate()) for n in ("w1", "w2"))
    witnesses = [{"url": "http://127.0.0.1:9", "key": c.verifier_key} for c in (w1, w2)]
    for name, value in {
        "DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'db' / 'ledger.db'}",
        "LEDGER_KEY_FILE": str(tmp_path / "keys" / "ledger-keys.json"),
        "SIGNING_KEY_FILE": str(tmp_path / "keys" / "signing-key.pem"),
        "AUDIT_SPOOL_FILE": str(tmp_path / "spool.log"),
        "TSA_ROOTS_FILE": str(tmp_path / "tsa" / "ca.pem"),
        "WITNESSES": json.dumps(witnesses),
    }.items():
        monkeypatch.setenv(f"THINKGATE_{name}", value)
    (tmp_path / "db").mkdir()
    settings = Settings()
    ensure_keys(settings.ledger, create=True)
    await append(settings, 0, TENANTS)
    await stamp_and_cosign(settings, Tsa(tmp_path / "tsa"), w1, tmp_path / "witness.db")
    await append(settings, len(TENANTS), ("globex",))
    return Log(tmp_path, w1, capsys)


@pytest.fixture(scope="session")
def go_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An auditor's environment with no network: a module cache holding Debian's source of
    golang.org/x/mod as v0.7.0. Go checks the cached go.mod against the bundle's go.sum line
    (Debian's go.mod is byte for byte the release's); the zip's hash it reads from the cache's
    ``.ziphash``, written here from that go.sum, as a download would have left it."""
    go = shutil.which("go")
    if go is None or not X_MOD.is_dir():
        pytest.fail("Go and x/mod are not installed (apt-get install golang-go "
                    "golang-golang-x-mod-dev; .ci/run does it)")  # fmt: skip
    home = tmp_path_factory.mktemp("go")
    cache = home / "modcache"
    shutil.copytree(X_MOD, cache / "golang.org" / "x" / "mod@v0.7.0")
    download = cache / "cache" / "download" / "golang.org" / "x" / "mod" / "@v"
    download.mkdir(parents=True)
    shutil.copy(X_MOD / "go.mod", download / "v0.7.0.mod")
    (download / "v0.7.0.ziphash").write_text(evidence.GO_SUM.split()[2])
    return {"PATH": f"{Path(sys.executable).parent}:{Path(go).parent}:/usr/bin:/bin",
            "HOME": str(home), "GOPATH": str(home / "gopath"), "GOMODCACHE": str(cache),
            "GOCACHE": str(home / "build"), "GOPROXY": "off", "GOSUMDB": "off",
            "GOFLAGS": "", "GOTOOLCHAIN": "local"}  # fmt: skip


def readme_commands(bundle: Path) -> list[str]:
    """The lines of the README's one ``sh`` block: the commands the auditor runs."""
    text = (bundle / "README.md").read_text()
    assert text.count("```sh\n") == 1
    block = text.split("```sh\n", 1)[1].split("\n```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def run(bundle: Path, env: dict[str, str], command: str) -> subprocess.CompletedProcess[str]:
    """``command`` as pasted into a shell in the bundle's directory."""
    return subprocess.run(["sh", "-c", command], cwd=bundle, env=env, capture_output=True,
                          text=True, timeout=110, check=False)  # fmt: skip


def by_tool(commands: list[str]) -> dict[str, str]:
    tools = {"openssl ts": "ts", "openssl pkeyutl": "pkeyutl", "go run": "go",
             "thinkgate ": "thinkgate"}  # fmt: skip
    return {next(t for p, t in tools.items() if c.startswith(p)): c for c in commands}


def test_an_auditor_checks_a_tenants_bundle_with_standard_tools_alone(
    log: Log, go_env: dict[str, str]
) -> None:
    bundle, said = log.bundle("--tenant", "acme")
    assert "3 records proven against the checkpoint of size 5" in said
    assert "cosigned by 1 of 2 witnesses" in said and "stamped 20" in said
    commands = by_tool(readme_commands(bundle))
    assert set(commands) == {"ts", "pkeyutl", "go", "thinkgate"}
    assert commands["go"] == "go run . -quorum 1"
    results = {tool: run(bundle, go_env, command) for tool, command in commands.items()}
    for tool, result in results.items():
        assert result.returncode == 0, f"{tool}: {result.stdout}{result.stderr}"
    assert "Verification: OK" in results["ts"].stdout
    assert "Signature Verified Successfully" in results["pkeyutl"].stdout
    go_said = results["go"].stdout
    assert "OK: 3 records included in the checkpoint" in go_said and "at size 5" in go_said
    assert (
        f"cosigned by {log.w1.name}" in go_said and "no cosignature by witness.test/w2" in go_said
    )
    checked = results["thinkgate"].stdout
    assert "export OK: 3 records included in the signed tree of size 5" in checked
    assert f"cosigned by 1 of the trusted witnesses: {log.w1.name}" in checked
    assert not (bundle / "var").exists()  # the offline check opened no database

    lines = (bundle / evidence.RECORDS).read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines[1:]]
    assert [r["index"] for r in records] == [0, 2, 4]
    assert {orjson.loads(base64.b64decode(r["header"]))["tenant"] for r in records} == {"acme"}
    for path in bundle.rglob("*"):
        if path.is_file():
            assert b"globex" not in path.read_bytes(), path
            assert b"secret prompt" not in path.read_bytes(), path


def test_a_record_changed_by_one_byte_is_refused_by_name(log: Log, go_env: dict[str, str]) -> None:
    bundle, _ = log.bundle("--tenant", "acme")
    commands = by_tool(readme_commands(bundle))
    path = bundle / evidence.RECORDS
    lines = path.read_bytes().splitlines()
    record = orjson.loads(lines[2])  # record 2
    ciphertext = bytearray(base64.b64decode(record["ciphertext"]))
    ciphertext[len(ciphertext) // 2] ^= 0x01
    record["ciphertext"] = base64.b64encode(ciphertext).decode()
    path.write_bytes(b"\n".join([*lines[:2], orjson.dumps(record), *lines[3:]]) + b"\n")
    for tool in ("go", "thinkgate"):
        result = run(bundle, go_env, commands[tool])
        assert result.returncode == 1, f"{tool}: {result.stdout}"
        assert "record 2" in result.stderr and "FAILED" in result.stderr, result.stderr
    # the record's leaf_hash changed to match: the proof fails instead
    record["leaf_hash"] = base64.b64encode(
        hashlib.sha256(b"\x00" + evidence_leaf(record)).digest()
    ).decode()
    path.write_bytes(b"\n".join([*lines[:2], orjson.dumps(record), *lines[3:]]) + b"\n")
    for tool in ("go", "thinkgate"):
        result = run(bundle, go_env, commands[tool])
        assert result.returncode == 1, f"{tool}: {result.stdout}"
        assert "record 2 is not included" in result.stderr, result.stderr


def evidence_leaf(record: dict[str, str]) -> bytes:
    header, ciphertext = base64.b64decode(record["header"]), base64.b64decode(record["ciphertext"])
    return len(header).to_bytes(4, "big") + header + ciphertext


def test_a_checkpoint_with_another_root_is_refused_by_every_check(
    log: Log, go_env: dict[str, str]
) -> None:
    bundle, _ = log.bundle("--tenant", "acme")
    commands = by_tool(readme_commands(bundle))
    root = (bundle / evidence.BODY).read_text().split("\n")[2]
    forged = base64.b64encode(hashlib.sha256(b"another tree").digest()).decode()
    for name in (evidence.NOTE, evidence.BODY, evidence.RECORDS):  # everywhere, consistently
        text = (bundle / name).read_text()
        assert root in text
        (bundle / name).write_text(text.replace(root, forged))
    expected = {
        "ts": "Verification: FAILED",
        "pkeyutl": "Signature Verification Failure",
        "go": "checkpoint.note: the log's signature does not verify",
        "thinkgate": "line 1: the checkpoint's signature does not verify",
    }
    for tool, message in expected.items():
        result = run(bundle, go_env, commands[tool])
        assert result.returncode != 0, f"{tool}: {result.stdout}"
        assert message in result.stdout + result.stderr, f"{tool}: {result.stdout}{result.stderr}"


def test_records_no_stamp_covers_yet_are_proven_against_the_latest_checkpoint(
    log: Log, go_env: dict[str, str]
) -> None:
    bundle, said = log.bundle("--tenant", "globex")
    assert "3 records proven against the checkpoint of size 6" in said, said
    assert "not stamped: no RFC 3161 timestamp covers its newest record yet" in said
    assert not (bundle / evidence.STAMP).exists()
    readme = (bundle / "README.md").read_text()
    assert "**No RFC 3161 timestamp.**" in readme
    commands = by_tool(readme_commands(bundle))
    assert set(commands) == {"pkeyutl", "go", "thinkgate"}  # no stamp, no cosignature on 6
    for tool, command in commands.items():
        result = run(bundle, go_env, command)
        assert result.returncode == 0, f"{tool}: {result.stdout}{result.stderr}"
    # Up to before record 5, the latest stamped checkpoint covers globex's records: it is used.
    bundle, _ = log.bundle("--tenant", "globex", "--until", str(T0 + 5))
    assert (bundle / evidence.STAMP).exists()
    assert (bundle / evidence.BODY).read_text().split("\n")[1] == "5"
    lines = (bundle / evidence.RECORDS).read_bytes().splitlines()
    assert [orjson.loads(line)["index"] for line in lines[1:]] == [1, 3]


def test_a_stored_stamp_of_other_bytes_and_an_empty_ledger_make_no_bundle(
    log: Log, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def misfile() -> None:  # checkpoint 5's stamp stored for checkpoint 6
        async with opened(Settings()) as ledger:
            stamp = (await ledger.timestamps([5]))[5]
            await ledger.add_timestamp(6, stamp)

    asyncio.run(misfile())
    out = tmp_path / "bad.tar"
    code, said = log.export(out, "--tenant", "globex")
    assert code == 1 and "stored timestamp of checkpoint 6 stamps other bytes" in said, said
    assert not out.exists() and not out.with_name("bad.tar.partial").exists()

    monkeypatch.setenv("THINKGATE_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    assert main(["ledger", "init"]) == 0
    code, said = log.export(out)
    assert code == 1 and "no checkpoint yet" in said, said
    assert not out.exists()
