"""``authenticate`` (``gateway/auth/bearer.py``) against a real SQLite key store: each way a
presented key can be wrong, the role check, and that no failure echoes the key presented."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.auth import keys
from gateway.auth.bearer import authenticate
from gateway.auth.keys import Role
from gateway.auth.keystore import KeyStore
from gateway.db import create_engine, upgrade_schema
from gateway.errors import AuthError, GatewayError, PermissionDenied


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[KeyStore]:
    engine = create_engine(sqlite_url)
    await upgrade_schema(engine)
    try:
        yield KeyStore(engine, ttl=0)
    finally:
        await engine.dispose()


def tampered(key: str) -> str:
    """``key`` with its last character changed: a known key id, a wrong secret."""
    return key[:-1] + ("A" if key[-1] != "A" else "B")


def assert_silent(error: GatewayError, presented: str) -> None:
    """The error names the problem, never the key (nor its secret half)."""
    secret = presented.split("-", 3)[-1]  # sk-tg-<key id>-<secret>; the secret may hold "-"
    for shown in (error.message, error.to_json().decode(), repr(error.headers())):
        assert presented not in shown and (len(secret) < 8 or secret not in shown)


@pytest.mark.parametrize("header", [None, ""])
async def test_a_missing_header_is_401_missing_api_key(store: KeyStore, header: str | None) -> None:
    with pytest.raises(AuthError) as refused:
        await authenticate(store, header, "client")
    assert refused.value.status == 401 and refused.value.code == "missing_api_key"
    assert "Authorization: Bearer" in refused.value.message


@pytest.mark.parametrize(
    "header",
    ["Basic dXNlcjpwYXNz", "Bearer", "Bearer    ", "sk-tg-000000000000-x", "Token sk-tg-abc"],
)
async def test_a_malformed_bearer_is_401(store: KeyStore, header: str) -> None:
    with pytest.raises(AuthError) as refused:
        await authenticate(store, header, "client")
    assert refused.value.status == 401 and refused.value.code == "invalid_api_key"
    assert refused.value.message == "The Authorization header must be 'Bearer <key>'."


async def test_unknown_and_ill_formed_keys_and_wrong_secrets_look_alike(store: KeyStore) -> None:
    """An unknown key id, a key that is not a key and a known id with a wrong secret get the
    same answer: a guesser learns nothing about which key ids exist."""
    new, _ = await store.create(tenant="acme", role="client")
    for presented in (keys.generate().secret, "sk-tg-not-a-key", tampered(new.secret)):
        with pytest.raises(AuthError) as refused:
            await authenticate(store, f"Bearer {presented}", "client")
        assert refused.value.status == 401 and refused.value.code == "invalid_api_key"
        assert refused.value.message == "Incorrect API key provided."
        assert_silent(refused.value, presented)


async def test_a_revoked_key_is_401_revoked_but_only_to_its_holder(store: KeyStore) -> None:
    new, info = await store.create(tenant="acme", role="client")
    assert await store.revoke(info.key_id)
    with pytest.raises(AuthError) as refused:
        await authenticate(store, f"Bearer {new.secret}", "client")
    assert refused.value.status == 401 and refused.value.code == "revoked_api_key"
    assert_silent(refused.value, new.secret)
    with pytest.raises(AuthError) as guessed:  # the revocation is no oracle for a guesser
        await authenticate(store, f"Bearer {tampered(new.secret)}", "client")
    assert guessed.value.code == "invalid_api_key"


@pytest.mark.parametrize(
    ("has", "route"),
    [("admin", "client"), ("client", "auditor"), ("auditor", "admin"), ("client", "admin")],
)
async def test_a_key_of_another_role_is_403(store: KeyStore, has: Role, route: Role) -> None:
    new, _ = await store.create(tenant="acme", role=has)
    with pytest.raises(PermissionDenied) as refused:
        await authenticate(store, f"Bearer {new.secret}", route)
    assert refused.value.status == 403 and refused.value.type == "permission_error"
    assert f"'{route}'" in refused.value.message
    assert_silent(refused.value, new.secret)


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
async def test_a_good_key_of_the_role_is_its_key_info(store: KeyStore, scheme: str) -> None:
    new, info = await store.create(tenant="acme", role="client", reasoning="visible", tpm=500)
    await store.create(tenant="acme", role="client")  # another key of the tenant
    found = await authenticate(store, f"{scheme} {new.secret}  ", "client")
    assert found.key_id == info.key_id and found.tenant == "acme"
    assert found.role == "client" and found.reasoning == "visible" and found.tpm == 500
