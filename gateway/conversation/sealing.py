"""Reasoning handed to a client sealed (``encrypted_content``), and opened when it comes back.

A client that must carry reasoning across turns without reading it (a hidden key, or any
``store: false`` client of the Responses API) gets the reasoning as an opaque token; when a
later request brings the token back, the gateway opens it and gives the engine the reasoning.

Scheme (version 1), for the README:

- Key: ``HKDF-SHA256(ikm = the tenant's ledger data key, salt = 16 random bytes per token,
  info = "thinkgate/reasoning/v1")``, 32 bytes, used once, with AES-256-GCM (random 12-byte
  nonce). The data key is the one the tenant's ledger records are sealed under
  (``audit.datakeys``): wrapped at rest under the KEK, rotated by re-wrapping, destroyed by
  ``thinkgate ledger shred``, which makes every token of the tenant unopenable, as it makes
  its records unreadable.
- Associated data binds the token to its tenant and model: ``"tgr1" || dek_id || expiry ||
  tenant || 0x00 || model``. A token opened by another tenant or for another model fails.
- Token: ``base64url("tgr1" || len(dek_id) (1 byte) || dek_id || expiry (8 bytes, Unix
  seconds, big-endian) || salt || nonce || ciphertext || tag)``, no padding. ``dek_id`` is the
  key id: rotation of the KEK changes nothing, a new data key gets a new id.
- Opening checks, before any decryption: the version, the layout, the expiry
  (``REASONING_TOKEN_TTL_S``, default 30 days), and that the data key belongs to the caller's
  tenant. Every failure is one 400 ``invalid_encrypted_content`` naming the item's field,
  with the same message whatever failed (no oracle).
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from audit.datakeys import DataKeys
from gateway.api.items import SealedReasoning
from gateway.errors import InvalidRequest

VERSION = b"tgr1"
_INFO = b"thinkgate/reasoning/v1"
_SALT, _NONCE, _TAG = 16, 12, 16
_MESSAGE = "The 'encrypted_content' cannot be opened: it was not made for this tenant and model, "
_MESSAGE += "has expired, was altered, or its tenant's keys were destroyed."


class InvalidEncryptedContent(InvalidRequest):
    code = "invalid_encrypted_content"

    def __init__(self, param: str) -> None:
        super().__init__(_MESSAGE, param=param)


def aead(dek: bytes, salt: bytes, info: bytes) -> AESGCM:
    """The one-use AES-256-GCM key ``HKDF-SHA256(dek, salt, info)`` (tokens, stored responses)."""
    return AESGCM(HKDF(hashes.SHA256(), 32, salt, info).derive(dek))


def _key(dek: bytes, salt: bytes) -> AESGCM:
    return aead(dek, salt, _INFO)


def _aad(dek_id: bytes, expiry: int, tenant: str, model: str) -> bytes:
    return b"".join((VERSION, dek_id, struct.pack(">Q", expiry), tenant.encode(), b"\0",
                     model.encode()))  # fmt: skip


def seal(dek_id: str, dek: bytes, tenant: str, model: str, expiry: int, text: str) -> str:
    """One token for ``text`` (sans-I/O: the key is at hand)."""
    kid = dek_id.encode()
    salt, nonce = os.urandom(_SALT), os.urandom(_NONCE)
    sealed = _key(dek, salt).encrypt(nonce, text.encode(), _aad(kid, expiry, tenant, model))
    raw = b"".join((VERSION, bytes([len(kid)]), kid, struct.pack(">Q", expiry), salt, nonce,
                    sealed))  # fmt: skip
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass(frozen=True, slots=True)
class _Parsed:
    dek_id: str
    expiry: int
    salt: bytes
    nonce: bytes
    sealed: bytes


def _parse(token: str) -> _Parsed | None:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        return None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != token:
        return None  # one spelling per token: no padding, no character outside the alphabet
    if raw[:4] != VERSION or len(raw) < 5:
        return None
    n = raw[4]
    kid, rest = raw[5 : 5 + n], raw[5 + n :]
    if len(kid) != n or len(rest) < 8 + _SALT + _NONCE + _TAG:
        return None
    try:
        dek_id = kid.decode("ascii")
    except UnicodeDecodeError:
        return None
    (expiry,) = struct.unpack(">Q", rest[:8])
    salt, nonce = rest[8 : 8 + _SALT], rest[8 + _SALT : 8 + _SALT + _NONCE]
    return _Parsed(dek_id, expiry, salt, nonce, rest[8 + _SALT + _NONCE :])


class ReasoningSealer:
    """Seals and opens reasoning tokens with the tenants' ledger data keys."""

    def __init__(
        self, keys: DataKeys, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._keys = keys
        self._ttl_s = ttl_s
        self._clock = clock

    async def sealer(self, tenant: str, model: str) -> Callable[[str], str]:
        """A sync sealer for one response (the key fetched now, once)."""
        dek_id, dek = await self._keys.for_sealing(tenant)
        expiry = int(self._clock() + self._ttl_s)
        return lambda text: seal(dek_id, dek, tenant, model, expiry, text)

    async def open(self, tenant: str, model: str, tokens: list[SealedReasoning]) -> dict[str, str]:
        """Each token's text; ``InvalidEncryptedContent`` for the first that fails."""
        opened: dict[str, str] = {}
        for item in tokens:
            if item.token not in opened:
                opened[item.token] = await self._open(tenant, model, item)
        return opened

    async def _open(self, tenant: str, model: str, item: SealedReasoning) -> str:
        parsed = _parse(item.token)
        if parsed is None or parsed.expiry < self._clock():
            raise InvalidEncryptedContent(item.param)
        dek = await self._keys.opening(parsed.dek_id, tenant=tenant)
        if dek is None:  # another tenant's key, unknown, or shredded: never decrypted
            raise InvalidEncryptedContent(item.param)
        aad = _aad(parsed.dek_id.encode(), parsed.expiry, tenant, model)
        try:
            plain = _key(dek, parsed.salt).decrypt(parsed.nonce, parsed.sealed, aad)
            return plain.decode()
        except (InvalidTag, UnicodeDecodeError):
            raise InvalidEncryptedContent(item.param) from None
