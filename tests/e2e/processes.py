"""The gateway as a real subprocess (``python -m gateway.cli serve``), for tests about what
happens across processes: kill -9, several replicas on one database."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.settings import Settings
from tests.gateway.cli.test_main import free_port
from tests.waiting import eventually


@contextlib.asynccontextmanager
async def running_gateway(env: dict[str, str]) -> AsyncIterator[Gateway]:
    """A gateway process, started and accepting connections; killed (SIGKILL) on exit if still
    alive."""
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
        gateway = Gateway(proc, f"http://127.0.0.1:{port}")
        await until_listening(gateway)
        yield gateway
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


async def until_listening(gateway: Gateway, within_s: float = 10.0) -> None:
    """Until ``gateway`` answers ``/healthz``: uvicorn logs "Application startup complete"
    *before* it binds its socket, so a client that connected at once could be refused."""
    async with httpx.AsyncClient(timeout=2) as client:

        async def answers() -> bool:
            try:
                return (await client.get(f"{gateway.url}/healthz")).status_code == 200
            except httpx.TransportError:
                assert gateway.proc.returncode is None, "the gateway exited"
                return False

        await eventually(answers, within_s=within_s)


@contextlib.asynccontextmanager
async def running_gateways(envs: Sequence[dict[str, str]]) -> AsyncIterator[list[Gateway]]:
    """One gateway per env, started at once (start-up is mostly imports: on several cores
    they overlap), each accepting connections; all killed on exit. A start that fails kills
    the others first."""
    async with contextlib.AsyncExitStack() as stack:
        starts = [stack.enter_async_context(running_gateway(env)) for env in envs]
        started = await asyncio.gather(*starts, return_exceptions=True)
        for outcome in started:  # every start has ended: the stack owns what did start
            if isinstance(outcome, BaseException):
                raise outcome
        yield [g for g in started if isinstance(g, Gateway)]


async def run_cli(env: dict[str, str], *args: str, cwd: str | None = None) -> tuple[int, str]:
    """``python -m gateway.cli ARGS`` in a subprocess, without blocking the event loop (the
    gateways under test keep being served meanwhile): its exit code and its output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, env=env, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    finally:
        if proc.returncode is None:  # timed out or cancelled: not left running
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, output.decode(errors="replace")
