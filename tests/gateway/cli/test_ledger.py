"""``thinkgate ledger`` (``gateway/cli/ledger.py`` behind ``gateway/cli/main.py``): init, verify,
export and its offline check, public-key, shred, rotate-kek.

The commands run in-process through ``gateway.cli.main.main`` with ``THINKGATE_*`` set for the test,
except the offline check, which runs the installed ``thinkgate`` script in a clean environment
without the database and without any secret. Records are appended through ``audit.ledger``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.ledger import Opened
from audit.note import (
    NoteSigner,
    NoteVerifier,
    default_origin,
    load_signing_key,
    parse_checkpoint,
)
from audit.record import Body, Facts
from audit.schema import drop_triggers
from audit.store import Filter
from gateway.cli.ledger import opened
from gateway.cli.main import main
from gateway.settings import Settings

THINKGATE = Path(sys.executable).with_name("thinkgate")


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass
class LedgerDir:
    """One test's ledger: its files, and the CLI run against them."""

    root: Path
    capsys: pytest.CaptureFixture[str]

    @property
    def database(self) -> Path:
        return self.root / "db" / "ledger.db"

    @property
    def key_file(self) -> Path:
        return self.root / "keys" / "ledger-keys.json"

    @property
    def signing_key(self) -> Path:
        return self.root / "keys" / "signing-key.pem"

    def run(self, *argv: str) -> Result:
        self.capsys.readouterr()
        code = main(["ledger", *argv])
        captured = self.capsys.readouterr()
        return Result(code, captured.out, captured.err)

    def execute(self, statement: str, params: tuple[object, ...] = ()) -> None:
        conn = sqlite3.connect(self.database, isolation_level=None)
        try:
            conn.execute(statement, params)
        finally:
            conn.close()

    def drop_write_once_rules(self) -> None:
        """What a DBA with full rights can do; only the checkpoints still catch it."""
        for statement in drop_triggers("sqlite"):
            self.execute(statement)

    def fetch(self, query: str) -> list[tuple[object, ...]]:
        conn = sqlite3.connect(self.database)
        try:
            return list(conn.execute(query).fetchall())
        finally:
            conn.close()


@pytest.fixture
def ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> LedgerDir:
    for name in list(os.environ):
        if name.startswith("THINKGATE_"):
            monkeypatch.delenv(name)
    made = LedgerDir(tmp_path, capsys)
    monkeypatch.setenv("THINKGATE_DATABASE_URL", f"sqlite+aiosqlite:///{made.database}")
    monkeypatch.setenv("THINKGATE_LEDGER_KEY_FILE", str(made.key_file))
    monkeypatch.setenv("THINKGATE_SIGNING_KEY_FILE", str(made.signing_key))
    monkeypatch.setenv("THINKGATE_AUDIT_SPOOL_FILE", str(tmp_path / "spool" / "spool.log"))
    return made


@pytest.fixture
def populated(ledger: LedgerDir) -> LedgerDir:
    """Initialised, with records 0-2 of tenant acme and 3-4 of tenant other."""
    assert ledger.run("init").code == 0
    append(["acme", "acme", "acme", "other", "other"])
    return ledger


def secret_prompt(number: int) -> str:
    return f"secret prompt {number}"


async def _append(tenants: list[str]) -> None:
    async with opened(Settings()) as ledger:
        for tenant in tenants:
            number = len(await ledger.find(Filter(), 10_000))
            facts = Facts(
                kind="completion",
                tenant=tenant,
                key_id=f"key-{tenant}",
                request_id=f"req-{number}",
                created_at=time.time(),
                model="deepseek-r1",
            )
            body = Body(
                messages=[{"role": "user", "content": secret_prompt(number)}],
                params={"max_tokens": 10},
                reasoning=(f"thought {number}",),
                content=(f"answer {number}",),
            )
            await ledger.append(facts, body)  # one commit and one checkpoint each


def append(tenants: list[str]) -> None:
    asyncio.run(_append(tenants))


async def _read_all() -> list[Opened]:
    async with opened(Settings()) as ledger:
        rows = await ledger.find(Filter(), 10_000)
        out = []
        for row in rows:
            record = await ledger.read(row.index)
            assert record is not None
            out.append(record)
        return out


def read_all() -> list[Opened]:
    return asyncio.run(_read_all())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- init ------------------------------------------------------------------------------------


def test_init_creates_both_key_files_private_and_only_once(ledger: LedgerDir) -> None:
    first = ledger.run("init")
    assert first.code == 0
    assert ledger.key_file.exists() and ledger.signing_key.exists()
    assert mode(ledger.key_file) == 0o600 and mode(ledger.signing_key) == 0o600
    assert str(ledger.key_file) in first.out and str(ledger.signing_key) in first.out
    document = json.loads(ledger.key_file.read_text())
    assert set(document) == {"primary", "keys"} and document["primary"] in document["keys"]
    assert b"PRIVATE KEY" in ledger.signing_key.read_bytes()
    tables = ledger.fetch("SELECT name FROM sqlite_master WHERE type = 'table'")
    assert ("ledger_entries",) in tables  # init also brings the schema up to date
    before = {
        p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (ledger.key_file, ledger.signing_key)
    }

    again = ledger.run("init")
    assert again.code == 0 and "created" not in again.out
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before} == before


def test_init_replaces_no_file_when_only_one_is_missing(ledger: LedgerDir) -> None:
    assert ledger.run("init").code == 0
    keys = ledger.key_file.read_bytes()
    ledger.signing_key.unlink()
    result = ledger.run("init")
    assert result.code == 0 and str(ledger.signing_key) in result.out
    assert str(ledger.key_file) not in result.out
    assert ledger.key_file.read_bytes() == keys and mode(ledger.signing_key) == 0o600


# -- verify ----------------------------------------------------------------------------------


def test_verify_passes_on_an_intact_ledger(populated: LedgerDir) -> None:
    result = populated.run("verify")
    assert result.code == 0, result.err
    assert "ledger OK: 5 records" in result.out


def test_verify_does_not_need_the_key_encryption_keys(populated: LedgerDir) -> None:
    populated.key_file.unlink()  # verify recomputes hashes: nothing is decrypted
    result = populated.run("verify")
    assert result.code == 0, result.err


def test_verify_needs_only_the_public_half_of_the_signing_key(populated: LedgerDir) -> None:
    """ledgercli: "verify and export need only the database and the public half of the
    signing key"; ``verify --public-key`` is how the public half is given."""
    public_key = populated.root / "public-key.txt"
    public_key.write_text(populated.run("public-key").out)
    populated.signing_key.unlink()
    result = populated.run("verify", "--public-key", str(public_key))
    assert result.code == 0, result.err
    assert "ledger OK: 5 records" in result.out


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        ("ciphertext", "index 2"),  # one byte of the encrypted body
        ("header", "index 2"),  # one byte of the readable header
        ("model", "index 2"),  # a searchable column, rewritten to disagree with the header
        ("delete", "index 2"),  # a record in the middle removed
        ("truncate", "index 4"),  # the newest record removed; its checkpoint still says 5
    ],
)
def test_verify_fails_and_names_the_index_after_tampering(
    populated: LedgerDir, tamper: str, named: str
) -> None:
    assert populated.run("verify").code == 0
    with pytest.raises(sqlite3.DatabaseError, match="write-once"):
        populated.execute("DELETE FROM ledger_entries WHERE idx = 2")
    populated.drop_write_once_rules()
    if tamper in ("ciphertext", "header"):
        ((value,),) = populated.fetch(f"SELECT {tamper} FROM ledger_entries WHERE idx = 2")
        assert isinstance(value, bytes)
        changed = flip(value, len(value) // 2)
        populated.execute(f"UPDATE ledger_entries SET {tamper} = ? WHERE idx = 2", (changed,))
    elif tamper == "model":
        populated.execute("UPDATE ledger_entries SET model = 'cheaper-model' WHERE idx = 2")
    else:
        populated.execute(f"DELETE FROM ledger_entries WHERE idx = {named[-1]}")
    result = populated.run("verify")
    assert result.code == 1, result.out
    assert "FAILED" in result.err and re.search(rf"\b{named}\b", result.err), result.err


# -- public-key ------------------------------------------------------------------------------


def test_public_key_prints_the_checkpoint_verifier_key(populated: LedgerDir) -> None:
    result = populated.run("public-key")
    assert result.code == 0
    (line,) = result.out.splitlines()
    origin = default_origin(load_signing_key(populated.signing_key))  # made by ledger init
    assert re.fullmatch(r"thinkgate/[0-9a-f]{12}\+[0-9a-f]{8}\+[A-Za-z0-9+/]+={0,2}", line), line
    assert line.startswith(f"{origin}+")
    assert base64.b64decode(line.split("+", 2)[2])[0] == 0x01  # Ed25519, per C2SP signed-note
    ((note,),) = populated.fetch("SELECT note FROM ledger_checkpoints ORDER BY size DESC LIMIT 1")
    assert isinstance(note, str)
    head = parse_checkpoint(NoteVerifier(line).open(note))
    assert (head.origin, head.size) == (origin, 5)
    pem = populated.signing_key.read_text()
    assert pem.splitlines()[1] not in result.out


# -- export and the offline check ------------------------------------------------------------


def offline_verify(root: Path, export: Path, public_key: Path) -> subprocess.CompletedProcess[str]:
    """The installed script, with no secret and a database that does not exist."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THINKGATE_")}
    env["THINKGATE_DATABASE_URL"] = f"sqlite+aiosqlite:///{root / 'nowhere' / 'none.db'}"
    env["THINKGATE_LEDGER_KEY_FILE"] = str(root / "nowhere" / "keys.json")
    env["THINKGATE_SIGNING_KEY_FILE"] = str(root / "nowhere" / "signing.pem")
    return subprocess.run(
        [
            str(THINKGATE),
            "ledger",
            "verify",
            "--export",
            str(export),
            "--public-key",
            str(public_key),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_export_verifies_offline_without_database_or_secret(populated: LedgerDir) -> None:
    export = populated.root / "out" / "export.jsonl"
    export.parent.mkdir()
    exported = populated.run("export", "--output", str(export))
    assert exported.code == 0 and "exported 5 records" in exported.err
    public_key = populated.root / "out" / "public-key.txt"
    public_key.write_text(populated.run("public-key").out)
    lines = export.read_bytes().splitlines()
    assert len(lines) == 6 and b"checkpoint" in lines[0]
    assert [orjson.loads(line)["index"] for line in lines[1:]] == [0, 1, 2, 3, 4]
    assert secret_prompt(1).encode() not in export.read_bytes()
    assert b"thought 1" not in export.read_bytes()

    # Nothing secret is left, and the database is gone too.
    populated.key_file.unlink()
    populated.signing_key.unlink()
    populated.database.rename(populated.root / "moved.db")
    checked = offline_verify(populated.root, export, public_key)
    assert checked.returncode == 0, checked.stderr
    assert "export OK: 5 records included in the signed tree of size 5" in checked.stdout
    assert not (populated.root / "nowhere").exists()

    # One byte of one record changed: the record is named.
    record = orjson.loads(lines[3])
    ciphertext = base64.b64decode(record["ciphertext"])
    record["ciphertext"] = base64.b64encode(flip(ciphertext, 0)).decode()
    tampered = populated.root / "out" / "tampered.jsonl"
    tampered.write_bytes(b"\n".join([*lines[:3], orjson.dumps(record), *lines[4:]]) + b"\n")
    rejected = offline_verify(populated.root, tampered, public_key)
    assert rejected.returncode == 1, rejected.stdout
    assert "line 4" in rejected.stderr and "record 2" in rejected.stderr, rejected.stderr

    # A checkpoint that another key signed (or that was edited) is refused at line 1.
    head = orjson.loads(lines[0])
    head["checkpoint"] = head["checkpoint"].replace("\n5\n", "\n4\n", 1)
    forged = populated.root / "out" / "forged.jsonl"
    forged.write_bytes(b"\n".join([orjson.dumps(head), *lines[1:5]]) + b"\n")
    refused = offline_verify(populated.root, forged, public_key)
    assert refused.returncode == 1 and "line 1" in refused.stderr, refused.stderr


def test_export_of_one_tenant_holds_only_its_records(populated: LedgerDir) -> None:
    export = populated.root / "other.jsonl"
    result = populated.run("export", "--tenant", "other", "--output", str(export))
    assert result.code == 0 and "exported 2 records" in result.err
    lines = export.read_bytes().splitlines()
    assert [orjson.loads(line)["index"] for line in lines[1:]] == [3, 4]
    public_key = populated.root / "public-key.txt"
    public_key.write_text(populated.run("public-key").out)
    assert main(["ledger", "verify", "--export", str(export), "--public-key", str(public_key)]) == 0


def test_export_does_not_need_the_key_encryption_keys(populated: LedgerDir) -> None:
    """ledgercli: "verify and export need only the database and the public half of the
    signing key: no decryption key is loaded"."""
    populated.key_file.unlink()
    result = populated.run("export", "--output", str(populated.root / "export.jsonl"))
    assert result.code == 0 and "exported 5 records" in result.err


# -- shred -----------------------------------------------------------------------------------


def test_shred_destroys_one_tenants_bodies_and_the_ledger_still_verifies(
    populated: LedgerDir,
) -> None:
    result = populated.run("shred", "--tenant", "acme")
    assert result.code == 0
    assert "shredded tenant acme: 1 data keys destroyed" in result.out

    records = read_all()
    assert len(records) == 6
    for record in records[:3]:
        assert record.header["tenant"] == "acme"
        assert record.destroyed and record.body is None
    for number, record in enumerate(records[3:5], start=3):
        assert not record.destroyed and record.body is not None
        assert record.body.messages == [{"role": "user", "content": secret_prompt(number)}]
        assert record.body.reasoning == (f"thought {number}",)
    shred = records[5]
    assert (shred.header["kind"], shred.header["tenant"]) == ("shred", "acme")
    assert not shred.destroyed  # system records stay readable after any shredding
    verifier = NoteVerifier(populated.run("public-key").out.strip())
    statement = verifier.open(shred.header["statement"])
    origin = default_origin(load_signing_key(populated.signing_key))
    assert re.fullmatch(rf"thinkgate shred\n{re.escape(origin)}\nacme\n\d+\n", statement)
    assert populated.fetch(
        "SELECT count(*) FROM ledger_data_keys WHERE tenant = 'acme' AND wrapped IS NOT NULL"
    ) == [(0,)]

    verified = populated.run("verify")
    assert verified.code == 0, verified.err
    assert "ledger OK: 6 records" in verified.out

    append(["acme"])  # the tenant's later records get a new key, readable again
    later = read_all()[6]
    assert later.body is not None and later.body.reasoning == ("thought 6",)
    assert read_all()[0].destroyed


# -- rotate-kek ------------------------------------------------------------------------------


def test_rotate_kek_rewraps_every_tenant_key_and_old_records_still_open(
    populated: LedgerDir,
) -> None:
    old = json.loads(populated.key_file.read_text())
    before = [r.body for r in read_all()]

    result = populated.run("rotate-kek")
    assert result.code == 0
    rotated = json.loads(populated.key_file.read_text())
    new_primary = rotated["primary"]
    assert new_primary != old["primary"] and new_primary in result.out
    assert "2 tenant keys re-wrapped" in result.out
    assert rotated["keys"][old["primary"]] == old["keys"][old["primary"]]  # kept for the old
    assert mode(populated.key_file) == 0o600
    assert populated.fetch("SELECT DISTINCT kek_id FROM ledger_data_keys") == [(new_primary,)]

    # Every tenant key now opens under the new KEK alone: the old one can go.
    del rotated["keys"][old["primary"]]
    populated.key_file.write_text(json.dumps(rotated))
    assert [r.body for r in read_all()] == before
    append(["other"])
    assert read_all()[5].body is not None
    assert populated.run("verify").code == 0


# -- verify --export: each mistake named -----------------------------------------------------


@pytest.fixture
def exported(populated: LedgerDir) -> tuple[Path, Path]:
    export = populated.root / "all.jsonl"
    assert populated.run("export", "--output", str(export)).code == 0
    public_key = populated.root / "public-key.txt"
    public_key.write_text(populated.run("public-key").out)
    return export, public_key


def test_a_missing_export_file_is_named(populated: LedgerDir, exported: tuple[Path, Path]) -> None:
    _, public_key = exported
    missing = populated.root / "no-such.jsonl"
    result = offline_verify(populated.root, missing, public_key)
    assert result.returncode == 2
    assert f"cannot read the export file {missing}" in result.stderr
    assert "database" not in result.stderr


def test_a_key_given_in_place_of_its_file_says_so(
    populated: LedgerDir, exported: tuple[Path, Path]
) -> None:
    export, public_key = exported
    result = offline_verify(populated.root, export, Path(public_key.read_text().strip()))
    assert result.returncode == 2 and "looks like the key itself" in result.stderr


def test_the_public_key_default_is_applied_to_an_export(
    populated: LedgerDir, exported: tuple[Path, Path]
) -> None:
    export, _ = exported
    result = populated.run("verify", "--export", str(export))
    assert result.code == 0 and "export OK" in result.out


def test_a_file_that_is_not_an_export_and_a_key_of_another_log_are_named(
    populated: LedgerDir, exported: tuple[Path, Path]
) -> None:
    export, public_key = exported
    junk = populated.root / "notes.txt"
    junk.write_text("these are my notes\n")
    result = offline_verify(populated.root, junk, public_key)
    assert result.returncode == 1 and "not JSON: this is not a thinkgate ledger export" in (
        result.stderr
    )
    name = public_key.read_text().split("+", 1)[0]
    other = populated.root / "other-log.pub"  # a real key, of another log
    other.write_text(NoteSigner("other.example/log", Ed25519PrivateKey.generate()).verifier_key())
    result = offline_verify(populated.root, export, other)
    assert result.returncode == 1
    assert f"of the log {name!r}" in result.stderr and "'other.example/log'" in result.stderr
    assert "another log" in result.stderr


def test_verifys_progress_is_one_line_rewritten_and_erased() -> None:
    import io

    from gateway.cli.ledger import progress_bar

    out = io.StringIO()
    with progress_bar(True, out) as progress:
        progress(0, 10)
        progress(5, 10)  # within a tenth of a second of the last: not drawn
        progress(10, 10)  # the end is always drawn
    drawn = out.getvalue()
    assert drawn.split("\r")[1:] == [
        "verifying 0 of 10 records (0 %)\x1b[K",
        "verifying 10 of 10 records (100 %)\x1b[K",
        "\x1b[K",
    ]
    quiet = io.StringIO()
    with progress_bar(False, quiet) as progress:
        progress(1, 2)
    assert quiet.getvalue() == ""
