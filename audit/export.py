"""``ledger export`` and its offline check: records with inclusion proofs against one checkpoint.

Export format (JSON lines, base64 as in RFC 6962's JSON API):

- line 1: ``{"checkpoint": "<signed note>"}`` — the latest checkpoint when the export began;
- then one line per record, by index: ``{"index", "header", "ciphertext", "leaf_hash",
  "hashes"}`` where ``hashes`` is the RFC 9162 inclusion proof of the record in that checkpoint.

``check_export`` needs only the file and the log's public key (``<name>+<id>+<key>``): it checks
the checkpoint's signature, recomputes each leaf from ``header || ciphertext`` and verifies its
proof against the signed root. No database, no decryption key. Headers are readable JSON, so a
holder of the export sees who/when/what model but never a prompt, trace or answer.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from audit import merkle, store
from audit.errors import AuditError
from audit.ledger import LedgerReader
from audit.note import NoteError, NoteVerifier, parse_checkpoint
from audit.record import Sealed


class ExportInvalid(AuditError):
    """The export does not verify; the message names the line."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def export_lines(
    ledger: LedgerReader, where: store.Filter, note: str | None = None
) -> AsyncIterator[bytes]:
    """The export of the records ``where`` selects, proven against the checkpoint ``note``
    (default: the latest); nothing when the ledger has no checkpoint."""
    note = note if note is not None else await ledger.checkpoint()
    if note is None:
        return
    size = parse_checkpoint(note.split("\n\n", 1)[0] + "\n").size
    yield orjson.dumps({"checkpoint": note}) + b"\n"
    where = replace(where, up_to=size)
    while True:
        page = await ledger.find(where, 500)
        for listed in page:
            yield await _line(ledger, listed.index, size)
        if len(page) < 500:
            return
        where = replace(where, after=page[-1].index)


async def _line(ledger: LedgerReader, index: int, size: int) -> bytes:
    sealed = await ledger.sealed(index)
    proof = await ledger.inclusion(index, size)
    return (
        orjson.dumps(
            {
                "index": index,
                "header": _b64(sealed.header),
                "ciphertext": _b64(sealed.ciphertext),
                "leaf_hash": _b64(proof.leaf_hash),
                "hashes": [_b64(h) for h in proof.hashes],
            }
        )
        + b"\n"
    )


@dataclass(frozen=True, slots=True)
class ExportReport:
    tree_size: int
    records: int


def check_export(lines: Iterable[bytes], verifier: NoteVerifier) -> ExportReport:
    it = iter(lines)
    try:
        first = orjson.loads(next(it))
    except StopIteration:
        raise ExportInvalid("line 1: the export is empty") from None
    except orjson.JSONDecodeError:
        raise ExportInvalid("line 1 is not JSON: this is not a thinkgate ledger export") from None
    note = first.get("checkpoint") if isinstance(first, dict) else None
    if not isinstance(note, str):
        raise ExportInvalid("line 1 has no 'checkpoint': this is not a thinkgate ledger export")
    origin = note.split("\n", 1)[0]
    if origin != verifier.name:
        raise ExportInvalid(f"line 1: the checkpoint is of the log {origin!r}, and the key is "
                            f"{verifier.name!r}'s: the key of another log")  # fmt: skip
    try:
        head = parse_checkpoint(verifier.open(note))
    except (KeyError, TypeError, ValueError, NoteError):
        raise ExportInvalid(
            "line 1: the checkpoint's signature does not verify with this key "
            "(the same log's name, another key, or the note was altered)"
        ) from None
    count = 0
    for number, line in enumerate(it, start=2):
        if line.strip():
            _check_record(number, line, head.size, head.root)
            count += 1
    return ExportReport(head.size, count)


def _check_record(number: int, line: bytes, size: int, root: bytes) -> None:
    try:
        raw: dict[str, Any] = orjson.loads(line)
        sealed = Sealed(_unb64(raw["header"]), _unb64(raw["ciphertext"]))
        hashes = [_unb64(h) for h in raw["hashes"]]
        index = raw["index"]
        if not isinstance(index, int):
            raise TypeError("index")
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ExportInvalid(f"line {number}: not an exported record") from None
    leaf = merkle.leaf_hash(sealed.leaf_data())
    try:
        merkle.verify_inclusion(leaf, index, size, hashes, root)
    except merkle.ProofError:
        raise ExportInvalid(
            f"line {number}: record {index} is not included in the signed checkpoint"
        ) from None


def _unb64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError("base64 string expected")
    return base64.b64decode(value, validate=True)
