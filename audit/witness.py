"""C2SP tlog-witness and tlog-cosignature (Ed25519, ``cosignature/v1``), both sides (sans-I/O).

Specs: https://c2sp.org/tlog-witness and https://c2sp.org/tlog-cosignature.

* A **cosignature** is a note signature line ``— <name> base64(key ID || timestamp || sig)``:
  the key ID is ``SHA-256(name || "\\n" || 0x04 || public key)[:4]``, the timestamp a
  big-endian u64 of POSIX seconds, the Ed25519 signature over ``"cosignature/v1\\n" ||
  "time <timestamp>\\n" || checkpoint body``. A cosigner's verifier key is
  ``<name>+<key ID hex>+base64(0x04 || public key)``.
* ``add-checkpoint`` bodies: ``old <size>\\n``, one base64 consistency-proof hash per line
  (at most 63), an empty line, then the signed checkpoint.
* The **witness's decision** (``decide``), given the log's verifier and what it cosigned last
  for that origin: unknown origin 404; no valid signature by the log 403; malformed 400; old
  size above the checkpoint's 400; old size not the one it cosigned last 409 (the body is its
  size: ``text/x.tlog.size``); the same size with another root 409 (a fork); a consistency
  proof that does not verify 422 (also a fork, or a broken log). Otherwise it cosigns and the
  caller must store the new size and root atomically with that check.
* A **policy** (``WitnessPolicy``): the cosigner keys a verifier trusts and how many of them
  must have cosigned a checkpoint; ``check`` counts valid cosignatures by distinct trusted keys.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from audit import merkle
from audit.errors import AuditError
from audit.note import Checkpoint, NoteError, NoteVerifier, parse_checkpoint

COSIGNATURE_V1 = b"\x04"
MAX_PROOF_LINES = 63
_DASH = "\u2014 "


class WitnessError(AuditError, ValueError):
    """A malformed cosignature, cosigner key or add-checkpoint body."""


def _key_id(name: str, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + COSIGNATURE_V1 + public).digest()[:4]


def _message(body: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n{body}".encode()


class Cosigner:
    """Signs cosignatures under one name with one Ed25519 key."""

    __slots__ = ("_id", "_key", "_public", "name")

    def __init__(self, name: str, key: Ed25519PrivateKey) -> None:
        if not name or any(c.isspace() for c in name) or "+" in name:
            raise WitnessError("a cosigner name is non-empty, without spaces or '+'")
        self.name = name
        self._key = key
        self._public = key.public_key().public_bytes_raw()
        self._id = _key_id(name, self._public)

    def __repr__(self) -> str:
        return f"Cosigner(name={self.name!r})"

    @property
    def verifier_key(self) -> str:
        encoded = base64.b64encode(COSIGNATURE_V1 + self._public).decode()
        return f"{self.name}+{self._id.hex()}+{encoded}"

    def cosign(self, body: str, timestamp: int) -> str:
        """The signature line (newline-terminated) cosigning the checkpoint ``body``."""
        signature = self._key.sign(_message(body, timestamp))
        raw = self._id + timestamp.to_bytes(8, "big") + signature
        return f"{_DASH}{self.name} {base64.b64encode(raw).decode()}\n"


@dataclass(frozen=True, slots=True)
class CosignerKey:
    """A cosigner's verifier key, parsed."""

    name: str
    key_id: bytes
    key: Ed25519PublicKey
    text: str

    @classmethod
    def parse(cls, vkey: str) -> CosignerKey:
        name, _, rest = vkey.strip().partition("+")
        id_hex, _, encoded = rest.partition("+")
        try:
            typed = base64.b64decode(encoded, validate=True)
            key_id = bytes.fromhex(id_hex)
        except ValueError:
            raise WitnessError(f"not a cosigner key: {vkey[:40]!r}") from None
        if not name or len(key_id) != 4 or len(typed) != 33 or typed[:1] != COSIGNATURE_V1:
            raise WitnessError(f"not an Ed25519 cosignature/v1 key: {vkey[:40]!r}")
        if _key_id(name, typed[1:]) != key_id:
            raise WitnessError(f"the key ID of {name} does not match its key")
        return cls(name, key_id, Ed25519PublicKey.from_public_bytes(typed[1:]), vkey.strip())

    def timestamp(self, body: str, line: str) -> int | None:
        """The time of this key's valid cosignature ``line`` over ``body``, else ``None``
        (another key's line, or a bad signature)."""
        if not line.startswith(_DASH):
            return None
        name, _, encoded = line[len(_DASH) :].rstrip("\n").partition(" ")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except ValueError:
            return None
        if name != self.name or len(raw) != 76 or raw[:4] != self.key_id:
            return None
        timestamp = int.from_bytes(raw[4:12], "big")
        try:
            self.key.verify(raw[12:], _message(body, timestamp))
        except InvalidSignature:
            return None
        return timestamp if timestamp < 2**63 else None


@dataclass(frozen=True, slots=True)
class WitnessPolicy:
    """Trusted cosigners and how many must cosign."""

    keys: tuple[CosignerKey, ...]
    quorum: int

    def check(self, note: str) -> list[str]:
        """The names of the trusted cosigners whose valid cosignature ``note`` carries;
        ``WitnessError`` if fewer than ``quorum``."""
        text, _, lines = note.rpartition("\n\n")
        body = text + "\n"
        signed = [key.name for key in self.keys
                  if any(key.timestamp(body, f"{line}\n") is not None
                         for line in lines.splitlines())]  # fmt: skip
        if len(signed) < self.quorum:
            raise WitnessError(
                f"the checkpoint has {len(signed)} valid cosignatures of {self.quorum} required"
                f" (by: {', '.join(signed) or 'none'})"
            )
        return signed


@dataclass(frozen=True, slots=True)
class AddCheckpoint:
    old: int
    proof: tuple[bytes, ...]
    note: str


def add_checkpoint_body(old: int, proof: Sequence[bytes], note: str) -> bytes:
    lines = [f"old {old}\n", *(base64.b64encode(h).decode() + "\n" for h in proof), "\n"]
    return ("".join(lines) + note).encode()


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise WitnessError("the body is not UTF-8") from None
    head, sep, note = text.partition("\n\n")
    lines = head.split("\n")
    if not sep or not lines[0].startswith("old "):
        raise WitnessError("the body must start with an old size line and a blank line")
    size = lines[0][4:]
    if not (size.isascii() and size.isdigit()) or str(int(size)) != size:
        raise WitnessError("the old size is not a decimal without leading zeroes")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise WitnessError("more than 63 consistency proof lines")
    try:
        proof = tuple(base64.b64decode(line, validate=True) for line in lines[1:])
    except ValueError:
        raise WitnessError("a consistency proof line is not base64") from None
    if any(len(h) != merkle.HASH_SIZE for h in proof):
        raise WitnessError("a consistency proof line is not a SHA-256 hash")
    return AddCheckpoint(int(size), proof, note)


@dataclass(frozen=True, slots=True)
class WitnessAnswer:
    """``status`` 200 with the checkpoint to cosign and record, or an error status with its
    body (a 409's is the witness's size)."""

    status: int
    message: str
    checkpoint: Checkpoint | None = None
    body: str = ""


def decide(
    request: AddCheckpoint, logs: dict[str, NoteVerifier], latest: tuple[int, bytes] | None
) -> WitnessAnswer:
    """What a witness answers (rules in the module docstring). ``logs``: origin → the log's
    verifier; ``latest``: the size and root it last cosigned for the request's origin."""
    origin = request.note.split("\n", 1)[0]
    verifier = logs.get(origin)
    if verifier is None:
        return WitnessAnswer(404, f"unknown log {origin[:80]!r}")
    try:
        checkpoint = parse_checkpoint(verifier.open(request.note))
    except NoteError as exc:
        return WitnessAnswer(403, f"not signed by the log's key: {exc}")
    if request.old > checkpoint.size:
        return WitnessAnswer(400, "the old size is larger than the checkpoint's")
    size, root = latest if latest is not None else (0, b"")
    if request.old != size:
        return WitnessAnswer(409, f"the witness's latest size is {size}", body=f"{size}\n")
    if checkpoint.size == size and size > 0:
        if checkpoint.root != root:
            return WitnessAnswer(409, "another checkpoint of this size was cosigned: a fork",
                            body=f"{size}\n")  # fmt: skip
        return WitnessAnswer(200, "the same checkpoint again", checkpoint)
    if size == 0:
        if request.proof:
            return WitnessAnswer(422, "the proof from size 0 must be empty")
        return WitnessAnswer(200, "the first checkpoint", checkpoint)
    try:
        merkle.verify_consistency(size, checkpoint.size, list(request.proof), root,
                                  checkpoint.root)  # fmt: skip
    except merkle.ProofError as exc:
        return WitnessAnswer(422, f"the consistency proof does not verify: {exc}")
    return WitnessAnswer(200, "consistent", checkpoint)
