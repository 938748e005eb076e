"""Shared fixtures: real PostgreSQL databases per test, SQLite files, service reachability.

Tests that need PostgreSQL or Redis skip with a clear reason when the service is unreachable,
except when ``CI`` is set: then they fail (DESIGN §4).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.engine import make_url

from gateway.settings import Settings


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup``: a test marked ``xdist_group(name)`` gets ``@name`` at the end of
    its node id, which is how xdist's scheduler keeps a group on one worker. pytest-xdist 3.8
    writes the suffix to ``item._nodeid``, which pytest 9.2 no longer reads (the id lives in
    ``item._id``), so the groups were silently ignored: both workers started their own three
    vLLM servers and their own PostgreSQL. This puts the suffix where pytest reads it."""
    if not config.getoption("loadgroup", default=False):  # xdist's workers, --dist loadgroup
        return
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})  # fmt: skip
        if names and "@" not in item.nodeid:
            _set_nodeid(item, f"{item.nodeid}@{'_'.join(names)}")


def _set_nodeid(item: pytest.Item, nodeid: str) -> None:
    try:
        from _pytest.nodeid import coerce_node_id  # pytest >= 9.2
    except ImportError:  # older pytest reads _nodeid, where xdist already wrote it
        item._nodeid = nodeid
        return
    item._id = coerce_node_id(nodeid)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-vllm",
        action="store_true",
        help="skip the real-vLLM suite (tests/integration_vllm), e.g. for a quick local run",
    )


def _unavailable(service: str, exc: BaseException) -> None:
    message = f"{service} is not reachable ({type(exc).__name__}); start it or see .ci/run"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    import asyncpg

    base = make_url(Settings().test_database_url)
    user, port = base.username or "postgres", base.port or 5432
    dsn = f"postgresql://{user}@{base.host}:{port}/{base.database}"
    name = f"tg_test_{secrets.token_hex(6)}"
    try:
        admin = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        _unavailable("PostgreSQL", exc)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'thinkgate.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each database test runs against both backends."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'thinkgate.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


# --- Redis: each test gets its own key prefix and deletes only the keys under it, so nothing
# global (no FLUSHDB) touches other tests' data. A gateway under test uses its own key names
# (per key id, per engine URL), which no other test shares either.


@pytest.fixture
def key_prefix() -> str:
    return f"test:{secrets.token_hex(6)}:"


@pytest.fixture(scope="session")
def private_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis server of this test worker's own, for tests that do what touches the whole
    server (``SCRIPT FLUSH``, as a restart would): on the shared one it would pull the scripts
    from under every other worker's tests. Tests ask for it with ``@pytest.mark.private_redis``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = tmp_path_factory.mktemp("redis")
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
            time.sleep(0.02)  # polling a starting process: nothing to wait on but its port
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
async def redis_url(key_prefix: str, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """``TEST_REDIS_URL`` once Redis answers (this worker's own server for tests marked
    ``private_redis``); at teardown, the keys under ``key_prefix`` go."""
    url = Settings().test_redis_url
    if request.node.get_closest_marker("private_redis") is not None:
        url = request.getfixturevalue("private_redis_url")
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        await client.ping()
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        await client.aclose()
        _unavailable("Redis", exc)
    try:
        yield url
    finally:
        keys = [key async for key in client.scan_iter(match=f"{key_prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()
