"""A real stack on real sockets: the simulator, the gateway in front of it, and keys."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.types import ASGIApp

from audit.note import default_origin, load_signing_key
from gateway.app import create_app
from gateway.cli.keys import open_store
from gateway.edge.servers import BackgroundServer
from gateway.ledger.record import CompletionRecord, DiscardSink, RecordSink
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimApp, SimConfig, create_sim_app
from tests.pgserver import PgServer, PgServerError


@dataclass
class Stack:
    url: str  # the gateway's OpenAI base URL, ending in /v1
    root: str  # the gateway's root URL
    sim: SimApp | None
    keys: dict[str, str]  # visible, hidden, auditor, admin, revoked; other: another tenant's
    app: Any = None  # the gateway's front door (``app.framework.state.tg``: its state)


StackFactory = Callable[..., Any]


async def make_keys(settings: Settings) -> dict[str, str]:
    async with open_store(settings) as store:
        made = {
            "visible": await store.create(tenant="acme", role="client", reasoning="visible"),
            "hidden": await store.create(tenant="acme", role="client", reasoning="hidden"),
            "auditor": await store.create(tenant="acme", role="auditor"),
            "admin": await store.create(tenant="ops", role="admin"),
            "revoked": await store.create(tenant="acme", role="client", reasoning="visible"),
            "other": await store.create(tenant="globex", role="client", reasoning="visible"),
        }
        await store.revoke(made["revoked"][1].key_id)
    return {name: new.secret for name, (new, _info) in made.items()}


def log_origin(directory: Path) -> str:
    """The name of the log whose signing key is in ``directory`` (a new log's default)."""
    return default_origin(load_signing_key(directory / "signing-key.pem"))


def spool_cannot_take(spool: Path) -> None:
    """Make the spool file refuse every write: its path becomes a directory. The gateway holds
    the file it claimed at start (``audit.spool.claim``), so the file is unlinked first; its
    next append opens the path, now a directory, and fails."""
    spool.unlink(missing_ok=True)
    spool.mkdir()


def ledger_files(directory: Path) -> dict[str, Path]:
    """Settings that keep a test's ledger keys and spool in its own directory; the gateway
    start creates nothing (outside demo mode): ``ensure_keys(settings.ledger, create=True)``."""
    return {
        "ledger_key_file": directory / "ledger-keys.json",
        "signing_key_file": directory / "signing-key.pem",
        "audit_spool_file": directory / "spool.log",
    }


class RecordingSink(DiscardSink):
    """Collects records and lets a test wait, with a deadline, until some have arrived
    (write-ahead intents: none, as ``DiscardSink``)."""

    def __init__(self) -> None:
        self.records: list[CompletionRecord] = []
        self._changed = asyncio.Condition()

    async def prepare(self, tenant: str) -> None:
        return None

    def accepting(self) -> bool:
        return True

    async def submit(self, record: CompletionRecord) -> None:
        async with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    async def wait_for(self, count: int) -> list[CompletionRecord]:
        async with asyncio.timeout(20), self._changed:  # a loaded machine's commits
            await self._changed.wait_for(lambda: len(self.records) >= count)
        return self.records


@pytest.fixture
async def stack_factory(tmp_path: Path) -> AsyncIterator[StackFactory]:
    """``await stack_factory(sim=SimConfig(...), upstreams=[...], **settings)``."""
    async with AsyncExitStack() as exits:

        async def factory(
            sim: SimConfig | None = None,
            upstream_apps: list[ASGIApp] | None = None,
            extra_upstreams: tuple[str, ...] = (),
            sink: RecordSink | None = None,
            **overrides: Any,
        ) -> Stack:
            upstreams = list(extra_upstreams)
            sim_app = None
            for app in upstream_apps or []:
                server = await exits.enter_async_context(BackgroundServer(app))
                upstreams.append(f"{server.url}/v1")
            if sim is not None or not upstreams:
                sim_app = create_sim_app(sim or SimConfig())
                server = await exits.enter_async_context(BackgroundServer(sim_app))
                upstreams.append(f"{server.url}/v1")
            defaults = {
                "database_url": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
                "models_cache_ttl_s": 0,
                **ledger_files(tmp_path),
            }
            settings = Settings(upstreams=tuple(upstreams), **{**defaults, **overrides})
            ensure_keys(settings.ledger, create=True)
            keys = await make_keys(settings)
            app = create_app(settings, sink=sink)
            gateway = await exits.enter_async_context(BackgroundServer(app))
            return Stack(url=f"{gateway.url}/v1", root=gateway.url, sim=sim_app, keys=keys,
                         app=app)  # fmt: skip

        yield factory


@pytest.fixture
async def stack(stack_factory: StackFactory) -> Stack:
    result: Stack = await stack_factory()
    return result


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PgServer]:
    """A PostgreSQL server of this test worker's own (``tests/pgserver.py``), for tests that
    kill it and start it again; each test makes its own database in it and leaves the server
    running. Started once per worker; tests that use it share an ``xdist_group`` so that one
    worker (one initdb) serves them all. A server that cannot be started skips the test with
    the reason, or fails it when ``CI`` is set (DESIGN §4)."""
    try:
        server = PgServer.create()
    except (PgServerError, OSError, subprocess.SubprocessError) as exc:
        message = f"cannot start a private PostgreSQL server: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield server
    finally:
        server.close()
