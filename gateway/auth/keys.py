"""API keys: format, hashing and the policy a key carries (sans-I/O).

A key looks like ``sk-tg-<key id>-<secret>``: the key id (12 hex digits) is public and names the
row; the secret (32 random bytes, URL-safe base64) is shown once and only its SHA-256 is stored.
A slow password hash is not needed: the secret has 256 bits of entropy, so its hash cannot be
brute-forced, and verification stays a microsecond. The comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Role = Literal["client", "auditor", "admin"]
ReasoningPolicy = Literal["hidden", "visible"]

PREFIX = "sk-tg-"
_KEY_RE = re.compile(r"sk-tg-([0-9a-f]{12})-([A-Za-z0-9_-]{43})")


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What the gateway knows about a key; never holds the secret."""

    key_id: str
    tenant: str
    role: Role
    reasoning: ReasoningPolicy
    rpm: int | None
    tpm: int | None
    created_at: datetime
    revoked_at: datetime | None
    secret_hash: bytes

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    secret: str  # the whole presentable key, shown once
    secret_hash: bytes


def generate() -> NewKey:
    key_id = secrets.token_hex(6)
    raw = secrets.token_urlsafe(32)
    return NewKey(key_id, f"{PREFIX}{key_id}-{raw}", hash_secret(raw))


def hash_secret(raw: str) -> bytes:
    return hashlib.sha256(raw.encode()).digest()


def split_key(presented: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else ``None``."""
    match = _KEY_RE.fullmatch(presented)
    return (match.group(1), match.group(2)) if match else None


def verify(info: KeyInfo, secret: str) -> bool:
    return hmac.compare_digest(info.secret_hash, hash_secret(secret))


ALL_TENANTS = "*"  # only for auditor keys: an auditor of every tenant


def valid_tenant(tenant: str, role: Role = "client") -> bool:
    if tenant == ALL_TENANTS:
        return role == "auditor"
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", tenant) is not None
