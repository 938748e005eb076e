"""``audit.sqlasync``: SQLAlchemy's async engine without the ORM, and the whole package still
there for whoever asks it for more. Each case runs in a fresh interpreter (the test process has
the ORM loaded already)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, tmp_path: Path) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


ENGINE = r"""
import asyncio, sys
from audit.sqlasync import AsyncEngine, create_async_engine
from sqlalchemy import text

async def main(url):
    engine = create_async_engine(url)
    assert isinstance(engine, AsyncEngine)
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS probe_sqlasync (n INTEGER)"))
        await conn.execute(text("DELETE FROM probe_sqlasync"))
        await conn.execute(text("INSERT INTO probe_sqlasync VALUES (1), (2)"))
    try:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO probe_sqlasync VALUES (3)"))
            raise KeyError
    except KeyError:
        pass
    async with engine.connect() as conn:
        total = (await conn.execute(text("SELECT sum(n) FROM probe_sqlasync"))).scalar()
        await conn.execute(text("DROP TABLE probe_sqlasync"))
        await conn.commit()
    await engine.dispose()
    print(total, "sqlalchemy.orm" in sys.modules)

asyncio.run(main(URL))
"""


def test_the_engine_commits_and_rolls_back_without_the_orm(tmp_path: Path,
                                                           database_url: str) -> None:  # fmt: skip
    url = database_url
    # 3 rolled back; the ORM never loaded
    assert run(f"URL = {url!r}\n{ENGINE}", tmp_path) == "3 False"


def test_the_package_names_of_the_engine_do_not_load_the_orm(tmp_path: Path) -> None:
    code = ("import sys, audit.sqlasync as mine\n"
            "from sqlalchemy.ext.asyncio import AsyncEngine, AsyncResult, create_async_engine\n"
            "print(AsyncEngine is mine.AsyncEngine, 'sqlalchemy.orm' in sys.modules)")  # fmt: skip
    assert run(code, tmp_path) == "True False"


def test_any_other_name_completes_the_package(tmp_path: Path) -> None:
    code = ("import sys, audit.sqlasync\n"
            "from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker\n"
            "import sqlalchemy.ext.asyncio as package\n"
            "print(AsyncSession.__name__, 'sqlalchemy.orm' in sys.modules,"
            " package.AsyncEngine is audit.sqlasync.AsyncEngine,"
            " '__getattr__' in vars(package))")  # fmt: skip
    assert run(code, tmp_path) == "AsyncSession True True False"


def test_the_package_imported_first_stays_whole(tmp_path: Path) -> None:
    code = (
        "import sys, sqlalchemy.ext.asyncio as package, audit.sqlasync as mine\n"
        "print(mine.AsyncEngine is package.AsyncEngine, package.AsyncSession.__name__)"
    )
    assert run(code, tmp_path) == "True AsyncSession"


def test_the_installed_package_init_is_the_one_this_module_stands_in_for() -> None:
    """What ``audit.sqlasync`` does in place of the package's ``__init__`` (its names from
    ``engine`` and ``result``, greenlet's check) is what the installed ``__init__`` does; the
    rest of it imports only the session modules (the ORM). A SQLAlchemy upgrade that changes
    it fails here."""
    import ast
    import importlib.util

    from audit import sqlasync

    spec = importlib.util.find_spec("sqlalchemy.ext.asyncio")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    names: dict[str, list[str]] = {}
    others = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.setdefault(node.module or "", []).extend(a.name for a in node.names)
        else:
            others.append(ast.unparse(node))
    assert tuple(names.pop("engine")) == sqlasync.ENGINE_NAMES
    assert tuple(names.pop("result")) == sqlasync.RESULT_NAMES
    assert set(names) == {"scoping", "session"}
    assert others == ["from ...util import concurrency",
                      "concurrency._concurrency_shim._initialize()", "del concurrency"]  # fmt: skip


def test_threads_asking_at_once_each_get_the_whole_package(tmp_path: Path) -> None:
    code = (
        "import sys, threading, audit.sqlasync\n"
        "got, barrier = [], threading.Barrier(8)\n"
        "def ask():\n"
        "    barrier.wait()\n"
        "    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker\n"
        "    got.append(AsyncSession.__name__)\n"
        "threads = [threading.Thread(target=ask) for _ in range(8)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print(len(got), set(got))"
    )
    assert run(code, tmp_path) == "8 {'AsyncSession'}"


def test_a_failed_completion_fails_again_with_its_cause(tmp_path: Path) -> None:
    code = (
        "import sys, audit.sqlasync\n"
        "sys.modules['sqlalchemy.ext.asyncio.session'] = None  # the ORM's module, unloadable\n"
        "for attempt in range(2):\n"
        "    try:\n"
        "        from sqlalchemy.ext.asyncio import AsyncSession\n"
        "    except ImportError as exc:\n"
        "        print(type(exc).__name__, 'session' in str(exc))\n"
        "del sys.modules['sqlalchemy.ext.asyncio.session']\n"
        "from sqlalchemy.ext.asyncio import AsyncSession\n"
        "print(AsyncSession.__name__)"
    )
    assert run(code, tmp_path).splitlines() == ["ModuleNotFoundError True"] * 2 + ["AsyncSession"]
