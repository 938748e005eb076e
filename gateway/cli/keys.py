"""The ``thinkgate keys`` commands: the key store, opened against ``DATABASE_URL``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.auth.keys import ReasoningPolicy, Role, split_key, valid_tenant
from gateway.auth.keystore import KeyStore
from gateway.db import create_engine, upgrade_schema
from gateway.settings import Settings


@asynccontextmanager
async def open_store(settings: Settings) -> AsyncIterator[KeyStore]:
    engine = create_engine(settings.database_url)
    try:
        await upgrade_schema(engine)
        yield KeyStore(engine, ttl=0)
    finally:
        await engine.dispose()


async def create_key(
    settings: Settings,
    tenant: str,
    role: Role,
    reasoning: ReasoningPolicy,
    rpm: int | None,
    tpm: int | None,
) -> tuple[str, str]:
    """``(secret, description)`` of a new key."""
    if not valid_tenant(tenant, role):
        raise SystemExit("tenant names are letters, digits, '.', '_' and '-' (at most 64)")
    async with open_store(settings) as store:
        new, info = await store.create(
            tenant=tenant, role=role, reasoning=reasoning, rpm=rpm, tpm=tpm
        )
    return new.secret, f"{info.key_id} tenant={tenant} role={role} reasoning={reasoning}"


async def list_keys(settings: Settings) -> list[str]:
    async with open_store(settings) as store:
        infos = await store.list()
    lines = [f"{'KEY ID':14} {'TENANT':20} {'ROLE':8} {'REASONING':9} {'RPM':>6} {'TPM':>8} STATUS"]
    for i in infos:
        status = "revoked" if i.revoked_at else "active"
        reasoning = i.reasoning if i.role == "client" else "-"  # only client keys read any
        lines.append(
            f"{i.key_id:14} {i.tenant:20} {i.role:8} {reasoning:9} "
            f"{i.rpm or '-':>6} {i.tpm or '-':>8} {status}"
        )
    return lines


async def revoke_key(settings: Settings, given: str) -> tuple[bool, str]:
    """``(revoked, what to say)``: a whole secret is read as its key id (and said so), a key
    already revoked or unknown is named as such."""
    parts = split_key(given)
    key_id = parts[0] if parts else given
    note = f" (the key id of the secret given: {key_id}; pass just the id)" if parts else ""
    async with open_store(settings) as store:
        if await store.revoke(key_id):
            return True, f"revoked {key_id}{note}"
        known = {i.key_id: i for i in await store.list()}
    if key_id in known:
        return False, f"key {key_id} is already revoked{note}"
    return False, f"no key {key_id}{note} (thinkgate keys list shows them)"
