"""C2SP signed notes and tlog-checkpoints, signed with Ed25519 (sans-I/O, but for the key files).

Specs: https://c2sp.org/signed-note and https://c2sp.org/tlog-checkpoint; the reference
implementation is Go's ``golang.org/x/mod/sumdb/note``, whose published vectors the tests replay.

Rules and invariants:

* A **signed note** is ``text || "\\n" || signature lines``. The text ends with a newline; the
  whole note is valid UTF-8 without ASCII control characters other than newline. The signature
  lines start after the *last* blank line, so the text may itself contain blank lines.
* A **signature line** is ``"— " name " " base64(key ID || signature) "\\n"`` (U+2014 EM DASH,
  then a space). The signature covers exactly the text, final newline included.
* A **key name** is non-empty and has no Unicode space and no ``+``.
* The **key ID** is the first 4 bytes, big-endian, of
  ``SHA-256(name || 0x0A || 0x01 || 32-byte Ed25519 public key)``; 0x01 is the Ed25519 type.
* A **verifier key** is ``<name>+<key ID, 8 hex digits>+<base64(0x01 || public key)>``; the
  key ID is checked against the key when it is parsed.
* **Opening** with one verifier (Go's ``note.Open`` with a one-key list): a malformed line anywhere
  rejects the note; lines by other keys (another name or key ID) are ignored, as the spec requires;
  the first line by this key must verify, later repeats are skipped; without one the note is
  rejected. More than 100 signature lines are refused (Go's limit; the spec demands 16).
* A **checkpoint** body is the origin line, the tree size in decimal without leading zeros, the
  base64 of the 32-byte RFC 6962 root hash, then optional non-empty extension lines, each line
  ending in a newline. Parsing is strict: one checkpoint has exactly one text.

Every malformed note or checkpoint and every bad or missing signature raises :class:`NoteError`.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from audit.errors import AuditError
from audit.keyfiles import write_exclusive

HASH_SIZE = 32
MAX_TREE_SIZE = 2**64 - 1  # Go verifiers parse the size as a uint64

_ED25519 = b"\x01"  # signature type byte (signed-note, "Signature types")
_SIGNATURE_SIZE = 64
_MAX_SIGNATURES = 100
_SIG_PREFIX = "\u2014 "
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f]")
_KEY_HASH = re.compile(r"[0-9a-fA-F]{8}")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")  # [0-9], not \d: \d also matches non-ASCII digits


class NoteError(AuditError, ValueError):
    """A malformed note or checkpoint, or a missing or invalid signature."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A tree head as a tlog-checkpoint body (origin, size, root hash, extension lines)."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.origin or "\n" in self.origin:
            raise ValueError("the origin must be one non-empty line")
        if not 0 <= self.size <= MAX_TREE_SIZE:
            raise ValueError("the tree size must fit in an unsigned 64-bit integer")
        if len(self.root) != HASH_SIZE:
            raise ValueError(f"the root hash must be {HASH_SIZE} bytes")
        if not all(line and "\n" not in line for line in self.extensions):
            raise ValueError("each extension must be one non-empty line")

    def body(self) -> str:
        """``origin\\nsize\\nbase64(root)\\n`` followed by the extension lines."""
        root = base64.b64encode(self.root).decode()
        return "".join(
            f"{line}\n" for line in (self.origin, str(self.size), root, *self.extensions)
        )


def parse_checkpoint(text: str) -> Checkpoint:
    """The checkpoint in a (verified) note text; :class:`NoteError` unless strictly well-formed."""
    try:
        _check_characters(text)
        if not text.endswith("\n"):
            raise ValueError("the last line has no newline")
        origin, size, root, *extensions = _at_least_three(text[:-1].split("\n"))
        return Checkpoint(origin, _parse_size(size), _parse_root(root), tuple(extensions))
    except ValueError as exc:
        raise NoteError(f"malformed checkpoint: {exc}") from None


class NoteSigner:
    """Signs note texts with one Ed25519 key under one key name."""

    __slots__ = ("_key", "_key_hash", "_name", "_public")

    def __init__(self, name: str, key: Ed25519PrivateKey) -> None:
        _check_name(name)
        self._name = name
        self._key = key
        self._public = key.public_key().public_bytes_raw()
        self._key_hash = _key_id(name, _ED25519 + self._public)

    def __repr__(self) -> str:
        return f"NoteSigner({self.verifier_key()!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def key_hash(self) -> int:
        return self._key_hash

    def verifier_key(self) -> str:
        """``<name>+<key ID hex>+<base64(0x01 || public key)>``, for verifiers."""
        return f"{self._name}+{self._key_hash:08x}+{_b64(_ED25519 + self._public)}"

    def sign(self, text: str) -> str:
        """The signed note: ``text``, a blank line and this key's signature line."""
        _check_text(text)
        signature = self._key.sign(text.encode())
        line = f"{_SIG_PREFIX}{self._name} {_b64(self._key_hash.to_bytes(4, 'big') + signature)}"
        return f"{text}\n{line}\n"


class NoteVerifier:
    """Opens notes signed by one Ed25519 key, given as a verifier key string."""

    __slots__ = ("_key", "_key_hash", "_name")

    def __init__(self, vkey: str) -> None:
        self._name, self._key_hash, self._key = _parse_verifier_key(vkey)

    def __repr__(self) -> str:
        return f"NoteVerifier(name={self._name!r}, key_hash=0x{self._key_hash:08x})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def key_hash(self) -> int:
        return self._key_hash

    def open(self, note: str) -> str:
        """The text of ``note`` if this key signed it; :class:`NoteError` otherwise."""
        text, signatures = _split_note(note)
        verified = False
        for name, key_hash, signature in signatures:
            if verified or (name, key_hash) != (self._name, self._key_hash):
                continue  # another key's line, or a repeat of ours (Go skips repeats too)
            if not self._verifies(text, signature):
                raise NoteError(f"invalid signature for key {name}+{key_hash:08x}")
            verified = True
        if not verified:
            raise NoteError(f"no signature by key {self._name}+{self._key_hash:08x}")
        return text

    def _verifies(self, text: str, signature: bytes) -> bool:
        if len(signature) != _SIGNATURE_SIZE:
            return False
        try:
            self._key.verify(signature, text.encode())
        except InvalidSignature:
            return False
        return True


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """An unencrypted PEM PKCS#8 Ed25519 private key; ``ValueError`` for anything else."""
    key = _maybe_private_key(path.read_bytes())
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an unencrypted PEM PKCS#8 Ed25519 private key")
    return key


def default_origin(key: Ed25519PrivateKey) -> str:
    """A log name unique to the signing key: ``thinkgate/`` and 12 hex digits of the SHA-256
    of its public key (every replica mounting the key gets the same one)."""
    public = key.public_key().public_bytes_raw()
    return f"thinkgate/{hashlib.sha256(public).hexdigest()[:12]}"


def create_signing_key(path: Path) -> None:
    """A new Ed25519 key in ``path`` (mode 0600 from creation); ``FileExistsError`` if present."""
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_exclusive(path, pem)


def _key_id(name: str, typed_key: bytes) -> int:
    """SHA-256(name || 0x0A || type byte || public key)[:4], big-endian (signed-note)."""
    digest = hashlib.sha256(name.encode() + b"\n" + typed_key).digest()
    return int.from_bytes(digest[:4], "big")


def _check_name(name: str) -> None:
    if not name or "+" in name or any(char.isspace() for char in name):
        raise NoteError(f"invalid key name {name!r}: empty, or has a space or '+'")
    _check_characters(name)


def _check_characters(text: str) -> None:
    if _CONTROL.search(text):
        raise NoteError("control character")
    try:
        text.encode()
    except UnicodeEncodeError:  # lone surrogates
        raise NoteError("not valid UTF-8") from None


def _check_text(text: str) -> None:
    _check_characters(text)
    if not text.endswith("\n"):
        raise NoteError("note text must end with a newline")


def _parse_verifier_key(vkey: str) -> tuple[str, int, Ed25519PublicKey]:
    name, _, rest = vkey.partition("+")
    hex_hash, _, encoded = rest.partition("+")
    key = _maybe_b64decode(encoded)
    if not _KEY_HASH.fullmatch(hex_hash) or not key:
        raise NoteError("malformed verifier key")
    _check_name(name)
    # Like Go's NewVerifier: the key ID covers the type byte, so check it before the type.
    if int(hex_hash, 16) != _key_id(name, key):
        raise NoteError("verifier key ID does not match the key")
    if key[:1] != _ED25519 or len(key) != 1 + 32:
        raise NoteError("verifier key is not an Ed25519 key")
    return name, int(hex_hash, 16), Ed25519PublicKey.from_public_bytes(key[1:])


def _split_note(note: str) -> tuple[str, list[tuple[str, int, bytes]]]:
    """The text and the parsed ``(name, key ID, signature)`` lines of a note."""
    _check_characters(note)
    split = note.rfind("\n\n")
    if split < 0:
        raise NoteError("malformed note: no blank line before the signatures")
    text, block = note[: split + 1], note[split + 2 :]
    if not block.endswith("\n"):
        raise NoteError("malformed note: no signature lines, or no final newline")
    lines = block[:-1].split("\n")
    if len(lines) > _MAX_SIGNATURES:
        raise NoteError(f"malformed note: more than {_MAX_SIGNATURES} signatures")
    return text, [_parse_signature_line(line) for line in lines]


def _parse_signature_line(line: str) -> tuple[str, int, bytes]:
    name, _, encoded = line.removeprefix(_SIG_PREFIX).partition(" ")
    raw = _maybe_b64decode(encoded)
    if not line.startswith(_SIG_PREFIX) or raw is None or len(raw) < 5:
        raise NoteError("malformed signature line")
    _check_name(name)
    return name, int.from_bytes(raw[:4], "big"), raw[4:]


def _at_least_three(lines: list[str]) -> list[str]:
    if len(lines) < 3:
        raise ValueError("fewer than three lines")
    return lines


def _parse_size(line: str) -> int:
    if not _DECIMAL.fullmatch(line) or int(line) > MAX_TREE_SIZE:
        raise ValueError("the size is not a decimal uint64 without leading zeros")
    return int(line)


def _parse_root(line: str) -> bytes:
    root = _maybe_b64decode(line)
    if root is None or len(root) != HASH_SIZE or _b64(root) != line:
        raise ValueError(f"the root hash is not the canonical base64 of {HASH_SIZE} bytes")
    return root


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _maybe_b64decode(text: str) -> bytes | None:
    """Standard base64 (RFC 4648 §4), strictly: no other characters, padding required."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or non-ASCII text
        return None


def _maybe_private_key(data: bytes) -> PrivateKeyTypes | None:
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):  # TypeError: the key is encrypted
        return None
