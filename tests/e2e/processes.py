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
    alive. ``free_port`` only finds a port free: another test's server may take it before the
    gateway binds it (uvicorn binds after "Application startup complete"), so a gateway that
    exits for want of its port is started again on another, up to ``START_ATTEMPTS`` times."""
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            # one process per replica, as a pod with one CPU runs: a SIGKILL (a replica lost)
            # must take the whole replica, which a supervisor's SIGKILL leaves its workers
            sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--workers", "1",
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stderr is not None
        said: list[bytes] = []  # its stderr, for the reason it exited
        drain: asyncio.Task[None] | None = None
        try:
            if not await _started(proc, said):
                if _port_taken(said) and attempt < START_ATTEMPTS:
                    continue
                raise AssertionError(f"the gateway exited during start-up: {_last(said)}")
            drain = asyncio.create_task(_drain(proc.stderr, said))  # the pipe must not fill
            gateway = Gateway(proc, f"http://127.0.0.1:{port}")
            try:
                await until_listening(gateway)
            except AssertionError:
                await proc.wait()
                await drain
                if _port_taken(said) and attempt < START_ATTEMPTS:
                    continue
                raise AssertionError(f"the gateway exited: {_last(said)}") from None
            yield gateway
            return
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            if drain is not None:
                await drain


START_ATTEMPTS = 3


async def _started(proc: asyncio.subprocess.Process, said: list[bytes]) -> bool:
    """Whether uvicorn reported that the app started (within 30 s) before the process ended."""
    assert proc.stderr is not None
    while line := await asyncio.wait_for(proc.stderr.readline(), timeout=30):
        said.append(line)
        if b"Application startup complete" in line:
            return True
    return False


def _port_taken(said: list[bytes]) -> bool:
    """thinkgate's own check at start ("it is already in use") or uvicorn's bind after it
    ("address already in use") found the port taken."""
    return any(b"already in use" in line.lower() for line in said)


def _last(said: list[bytes]) -> str:
    return b"".join(said[-5:]).decode(errors="replace")


@dataclass(frozen=True)
class Gateway:
    proc: asyncio.subprocess.Process
    url: str

    async def kill_9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()


async def _drain(stream: asyncio.StreamReader, said: list[bytes]) -> None:
    """Read ``stream`` to its end, keeping its last lines in ``said``."""
    while line := await stream.readline():
        said.append(line)
        del said[:-20]


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
