"""Bearer-key authentication and role checks for every route family.

``/v1`` takes client keys, ``/audit/v1`` auditor keys, ``/admin/v1`` admin keys: a key of
another role gets 403 (least privilege: an admin key is not a client key). Every failure says
what is wrong without echoing the presented key.
"""

from __future__ import annotations

from gateway.auth import keys
from gateway.auth.keys import KeyInfo, Role
from gateway.auth.keystore import KeyStore
from gateway.errors import AuthError, PermissionDenied


def bearer(header: str | None) -> str:
    if not header:
        raise AuthError(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            code="missing_api_key",
        )
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("The Authorization header must be 'Bearer <key>'.")
    return token.strip()


async def authenticate(store: KeyStore, header: str | None, role: Role) -> KeyInfo:
    parts = keys.split_key(bearer(header))
    info = await store.get(parts[0]) if parts else None
    if parts is None or info is None or not keys.verify(info, parts[1]):
        raise AuthError("Incorrect API key provided.")
    if not info.active:
        raise AuthError("This API key has been revoked.", code="revoked_api_key")
    if info.role != role:
        raise PermissionDenied(f"This route needs a key with the role '{role}'.")
    return info
