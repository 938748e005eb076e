"""The evidence bundle of ``thinkgate ledger export --evidence`` (docs/evidence.md): one tar an
auditor checks with standard tools (OpenSSL, Go's ``sumdb/note`` and ``sumdb/tlog``), offline,
without thinkgate and without the log's operator. Sans-I/O: the caller fetches the checkpoints,
the stamp, the keys and the records; this module chooses the checkpoint, makes the files and
the README, and writes the tar to a stream it is given.

Rules:

- **One checkpoint** proves every record in the bundle: the first of the caller's candidates
  that covers the last record selected (its size is above that record's index). The caller
  offers, newest first within each kind: a checkpoint with an RFC 3161 timestamp and the
  witnesses' quorum, one with a timestamp, one with the quorum, the latest (``choose``). A
  bundle never leaves out a record the filter selects: when no stamped checkpoint covers the
  newest one yet, the bundle is proven against a later checkpoint and has no timestamp, and
  its README says so.
- **What the TSA stamped** is the checkpoint's body ``origin\\nsize\\nroot\\n`` (the text the
  log signs, ``audit.timestamps``); the bundle carries those bytes as ``checkpoint.body``, so
  ``openssl ts -verify -data checkpoint.body`` checks the token, and the log's raw Ed25519
  signature of them as ``checkpoint.sig``. The Go verifier checks that both are the note's.
- The records file is ``ledger export``'s (``audit.export``), its first line this checkpoint,
  so ``thinkgate ledger verify --export`` reads it as it is.
- The README's commands are ``commands()``, printed in its one ``sh`` block; the tests run
  that block as an auditor would.
- Nothing secret goes in: public keys, signatures, ciphertexts and the readable headers.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import BinaryIO

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.errors import AuditError
from audit.note import Checkpoint, NoteError, NoteVerifier, parse_checkpoint
from audit.witness import CosignerKey

ROOT = "thinkgate-evidence"  # the tar's one top directory
RECORDS = "records.jsonl"
NOTE = "checkpoint.note"
BODY = "checkpoint.body"
SIGNATURE = "checkpoint.sig"
STAMP = "checkpoint.tsr"
LOG_VKEY = "log.vkey"
LOG_PEM = "log-key.pem"
TSA_ROOTS = "tsa-roots.pem"
NO_ROOTS = "TSA-ROOT.pem"  # the README's placeholder when the operator configured no roots
GO_MOD = """module thinkgate.evidence/verify

go 1.19

require golang.org/x/mod v0.7.0
"""
# golang.org/x/mod v0.7.0 as the Go checksum database (sum.golang.org) records it: `go run`
# refuses a download that differs.
GO_SUM = """golang.org/x/mod v0.7.0 h1:LapD9S96VoQRhi/GrNTqeBJFrUjs5UHCAtTlgwA5oZA=
golang.org/x/mod v0.7.0/go.mod h1:iBbtSCu2XBx23ZKBPSOrRkjjQPZFPuis4dIYUhu/chs=
"""
_DASH = "\u2014 "


class EvidenceError(AuditError):
    """No bundle can be made: the ledger has no checkpoint, or what was fetched disagrees
    (a checkpoint the log key did not sign, a stamp over another checkpoint)."""


def choose(candidates: Sequence[str | None], last_index: int | None) -> str:
    """The first candidate checkpoint (signed note) whose tree holds record ``last_index``
    (any, when no record is selected); absent candidates are ``None``. The caller puts the
    latest checkpoint last, so that one always qualifies."""
    for note in candidates:
        if note is not None and (last_index is None or tree_size(note) > last_index):
            return note
    raise EvidenceError("the ledger has no checkpoint yet: nothing to prove records against")


@dataclass(frozen=True, slots=True)
class Selection:
    """The records selected, as ``ledger export``'s filters gave them (for the README)."""

    tenant: str | None = None
    since: float | None = None
    until: float | None = None

    def describe(self) -> str:
        parts = [f"tenant `{self.tenant}`" if self.tenant else "all tenants"]
        if self.since is not None:
            parts.append(f"from {_when(self.since)}")
        if self.until is not None:
            parts.append(f"before {_when(self.until)}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a bundle is made of. ``note``: the checkpoint with the witnesses' cosignature
    lines; ``log_key``: the log's note verifier key; ``stamp``: the TSA's whole
    TimeStampResp (DER) over the checkpoint's body, if it has one; ``tsa_roots``: PEM."""

    note: str
    log_key: str
    records: int
    selection: Selection
    stamp: bytes | None = None
    tsa_roots: bytes | None = None
    witness_keys: tuple[str, ...] = ()

    @property
    def body(self) -> str:
        return self.note.split("\n\n", 1)[0] + "\n"

    @property
    def checkpoint(self) -> Checkpoint:
        return parse_checkpoint(self.body)

    def cosigned(self) -> list[tuple[str, int]]:
        """``(name, time)`` of each witness key's valid cosignature of the checkpoint."""
        lines = [f"{line}\n" for line in self.note.rpartition("\n\n")[2].splitlines()]
        found = []
        for vkey in self.witness_keys:
            key = CosignerKey.parse(vkey)
            times = [t for line in lines if (t := key.timestamp(self.body, line)) is not None]
            if times:
                found.append((key.name, times[0]))
        return found

    def stamped_at(self) -> datetime | None:
        """The stamp's time (by the TSA's clock); ``EvidenceError`` if it stamps other bytes."""
        if self.stamp is None:
            return None
        from rfc3161_client import decode_timestamp_response  # only for a bundle with a stamp

        info = decode_timestamp_response(self.stamp).tst_info
        if info.message_imprint.message != hashlib.sha256(self.body.encode()).digest():
            raise EvidenceError(f"the stored timestamp of checkpoint {self.checkpoint.size} "
                                "stamps other bytes")  # fmt: skip
        return info.gen_time


def verifier_source() -> bytes:
    """The Go verifier shipped as ``verify.go`` (package data beside this module)."""
    return (resources.files("audit") / "evidence_verify.go").read_bytes()


def members(evidence: Evidence, go_source: bytes) -> list[tuple[str, bytes]]:
    """Every file of the bundle but the records, as ``(path in the bundle, bytes)``;
    ``EvidenceError`` if the log key did not sign the checkpoint."""
    signature = _log_signature(evidence)
    files = [("README.md", readme(evidence).encode()), (NOTE, evidence.note.encode()),
             (BODY, evidence.body.encode()), (SIGNATURE, signature)]  # fmt: skip
    if evidence.stamp is not None:
        files.append((STAMP, evidence.stamp))
    files += [(LOG_VKEY, f"{evidence.log_key}\n".encode()), (LOG_PEM, _log_pem(evidence.log_key))]
    if evidence.tsa_roots is not None:
        files.append((TSA_ROOTS, evidence.tsa_roots))
    files += [(path, f"{key}\n".encode()) for path, key in _witness_files(evidence)]
    files += [("go.mod", GO_MOD.encode()), ("go.sum", GO_SUM.encode()), ("verify.go", go_source)]
    return files


def write_bundle(out: BinaryIO, files: Sequence[tuple[str, bytes]], records: BinaryIO,
                 records_size: int, mtime: float) -> None:  # fmt: skip
    """The tar (POSIX pax) of ``files`` and, as ``records.jsonl``, ``records`` (its first
    ``records_size`` bytes), all under ``ROOT/``, readable by all, owned by no one in particular."""
    paths = [path for path, _ in files]
    directories = {ROOT} | {f"{ROOT}/{path.rpartition('/')[0]}" for path in paths if "/" in path}
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in sorted(directories):
            tar.addfile(_info(directory, 0, mtime, tarfile.DIRTYPE))
        for path, data in files:
            tar.addfile(_info(f"{ROOT}/{path}", len(data), mtime), io.BytesIO(data))
        records.seek(0)
        tar.addfile(_info(f"{ROOT}/{RECORDS}", records_size, mtime), records)


def _info(name: str, size: int, mtime: float, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.type = size, int(mtime), kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def commands(evidence: Evidence) -> list[str]:
    """The shell commands that check the bundle, run from its directory."""
    out = []
    if evidence.stamp is not None:
        roots = TSA_ROOTS if evidence.tsa_roots is not None else NO_ROOTS
        out.append(f"openssl ts -verify -in {STAMP} -data {BODY} -CAfile {roots}")
    out.append(f"openssl pkeyutl -verify -pubin -inkey {LOG_PEM} -rawin -in {BODY} "
               f"-sigfile {SIGNATURE}")  # fmt: skip
    quorum = len(evidence.cosigned())
    out.append("go run ." + (f" -quorum {quorum}" if quorum else ""))
    witnesses = "".join(f" --witness-key {path}" for path, _ in _witness_files(evidence))
    policy = f"{witnesses} --quorum {quorum}" if quorum else ""
    out.append(f"thinkgate ledger verify --export {RECORDS} --public-key {LOG_VKEY}{policy}")
    return out


def readme(evidence: Evidence) -> str:
    """The bundle's README.md: what it holds, the commands, what they prove and what not."""
    head = evidence.checkpoint
    root = base64.b64encode(head.root).decode()
    return "\n".join([
        f"# Evidence from the transparency log `{head.origin}`",
        "",
        f"{evidence.records} records ({evidence.selection.describe()}) with their inclusion proofs "
        f"against one checkpoint of the log: tree size {head.size}, root hash `{root}`.",
        "",
        _stamp_paragraph(evidence),
        "",
        _witness_paragraph(evidence),
        "",
        "## Check it",
        "",
        "From this directory, offline but for Go's first download of golang.org/x/mod v0.7.0 "
        "(pinned by `go.sum`). Tools: OpenSSL 3, Go 1.19 or later, and, for the last line "
        "only, thinkgate (`pip install thinkgate`). Each command must exit with status 0.",
        "",
        "```sh",
        *commands(evidence),
        "```",
        "",
        *_explanations(evidence),
        "",
        "## Files",
        "",
        "| file | what it is |",
        "|---|---|",
        *(f"| `{path}` | {what} |" for path, what in _file_table(evidence)),
        "",
        "## What this does not prove",
        "",
        "- That the keys are the right ones: the operator put them here. Compare `log.vkey` "
        "(and the witnesses' keys, and the TSA's root) with copies you got another way (the "
        "log's published key, the witnesses' and the TSA's own publications) before you rely "
        "on the checks.",
        "- That the log holds no other records of this selection: a proof shows a record is in the "
        "tree, not that nothing else is. Cosignatures show that the witnesses saw this same "
        "checkpoint and checked that it extends every one they saw before: a tree shown to you "
        "alone would not carry them.",
        "- What the records say: their bodies are encrypted (AES-256-GCM under per-record keys "
        "the operator holds); only the headers are readable. A shredded tenant's records still "
        "prove, and stay unreadable.",
        "- When a record was written, beyond \"no later than the stamp\": the time in a header "
        "is the gateway's own clock.",
        "",
    ])  # fmt: skip


def _stamp_paragraph(evidence: Evidence) -> str:
    when = evidence.stamped_at()
    if when is None:
        return ("**No RFC 3161 timestamp.** When the bundle was made no stamped checkpoint "
                "covered its newest record (or the log has no Time-Stamp Authority): the checks "
                "prove that the records are in the log the key signs, not when they were "
                "written. Export again once a later checkpoint is stamped, or with an "
                "`--until` before the last stamp.")  # fmt: skip
    roots = ("the TSA's roots are in `tsa-roots.pem`" if evidence.tsa_roots is not None
             else f"put the TSA's root certificate in `{NO_ROOTS}` first: the operator "
                  "configured none")  # fmt: skip
    return (f"The checkpoint carries an RFC 3161 timestamp of {when.isoformat()} (the TSA's "
            f"clock): every record here existed no later than that; {roots}.")  # fmt: skip


def _witness_paragraph(evidence: Evidence) -> str:
    cosigned = evidence.cosigned()
    if not evidence.witness_keys:
        return "The log has no witnesses configured: the checkpoint carries no cosignatures."
    named = ", ".join(f"`{name}` at {_when(t)}" for name, t in cosigned) or "none of them"
    return (f"Witnesses known to the log: {len(evidence.witness_keys)}; cosigned this "
            f"checkpoint: {named}.")  # fmt: skip


def _explanations(evidence: Evidence) -> list[str]:
    lines = []
    if evidence.stamp is not None:
        lines.append("- `openssl ts -verify`: the token `checkpoint.tsr` (the TSA's whole "
                     "TimeStampResp) is over the SHA-256 of exactly `checkpoint.body`, and its "
                     "signature chains to the TSA's root. `openssl ts -reply -in checkpoint.tsr "
                     "-text` shows its time.")  # fmt: skip
    lines += [
        "- `openssl pkeyutl -verify`: `checkpoint.sig` is the log key's Ed25519 signature of "
        "`checkpoint.body` (`log-key.pem` is the key in `log.vkey`).",
        "- `go run .` (`verify.go`, Go's `golang.org/x/mod/sumdb/note` and `sumdb/tlog` only): "
        "the note's signature by `log.vkey` and its origin; that `checkpoint.body` and "
        "`checkpoint.sig` are the note's; each record's leaf hash recomputed from its own "
        "bytes (RFC 9162: SHA-256 of 0x00, the header's length in 4 bytes, the header, the "
        "ciphertext) and its inclusion proof against the signed root; each witness key's "
        "cosignature (C2SP tlog-cosignature); `-quorum` of them must verify.",
        "- `thinkgate ledger verify --export`: the signature and every proof again, by "
        "thinkgate's own verifier, with the witness policy given.",
    ]  # fmt: skip
    return lines


def _file_table(evidence: Evidence) -> list[tuple[str, str]]:
    table = [
        (RECORDS, "`ledger export`'s JSON lines: line 1 `{\"checkpoint\": note}`, then per "
                  "record `index`, `header` and `ciphertext` (base64), `leaf_hash`, `hashes` "
                  "(its RFC 9162 inclusion proof)"),
        (NOTE, "the checkpoint: a C2SP signed note (tlog-checkpoint), the log's signature and "
               "the witnesses' cosignature lines"),
        (BODY, "the checkpoint's signed text `origin\\nsize\\nroot\\n`: the bytes the TSA "
               "stamped"),
        (SIGNATURE, "the log's 64-byte Ed25519 signature of `checkpoint.body`"),
    ]  # fmt: skip
    if evidence.stamp is not None:
        table.append((STAMP, "the RFC 3161 TimeStampResp (DER) over `checkpoint.body`"))
    table += [(LOG_VKEY, "the log's note verifier key `<name>+<key id>+<base64 key>`"),
              (LOG_PEM, "the same public key as PEM (SubjectPublicKeyInfo)")]  # fmt: skip
    if evidence.tsa_roots is not None:
        table.append((TSA_ROOTS, "the TSA root certificates the operator trusts (PEM)"))
    table += [(path, f"the verifier key of witness `{CosignerKey.parse(key).name}`")
              for path, key in _witness_files(evidence)]  # fmt: skip
    table += [("go.mod, go.sum", "the Go module of `verify.go`, pinning golang.org/x/mod"),
              ("verify.go", "the Go verifier")]  # fmt: skip
    return table


def _witness_files(evidence: Evidence) -> list[tuple[str, str]]:
    return [(f"witnesses/{n}.vkey", key) for n, key in enumerate(evidence.witness_keys, 1)]


def _log_signature(evidence: Evidence) -> bytes:
    """The log key's raw signature in the note, once the note is checked to open with it."""
    try:
        verifier = NoteVerifier(evidence.log_key)
        verifier.open(evidence.note)
    except NoteError as exc:
        raise EvidenceError(f"the checkpoint does not open with the log's key: {exc}") from None
    for line in evidence.note.rpartition("\n\n")[2].splitlines():
        name, _, encoded = line.removeprefix(_DASH).partition(" ")
        raw = base64.b64decode(encoded)
        if name == verifier.name and int.from_bytes(raw[:4], "big") == verifier.key_hash:
            return raw[4:]
    raise EvidenceError("the checkpoint has no signature by the log's key")  # opened: unreachable


def _log_pem(vkey: str) -> bytes:
    typed = base64.b64decode(vkey.split("+", 2)[2])  # 0x01 || key, checked by NoteVerifier
    key = Ed25519PublicKey.from_public_bytes(typed[1:])
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)  # fmt: skip


def tree_size(note: str) -> int:
    """The tree size of the checkpoint ``note`` (a signed note)."""
    return parse_checkpoint(note.split("\n\n", 1)[0] + "\n").size


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
