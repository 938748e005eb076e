"""The ledger's migrations: ``HEAD`` names the newest revision, and a current schema is
recognised without importing Alembic (a gateway process would carry it in memory for good)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.script import ScriptDirectory

from audit import migrate

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import asyncio, sys
from audit.migrate import upgrade
from gateway.db import create_engine
async def main():
    engine = create_engine(sys.argv[1])
    await upgrade(engine)
    await engine.dispose()
asyncio.run(main())
print("alembic" in sys.modules)
"""


def test_head_is_the_newest_revision() -> None:
    assert ScriptDirectory.from_config(migrate.config()).get_current_head() == migrate.HEAD


def test_a_current_schema_is_recognised_without_alembic(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", PROBE, url], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        return done.stdout.strip()

    assert run() == "True"  # a fresh database: Alembic creates the schema
    assert run() == "False"  # from then on, one query and no Alembic


def test_the_key_stores_head_is_its_newest_revision() -> None:
    from gateway.db import GATEWAY

    assert ScriptDirectory.from_config(GATEWAY.config()).get_current_head() == GATEWAY.head


async def test_a_key_table_made_before_migrations_is_kept_and_stamped(tmp_path: Path) -> None:
    # deployments before this change had the table from create_all: it stays, with its rows
    from sqlalchemy import insert, inspect, select

    from gateway.auth.keystore import api_keys
    from gateway.db import GATEWAY, create_engine, metadata, upgrade_schema

    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'old.db'}")
    row = {"key_id": "k1", "secret_hash": b"\0" * 32, "tenant": "t", "role": "client",
           "reasoning": "hidden", "created_at": __import__("datetime").datetime.now()}  # fmt: skip
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(insert(api_keys).values(**row))
    await upgrade_schema(engine)
    await upgrade_schema(engine)  # current: nothing to do
    async with engine.connect() as conn:
        assert (await conn.execute(select(api_keys.c.key_id))).scalars().all() == ["k1"]
        assert await conn.run_sync(GATEWAY.current) == GATEWAY.head
        assert await conn.run_sync(lambda c: inspect(c).has_table("gateway_alembic_version"))
    await engine.dispose()


def test_processes_starting_together_on_a_fresh_sqlite_file_all_migrate(tmp_path: Path) -> None:
    """``serve --workers N`` starts its workers at once: each upgrades the same new file."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'together.db'}"
    started = [subprocess.Popen([sys.executable, "-c", PROBE, url], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for _ in range(6)]  # fmt: skip
    outcomes = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in started]
    for p in started:
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
    assert [code for code, _ in outcomes] == [0] * 6, [err[-500:] for _, err in outcomes]


async def test_a_sqlite_upgrade_waits_for_the_file_lock(tmp_path: Path) -> None:
    import asyncio
    import fcntl
    import os

    from gateway.db import create_engine

    database = tmp_path / "locked.db"
    fd = os.open(f"{database}.migrate.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process migrating
    engine = create_engine(f"sqlite+aiosqlite:///{database}")
    try:
        upgrading = asyncio.create_task(migrate.upgrade(engine))
        done, _ = await asyncio.wait({upgrading}, timeout=0.5)
        assert not done  # it waits for the lock
        os.close(fd)
        await asyncio.wait_for(upgrading, timeout=30)
    finally:
        await engine.dispose()
