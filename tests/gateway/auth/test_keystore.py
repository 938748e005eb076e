"""The key store against real SQLite and PostgreSQL: create, look up, cache bound, revoke."""

from __future__ import annotations

from gateway.auth import keys
from gateway.auth.keystore import KeyStore
from gateway.db import create_engine, upgrade_schema


async def test_create_lookup_revoke(database_url: str) -> None:
    engine = create_engine(database_url)
    await upgrade_schema(engine)
    try:
        store = KeyStore(engine, ttl=0)
        new, info = await store.create(tenant="acme", role="client", reasoning="visible", rpm=60)
        key_id, secret = keys.split_key(new.secret) or ("", "")
        assert key_id == info.key_id
        loaded = await store.get(key_id)
        assert loaded is not None and loaded.tenant == "acme" and loaded.rpm == 60
        assert keys.verify(loaded, secret)
        assert not keys.verify(loaded, secret[:-1] + ("A" if secret[-1] != "A" else "B"))
        assert [k.key_id for k in await store.list("acme")] == [key_id]
        assert await store.revoke(key_id)
        assert not await store.revoke(key_id)
        revoked = await store.get(key_id)
        assert revoked is not None and not revoked.active
    finally:
        await engine.dispose()


async def test_only_the_hash_is_stored(database_url: str) -> None:
    engine = create_engine(database_url)
    await upgrade_schema(engine)
    try:
        new, _ = await KeyStore(engine).create(tenant="t", role="admin")
        async with engine.connect() as conn:
            from sqlalchemy import text

            rows = (await conn.execute(text("SELECT * FROM api_keys"))).all()
        secret = new.secret.split("-", 3)[3]  # after sk-tg-<id>- (the rest may hold "-")
        assert secret.encode() not in repr(rows).encode()
        assert new.secret not in repr(rows)
    finally:
        await engine.dispose()


async def test_cache_serves_within_ttl_and_reloads_after(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    await upgrade_schema(engine)
    now = [0.0]
    try:
        writer = KeyStore(engine, ttl=0)
        reader = KeyStore(engine, ttl=5, clock=lambda: now[0])
        _new, info = await writer.create(tenant="t", role="client")
        assert (await reader.get(info.key_id)) is not None
        await writer.revoke(info.key_id)  # another replica revokes
        cached = await reader.get(info.key_id)
        assert cached is not None and cached.active  # within the documented bound
        now[0] = 5.0
        fresh = await reader.get(info.key_id)
        assert fresh is not None and not fresh.active
    finally:
        await engine.dispose()


def test_key_format() -> None:
    new = keys.generate()
    assert new.secret.startswith("sk-tg-")
    assert keys.split_key(new.secret) is not None
    assert keys.split_key("sk-tg-xyz") is None
    assert keys.split_key(new.secret + "x") is None
