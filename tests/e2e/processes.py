"""The gateway as a real subprocess (``python -m gateway.cli serve``), for tests about what
happens across processes: kill -9, several replicas on one database."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from gateway.settings import Settings
from tests.gateway.cli.test_main import free_port


@contextlib.asynccontextmanager
async def running_gateway(env: dict[str, str]) -> AsyncIterator[Gateway]:
    """A gateway process, started and ready; killed (SIGKILL) on exit if still alive."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--port", str(port),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    drain: asyncio.Task[None] | None = None
    try:
        while True:  # wait, with a deadline, until uvicorn reports that the app started
            line = await asyncio.wait_for(proc.stderr.readline(), timeout=30)
            assert line, "the gateway exited during start-up"
            if b"Application startup complete" in line:
                break
        drain = asyncio.create_task(_drain(proc.stderr))  # its pipe must never fill up
        yield Gateway(proc, f"http://127.0.0.1:{port}")
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if drain is not None:
            await drain


@dataclass(frozen=True)
class Gateway:
    proc: asyncio.subprocess.Process
    url: str

    async def kill_9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


def gateway_env(settings: Settings, files: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THINKGATE_")}
    env.update(
        THINKGATE_UPSTREAMS=",".join(settings.upstreams),
        THINKGATE_DATABASE_URL=settings.database_url,
        THINKGATE_KEY_CACHE_TTL_S="3600",  # authentication must not need the absent database
        **{f"THINKGATE_{name.upper()}": str(path) for name, path in files.items()},
    )
    return env
