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
