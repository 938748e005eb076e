"""The key store against real SQLite and PostgreSQL: create, look up, cache bound, revoke."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.auth import keys
from gateway.auth.keystore import KeyStore
from gateway.db import create_engine, upgrade_schema
from gateway.errors import DatabaseUnavailable
from tests.tcpproxy import TcpProxy
from tests.waiting import eventually


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


def _key_lookups(engine: AsyncEngine) -> list[str]:
    """The key lookups ``engine`` runs from now on, as they reach the database."""
    seen: list[str] = []

    def executed(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "api_keys" in statement:
            seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", executed)
    return seen


async def test_requests_that_miss_together_share_one_lookup(database_url: str) -> None:
    """The moment a busy key's entry expires, every request in flight misses at once: they
    share one query (before, each took a connection of its own, and the pool overflowed)."""
    engine = create_engine(database_url)
    await upgrade_schema(engine)
    now = [0.0]
    try:
        _new, info = await KeyStore(engine, ttl=0).create(tenant="t", role="client", rpm=7)
        store = KeyStore(engine, ttl=5, clock=lambda: now[0])
        lookups = _key_lookups(engine)
        got = await asyncio.gather(*(store.get(info.key_id) for _ in range(40)))
        assert len(lookups) == 1
        assert {g.key_id if g else None for g in got} == {info.key_id}
        assert {g.rpm if g else None for g in got} == {7}
        now[0] = 6.0  # expired: the next burst shares the next query
        await asyncio.gather(*(store.get(info.key_id) for _ in range(40)))
        assert len(lookups) == 2
    finally:
        await engine.dispose()


async def test_a_key_in_use_is_reloaded_ahead_of_its_expiry(sqlite_url: str) -> None:
    """Past half its TTL, a hit serves the entry and reloads it beside the request: the
    request waits for no query, a revocation on another replica is seen within the TTL as
    before, and the reloaded entry serves past the first one's expiry without a query."""
    engine = create_engine(sqlite_url)
    await upgrade_schema(engine)
    now = [0.0]
    try:
        writer = KeyStore(engine, ttl=0)
        _new, info = await writer.create(tenant="t", role="client")
        store = KeyStore(engine, ttl=5, clock=lambda: now[0])
        lookups = _key_lookups(engine)
        assert (await store.get(info.key_id)) is not None
        await writer.revoke(info.key_id)  # another replica revokes
        lookups.clear()
        now[0] = 2.0  # under half the TTL: served, nothing reloaded
        served = await store.get(info.key_id)
        assert served is not None and served.active and lookups == []
        now[0] = 3.0  # past half: served at once from the entry, reloaded beside it
        served = await store.get(info.key_id)
        assert served is not None and served.active
        await eventually(lambda: len(lookups) == 1 and not store._loading, 5)
        now[0] = 5.5  # past the first entry's TTL, within the reloaded one's (3.0 + 5)
        fresh = await store.get(info.key_id)
        assert fresh is not None and not fresh.active
        assert len(lookups) == 1  # the reloaded entry answered: no query on the way
    finally:
        await engine.dispose()


async def test_a_revocation_here_is_not_undone_by_a_lookup_begun_before_it(
    sqlite_url: str,
) -> None:
    """A lookup that read the key before this replica revoked it must not put the active key
    back in the cache: the next lookup reads afresh. (The lookup is held at the database by
    an event: the race's order, made certain.)"""
    engine = create_engine(sqlite_url)
    await upgrade_schema(engine)
    read, release = asyncio.Event(), asyncio.Event()

    class Held(KeyStore):
        async def _load(self, key_id: str) -> keys.KeyInfo | None:
            info = await super()._load(key_id)
            read.set()
            await release.wait()
            return info

    try:
        store = Held(engine, ttl=5)
        _new, info = await KeyStore(engine, ttl=0).create(tenant="t", role="client")
        early = asyncio.ensure_future(store.get(info.key_id))
        await asyncio.wait_for(read.wait(), 5)  # it read the key while still active
        assert await store.revoke(info.key_id)
        release.set()
        stale = await early
        assert stale is not None and stale.active  # begun before the revocation
        after = await store.get(info.key_id)
        assert after is not None and not after.active
    finally:
        await engine.dispose()


def test_key_format() -> None:
    new = keys.generate()
    assert new.secret.startswith("sk-tg-")
    assert keys.split_key(new.secret) is not None
    assert keys.split_key("sk-tg-xyz") is None
    assert keys.split_key(new.secret + "x") is None


async def test_while_the_database_is_away_known_keys_are_served_and_others_get_503(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL behind a proxy that is cut (every connection reset, new ones refused): a key
    found within ``stale_s`` is still served past its TTL, an unknown one (and one found too
    long ago) gets ``DatabaseUnavailable`` (503, retry-after); the outage is logged once, the
    database asked at most once per second meanwhile; once it is back the key is read afresh,
    so a revocation made meanwhile wins."""
    url = make_url(postgres_url)
    setup = create_engine(postgres_url)
    await upgrade_schema(setup)
    now = [0.0]
    async with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        engine = create_engine(url.set(port=proxy.port).render_as_string(hide_password=False))
        try:
            writer = KeyStore(setup, ttl=0)
            _, known = await writer.create(tenant="t", role="client")
            _, old = await writer.create(tenant="t", role="client")
            _, unknown = await writer.create(tenant="t", role="client")
            store = KeyStore(engine, ttl=5, stale_s=60, clock=lambda: now[0])
            assert await store.get(old.key_id) is not None
            now[0] = 30.0
            assert await store.get(known.key_id) is not None
            await proxy.stop()
            now[0] = 70.0  # past the TTL of both, within stale_s of `known` only
            caplog.set_level(logging.ERROR, logger="thinkgate")
            served = await store.get(known.key_id)
            assert served is not None and served.key_id == known.key_id
            for key_id in (unknown.key_id, old.key_id):
                with pytest.raises(DatabaseUnavailable) as refused:
                    await store.get(key_id)
                assert refused.value.status == 503 and refused.value.headers()["retry-after"]
            assert store.health.down and store.health.outages == 1
            assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1
            await writer.revoke(known.key_id)  # on another replica, which still reaches it
            await proxy.start()
            now[0] = 71.5  # past the second's rest: the next lookup asks the database
            fresh = await store.get(known.key_id)
            assert fresh is not None and not fresh.active and not store.health.down
        finally:
            await engine.dispose()
            await setup.dispose()


async def test_a_lookup_that_joins_a_failing_refresh_is_served_as_in_an_outage(
    sqlite_url: str,
) -> None:
    """The entry expires while its refresh is still on its way, and the database is away: the
    lookup that joins the refresh gets the outage's answer (the key known within
    ``stale_s``), not an unknown key. (The database's failure is injected at the lookup.)"""
    engine = create_engine(sqlite_url)
    await upgrade_schema(engine)
    now = [0.0]
    away, release = [False], asyncio.Event()

    class Failing(KeyStore):
        async def _load(self, key_id: str) -> keys.KeyInfo | None:
            if not away[0]:
                return await super()._load(key_id)
            await release.wait()
            raise OSError("connection refused")  # what an unreachable database raises

    try:
        _new, info = await KeyStore(engine, ttl=0).create(tenant="t", role="client")
        store = Failing(engine, ttl=5, stale_s=60, clock=lambda: now[0])
        assert await store.get(info.key_id) is not None
        away[0], now[0] = True, 3.0
        assert await store.get(info.key_id) is not None  # served; the refresh is on its way
        now[0] = 5.5  # expired: this lookup joins the refresh
        joined = asyncio.ensure_future(store.get(info.key_id))
        await asyncio.sleep(0)  # one turn of the loop: the lookup runs up to its wait
        assert not joined.done() and info.key_id in store._loading
        release.set()
        served = await asyncio.wait_for(joined, 5)
        assert served is not None and served.key_id == info.key_id and store.health.down
    finally:
        await engine.dispose()
