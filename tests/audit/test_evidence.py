"""``audit/evidence.py``, the evidence bundle's sans-I/O core: which checkpoint proves the
records, the files and their bytes, the README's one block of commands, the tar. The bundle
checked by OpenSSL, Go and thinkgate is tests/e2e/test_evidence.py."""

from __future__ import annotations

import base64
import io
import tarfile
import tomllib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit import evidence
from audit.evidence import Evidence, EvidenceError, Selection, choose, commands, members, readme
from audit.note import Checkpoint, NoteSigner
from audit.witness import Cosigner

ROOT = Path(__file__).resolve().parents[2]
LOG = NoteSigner("example.com/log", Ed25519PrivateKey.generate())
W1, W2, W3 = (Cosigner(f"witness.example/{n}", Ed25519PrivateKey.generate()) for n in "123")


def checkpoint(size: int, *cosigners: Cosigner, signer: NoteSigner = LOG) -> str:
    body = Checkpoint(signer.name, size, bytes([size]) * 32).body()
    return signer.sign(body) + "".join(c.cosign(body, 1_767_225_600 + size) for c in cosigners)


def made(note: str, **fields: object) -> Evidence:
    defaults: dict[str, object] = {"records": 2, "selection": Selection("acme")}
    return Evidence(note, LOG.verifier_key(), **{**defaults, **fields})  # type: ignore[arg-type]


def test_the_first_candidate_that_holds_the_last_record_proves_them() -> None:
    stamped_and_cosigned, stamped, latest = checkpoint(4), checkpoint(6), checkpoint(9)
    candidates = [stamped_and_cosigned, stamped, None, latest]
    assert choose(candidates, 3) == stamped_and_cosigned  # index 3 is in the tree of size 4
    assert choose(candidates, 4) == stamped  # not in size 4: the next kind
    assert choose(candidates, 8) == latest  # nothing stamped holds it: the latest, unstamped
    assert choose(candidates, None) == stamped_and_cosigned  # no record selected
    with pytest.raises(EvidenceError, match="no checkpoint yet"):
        choose([None, None], None)


def test_the_files_carry_the_checkpoint_its_signed_bytes_and_the_public_keys_only() -> None:
    note = checkpoint(5, W1)
    bundle = dict(members(made(note, witness_keys=(W1.verifier_key, W2.verifier_key)), b"go"))
    assert list(bundle) == ["README.md", "checkpoint.note", "checkpoint.body", "checkpoint.sig",
                            "log.vkey", "log-key.pem", "witnesses/1.vkey", "witnesses/2.vkey",
                            "go.mod", "go.sum", "verify.go"]  # fmt: skip
    body = bundle["checkpoint.body"]
    assert bundle["checkpoint.note"] == note.encode() and note.startswith(body.decode() + "\n")
    key = serialization.load_pem_public_key(bundle["log-key.pem"])
    assert isinstance(key, Ed25519PublicKey)
    key.verify(bundle["checkpoint.sig"], body)  # the raw signature openssl pkeyutl checks
    assert base64.b64decode(LOG.verifier_key().split("+", 2)[2])[1:] == key.public_bytes_raw()
    assert bundle["witnesses/2.vkey"] == f"{W2.verifier_key}\n".encode()
    assert bundle["verify.go"] == b"go" and b"golang.org/x/mod v0.7.0" in bundle["go.mod"]
    everything = b"".join(bundle.values())
    assert b"PRIVATE" not in everything


def test_the_readme_shows_exactly_the_commands_and_counts_only_valid_cosignatures() -> None:
    note = checkpoint(5, W1, W3)  # W3 cosigned, but the log does not know its key
    bundle = made(note, witness_keys=(W1.verifier_key, W2.verifier_key), tsa_roots=b"roots")
    assert bundle.cosigned() == [(W1.name, 1_767_225_605)]
    text = readme(bundle)
    block = text.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert block.splitlines() == commands(bundle)
    assert commands(bundle) == [
        "openssl pkeyutl -verify -pubin -inkey log-key.pem -rawin -in checkpoint.body "
        "-sigfile checkpoint.sig",
        "go run . -quorum 1",
        "thinkgate ledger verify --export records.jsonl --public-key log.vkey "
        "--witness-key witnesses/1.vkey --witness-key witnesses/2.vkey --quorum 1",
    ]
    assert "**No RFC 3161 timestamp.**" in text  # and so no openssl ts line above
    assert "2 records (tenant `acme`)" in text and "tree size 5" in text


def test_without_witnesses_no_quorum_is_asked() -> None:
    bundle = made(checkpoint(3), selection=Selection(None, 1_767_225_600, 1_767_229_200))
    assert commands(bundle)[1:] == [
        "go run .",
        "thinkgate ledger verify --export records.jsonl --public-key log.vkey",
    ]
    assert "(all tenants, from 2026-01-01T00:00:00+00:00, before 2026-01-01T01:00:00+00:00)" in (
        readme(bundle)
    )


def test_a_checkpoint_the_log_key_did_not_sign_makes_no_bundle() -> None:
    impostor = NoteSigner(LOG.name, Ed25519PrivateKey.generate())
    with pytest.raises(EvidenceError, match="does not open with the log's key"):
        members(made(checkpoint(5, signer=impostor)), b"")


def test_the_tar_holds_every_file_under_one_directory_and_the_records_as_given() -> None:
    files = [("README.md", b"read me"), ("witnesses/1.vkey", b"key\n")]
    records = io.BytesIO(b'{"checkpoint": "..."}\n{"index": 0}\n')
    records.seek(0, io.SEEK_END)
    out = io.BytesIO()
    evidence.write_bundle(out, files, records, records.tell(), 1_767_225_600)
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        listed = {m.name: m for m in tar.getmembers()}
        assert sorted(listed) == [
            "thinkgate-evidence", "thinkgate-evidence/README.md",
            "thinkgate-evidence/records.jsonl", "thinkgate-evidence/witnesses",
            "thinkgate-evidence/witnesses/1.vkey",
        ]  # fmt: skip
        assert listed["thinkgate-evidence/witnesses"].isdir()
        assert {m.mode for m in listed.values() if m.isfile()} == {0o644}
        extracted = tar.extractfile("thinkgate-evidence/records.jsonl")
        assert extracted is not None and extracted.read() == records.getvalue()


def test_the_go_verifier_ships_as_package_data() -> None:
    source = evidence.verifier_source()
    assert b"golang.org/x/mod/sumdb/tlog" in source and b"package main" in source
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "evidence_verify.go" in config["tool"]["setuptools"]["package-data"]["audit"]


def test_a_log_key_whose_base64_has_a_plus_converts_to_pem() -> None:
    signer = LOG
    while "+" not in signer.verifier_key().split("+", 2)[2]:  # about half of all keys
        signer = NoteSigner(LOG.name, Ed25519PrivateKey.generate())
    files = dict(
        members(Evidence(checkpoint(2, signer=signer), signer.verifier_key(), 0, Selection()), b"")
    )
    key = serialization.load_pem_public_key(files["log-key.pem"])
    assert isinstance(key, Ed25519PublicKey)
    key.verify(files["checkpoint.sig"], files["checkpoint.body"])
