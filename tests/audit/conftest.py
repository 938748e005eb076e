"""Shared fixtures for the ledger suites: key files, engines and ledgers that clean up after
themselves, and the records the suites append.

``ledger_factory`` makes one set of keys per test (a KEK file and an Ed25519 signing key in
``tmp_path``) and opens any number of ledgers and engines on any URL with them; every ledger is
closed and every engine disposed at teardown. Tests that take ``database_url`` (or
``postgres_url``) should list it *before* ``ledger_factory``: fixtures are torn down in reverse,
so the engines are disposed before the test database is dropped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.crypto import FileKeyProvider, KeyProvider
from audit.ledger import Ledger
from audit.merkle import CompactRange, leaf_hash
from audit.note import NoteSigner, NoteVerifier, create_signing_key, load_signing_key
from audit.record import Body, Facts
from audit.verify import Report, verify
from audit.writer import Mode
from gateway.db import create_engine

ORIGIN = "thinkgate.test/ledger"
BASE_TIME = 1_767_225_600.0  # 2026-01-01T00:00:00Z: created_at of record 0, one second apart

TENANTS = ("acme", "globex", "initech")
KEY_IDS = ("key-a", "key-b")
MODELS = ("qwen3-8b", "deepseek-r1")


def completion(index: int, *, tenant: str | None = None, **overrides: Any) -> Facts:
    """The facts of the ``index``-th test record; tenant, key, model and status vary with it."""
    fields: dict[str, Any] = {
        "kind": "completion",
        "tenant": TENANTS[index % len(TENANTS)] if tenant is None else tenant,
        "key_id": KEY_IDS[index % len(KEY_IDS)],
        "request_id": f"req-{index:04d}",
        "model": MODELS[(index // 2) % len(MODELS)],
        "status": "error" if index % 5 == 4 else "ok",
        "created_at": BASE_TIME + index,
    }
    fields.update(overrides)
    return Facts(**fields)


def body(index: int, marker: str = "") -> Body:
    """The body of the ``index``-th test record; ``marker`` goes into every text field."""
    return Body(
        messages=[
            {"role": "system", "content": f"system prompt {marker}"},
            {"role": "user", "content": f"question {index} {marker}"},
        ],
        params={"temperature": 0.5, "max_tokens": 100 + index, "user": f"u{marker}"},
        reasoning=(f"thinking about {index} ", f"step two {marker}"),
        content=(f"answer {index} ", f"done {marker}"),
    )


async def append_records(ledger: Ledger, count: int, start: int = 0) -> list[Facts]:
    """Append records ``start .. start + count - 1`` one at a time (one commit, so one
    checkpoint, each in strict mode) and return their facts."""
    appended = []
    for index in range(start, start + count):
        facts = completion(index)
        await ledger.append(facts, body(index))
        appended.append(facts)
    return appended


async def leaf_hashes(ledger: Ledger, size: int) -> list[bytes]:
    """The leaf hashes of records ``0 .. size - 1``, recomputed from their stored bytes."""
    return [leaf_hash((await ledger.sealed(i)).leaf_data()) for i in range(size)]


def root_of(leaves: list[bytes]) -> bytes:
    tree = CompactRange()
    for leaf in leaves:
        tree.append(leaf)
    return tree.root()


async def execute(engine: AsyncEngine, *statements: str, **params: Any) -> None:
    """Run raw SQL statements in one committed transaction (what a DBA at a prompt does)."""
    async with engine.begin() as conn:
        for statement in statements:
            await conn.execute(text(statement), params)


class LedgerFactory:
    """One set of keys; ledgers and engines opened with them, all closed at teardown."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key_file = directory / "ledger-keys.json"
        self.signing_key_file = directory / "signing-key.pem"
        FileKeyProvider.create(self.key_file)
        create_signing_key(self.signing_key_file)
        self._engines: dict[str, AsyncEngine] = {}
        self._ledgers: list[Ledger] = []

    def signer(self) -> NoteSigner:
        return NoteSigner(ORIGIN, load_signing_key(self.signing_key_file))

    def verifier(self) -> NoteVerifier:
        return NoteVerifier(self.signer().verifier_key())

    def engine(self, url: str) -> AsyncEngine:
        """One engine per URL, disposed at teardown."""
        if url not in self._engines:
            self._engines[url] = create_engine(url)
        return self._engines[url]

    async def open(
        self,
        url: str,
        *,
        mode: Mode = "strict",
        provider: KeyProvider | None = None,
        **options: Any,
    ) -> Ledger:
        ledger = await Ledger.open(
            self.engine(url),
            FileKeyProvider.load(self.key_file) if provider is None else provider,
            self.signer(),
            origin=ORIGIN,
            spool_path=self.directory / f"spool-{len(self._ledgers)}.log",
            mode=mode,
            **options,
        )
        self._ledgers.append(ledger)
        return ledger

    async def verify(self, url: str) -> Report:
        return await verify(self.engine(url), self.verifier(), ORIGIN)

    async def aclose(self) -> None:
        try:
            for ledger in self._ledgers:
                await ledger.aclose()  # a second aclose() of one ledger does nothing
        finally:
            for engine in self._engines.values():
                await engine.dispose()


@pytest.fixture
async def ledger_factory(tmp_path: Path) -> AsyncIterator[LedgerFactory]:
    factory = LedgerFactory(tmp_path / "ledger")
    try:
        yield factory
    finally:
        await factory.aclose()


@pytest.fixture
async def ledger(database_url: str, ledger_factory: LedgerFactory) -> Ledger:
    """A strict-mode ledger on a fresh database of each backend."""
    return await ledger_factory.open(database_url)
