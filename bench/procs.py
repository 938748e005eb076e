"""The processes a comparison runs: the simulator, gateways in front of it, and their meters.

Every server is a subprocess with its working directory in a private temporary folder: the
simulator and the gateways are started through the ``thinkgate`` CLI, the way an operator
would start them (one worker, uvloop, httptools); the byte pump is ``python -m bench.pump``.
Readiness is polled over HTTP with a deadline; ``ServerProcess.stop`` sends SIGINT (uvicorn's
graceful shutdown) and kills after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

THINKGATE = str(Path(sys.executable).with_name("thinkgate"))
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0


def free_port() -> int:
    """A port the kernel just handed out (and took back): free unless someone races us."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ServerProcess:
    """A server subprocess; ``url`` is its root, ``base_url`` its OpenAI base URL."""

    name: str
    port: int
    health_path: str
    popen: subprocess.Popen[bytes]
    log: Path
    process: psutil.Process = field(init=False)

    def __post_init__(self) -> None:
        self.process = psutil.Process(self.popen.pid)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start-up; see {self.log}")
            if _answers(self.url + self.health_path):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout_s} s; see {self.log}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _answers(url: str) -> bool:
    with (
        contextlib.suppress(OSError, urllib.error.URLError),
        urllib.request.urlopen(url, timeout=1) as response,
    ):
        return bool(response.status == 200)
    return False


@dataclass(frozen=True)
class Workdir:
    """A private folder for the gateway's database, logs and profiles."""

    path: Path

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("THINKGATE_")}
        env["THINKGATE_DATABASE_URL"] = f"sqlite+aiosqlite:///{self.path / 'bench.db'}"
        return env

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str], port: int, health_path: str
    ) -> ServerProcess:
        log = self.path / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv, cwd=self.path, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        return ServerProcess(name, port, health_path, popen, log)


def start_sim(work: Workdir, ttft_ms: float, itl_ms: float) -> ServerProcess:
    port = free_port()
    argv = [THINKGATE, "sim", "--port", str(port), "--ttft-ms", str(ttft_ms)]
    argv += ["--itl-ms", str(itl_ms)]
    server = work.spawn(f"sim-{port}", argv, work.env, port, "/health")
    server.wait_ready()
    return server


def create_client_key(work: Workdir) -> str:
    """A visible-reasoning client key for tenant ``bench``; the secret is the last line. The
    ledger's key files are created alongside (the gateway refuses to start without them)."""
    subprocess.run([THINKGATE, "ledger", "init"], cwd=work.path, env=work.env, check=True,
                   capture_output=True)  # fmt: skip
    argv = [THINKGATE, "keys", "create", "--tenant", "bench", "--role", "client"]
    argv += ["--reasoning", "visible"]
    out = subprocess.run(argv, cwd=work.path, env=work.env, check=True, capture_output=True)
    return out.stdout.decode().strip().splitlines()[-1]


def gateway_argv(upstream: str, port: int) -> list[str]:
    return [THINKGATE, "serve", "--upstream", upstream, "--port", str(port), "--workers", "1"]


def gateway_env(work: Workdir, transport: str) -> dict[str, str]:
    return {**work.env, "THINKGATE_HTTP_TRANSPORT": transport}


def start_gateway(work: Workdir, upstream: str, transport: str) -> ServerProcess:
    port = free_port()
    argv = gateway_argv(upstream, port)
    server = work.spawn(
        f"gateway-{transport}", argv, gateway_env(work, transport), port, "/healthz"
    )
    server.wait_ready()
    return server


def start_pump(work: Workdir, upstream: ServerProcess) -> ServerProcess:
    """The byte pump in front of ``upstream``; ready once the upstream answers through it."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.pump", "--port", str(port)]
    argv += ["--upstream", f"127.0.0.1:{upstream.port}"]
    env = {**work.env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    server = work.spawn("pump", argv, env, port, upstream.health_path)
    server.wait_ready()
    return server


@contextlib.contextmanager
def pinned(
    client: psutil.Process, servers: list[psutil.Process]
) -> Iterator[tuple[set[int], set[int]]]:
    """``taskset`` for a run: the load generator (``client``) alone on the last CPU it may use,
    the servers and their children (a supervisor's workers) on the others; every affinity
    restored after. Yields (client CPUs, server CPUs). With one CPU nothing is pinned."""
    cpus = sorted(client.cpu_affinity() or [])
    everyone = [client, *servers, *(c for p in servers for c in p.children(recursive=True))]
    before = {p.pid: p.cpu_affinity() for p in everyone}
    if len(cpus) < 2:
        yield set(cpus), set(cpus)
        return
    mine, theirs = {cpus[-1]}, set(cpus[:-1])
    try:
        for process in everyone:
            process.cpu_affinity(sorted(mine if process is client else theirs))
        yield mine, theirs
    finally:
        for process in everyone:
            with contextlib.suppress(psutil.Error):
                process.cpu_affinity(before[process.pid])


class CpuMeter:
    """CPU seconds that each process spent inside the measured window.

    Linux's per-thread ``/proc/PID/task/TID/schedstat`` gives nanoseconds on the CPU (user +
    system); psutil's ``cpu_times`` counts clock ticks (10 ms), too coarse for a window in
    which a paced stream costs a few tens of milliseconds. psutil is the fallback elsewhere.
    A thread that ends inside the window takes its time with it (the gateway's threads live
    as long as the process). ``system_s`` is psutil's kernel time (ticks: fine over seconds
    of busy streaming, coarse for a nearly idle process).
    """

    def __init__(self, processes: dict[str, psutil.Process]) -> None:
        self._processes = processes
        self._before: dict[str, dict[int, float]] = {}
        self._system_before: dict[str, float] = {}
        self.cpu_s: dict[str, float] = {}
        self.system_s: dict[str, float] = {}

    def start(self) -> None:
        self._before = {name: _threads_cpu(p) for name, p in self._processes.items()}
        self._system_before = {n: p.cpu_times().system for n, p in self._processes.items()}

    def stop(self) -> None:
        self.cpu_s, self.system_s = {}, {}
        for name, process in self._processes.items():
            before = self._before[name]
            now = _threads_cpu(process)
            self.cpu_s[name] = sum(t - before.get(tid, 0.0) for tid, t in now.items())
            self.system_s[name] = process.cpu_times().system - self._system_before[name]


def _threads_cpu(process: psutil.Process) -> dict[int, float]:
    """CPU seconds per thread id (one pseudo-thread 0 for the whole process without /proc)."""
    try:
        threads = list(Path(f"/proc/{process.pid}/task").iterdir())
    except OSError:
        times = process.cpu_times()
        return {0: float(times.user + times.system)}
    cpu: dict[int, float] = {}
    for thread in threads:
        with contextlib.suppress(OSError, ValueError):  # the thread ended meanwhile
            cpu[int(thread.name)] = int((thread / "schedstat").read_text().split()[0]) / 1e9
    return cpu
