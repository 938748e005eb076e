"""What the three stores of the Responses API share (stored responses, conversations,
background responses): the database, the tenants' data keys, how long they keep what they
store, a clock, and the sealing of a row: a one-use AES-256-GCM box per stored object
(``HKDF-SHA256(data key, salt, info)``, each store its own ``info``), each sealed value
``nonce ‖ ciphertext ‖ tag`` bound to where it belongs by its associated data.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from audit.datakeys import DataKeys
from audit.sqlasync import AsyncEngine
from gateway.conversation.sealing import aead

SALT, NONCE = 16, 12


class SealedStore:
    """A store of sealed rows; ``info`` names the store in its boxes' key derivation."""

    info: bytes

    def __init__(
        self, engine: AsyncEngine, keys: DataKeys, retention_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self._engine = engine
        self._keys = keys
        self._retention_s = retention_s
        self._clock = clock

    async def new_box(self, tenant: str) -> tuple[str, bytes, AESGCM]:
        """A box for a new object of ``tenant``: its data key's id, the salt, the box."""
        dek_id, dek = await self._keys.for_sealing(tenant)
        salt = os.urandom(SALT)
        return dek_id, salt, self.box(dek, salt)

    def box(self, dek: bytes, salt: bytes) -> AESGCM:
        return aead(dek, salt, self.info)

    @staticmethod
    def seal(box: AESGCM, plain: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + box.encrypt(nonce, plain, aad)

    @staticmethod
    def open(box: AESGCM, sealed: bytes, aad: bytes) -> bytes:
        """The plain bytes; ``InvalidTag`` when they are not what was sealed there."""
        return box.decrypt(sealed[:NONCE], sealed[NONCE:], aad)
