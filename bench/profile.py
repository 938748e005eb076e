"""Where the gateway's CPU goes: a sampling profile of a running gateway, summarised.

``py-spy record --native`` attaches to the gateway's process for the measured window and writes
collapsed stacks (``frame;frame;... count``). Only the event-loop thread's busy samples are kept:
aiosqlite's worker thread sleeps on a queue and the loop sleeps in ``epoll_wait``, and with
``--native`` py-spy cannot tell either from work. py-spy pauses the
process at each sample, which slows it down but does not bias *where* it is found, so the
summary is a share of the samples; ``compare`` turns shares into µs per chunk with the CPU time
psutil measured over the same window.

Each sample is charged to one *component*: the innermost frame that matches a rule in
``_COMPONENTS`` (native frames first: the kernel's ``write``/``read`` through uvloop, the
garbage collector, the ``getpid`` that CPython 3.11's ``get_running_loop`` makes on every call),
else the package of the innermost Python frame. The innermost Python function of each sample
is its *hot* function; a few ``KEY_FUNCTIONS`` of the chunk path are also counted *inclusively*
(a sample counts for every one of them on its stack).

Without py-spy, ``cprofile_argv`` runs the gateway under ``cProfile`` instead; its figures
include start-up and the profiler's own overhead, so they only rank functions.
"""

from __future__ import annotations

import pstats
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.cells import DEFAULT_TRANSPORT, LoadPlan, Pacing, drive
from bench.procs import CpuMeter, ServerProcess, Workdir, start_gateway, start_sim

_PY_FRAME = re.compile(r"^(?P<func>.+) \((?P<file>[^():]+\.py):\d+\)$")

# (component, pattern in a frame): the innermost frame matching any pattern names the component.
_NATIVE: tuple[tuple[str, str], ...] = (
    ("kernel: socket write", "UVStream__try_write"),
    ("kernel: socket write", "uv__write"),
    ("kernel: socket read", "uv__read (stream.c"),
    ("garbage collector", "gc_collect_main"),
    ("getpid() in asyncio.get_running_loop", "getpid (libc"),
)

_PACKAGES: tuple[tuple[str, str], ...] = (
    ("gateway/relay/rewrite.py", "gateway: StreamRelay (relay.py)"),
    ("gateway/relay/sse.py", "gateway: SSEParser (sse.py)"),
    ("gateway/relay/thinksplit.py", "gateway: ThinkSplitter (thinksplit.py)"),
    ("gateway/routes/chat.py", "gateway: chat.py (route, relay loop)"),
    ("gateway/edge/streaming.py", "gateway: RelayResponse (streaming.py)"),
    ("gateway/upstream/pool.py", "gateway: upstream.py"),
    ("gateway/", "gateway: other modules"),
    ("httpx_aiohttp/", "httpx-aiohttp transport"),
    ("aiohttp/", "aiohttp (upstream client)"),
    ("httpcore/", "httpcore (httpx transport)"),
    ("httpx/", "httpx"),
    ("uvicorn/", "uvicorn (server protocol)"),
    ("fastapi/", "FastAPI (routing, middleware)"),
    ("starlette/", "Starlette (routing, middleware)"),
    ("opentelemetry/", "opentelemetry (via FastAPI telemetry)"),
    ("trace/__init__.py", "opentelemetry (via FastAPI telemetry)"),
    ("anyio/", "anyio"),
    ("sniffio/", "anyio"),
    ("pydantic", "pydantic"),
    ("sqlalchemy/", "SQLAlchemy / aiosqlite"),
    ("aiosqlite/", "SQLAlchemy / aiosqlite"),
    ("asyncio/", "asyncio (Python part)"),
    ("urllib/", "urllib (URL parsing)"),
)


@dataclass(frozen=True, slots=True)
class Share:
    name: str
    samples: int
    fraction: float


# Functions worth a line of their own, charged inclusively (everything under them).
KEY_FUNCTIONS = (
    "chat_completions",
    "RelayResponse._stream",
    "relay_stream",
    "_relay_read",
    "SSEParser.feed",
    "StreamRelay.feed",
    "ThinkSplitter.feed",
    "UpstreamStream._chunks",
    "RequestResponseCycle.send",
    "ResponseHandler.data_received",
    "authenticate",
    "parse_chat_request",
)


@dataclass(frozen=True, slots=True)
class ProfileSummary:
    tool: str
    samples: int
    components: tuple[Share, ...]  # self time, each sample charged once
    hot: tuple[Share, ...]  # self time of the innermost Python function
    key: tuple[Share, ...]  # inclusive time of KEY_FUNCTIONS found on the stacks


@dataclass(frozen=True, slots=True)
class ProfileRun:
    summary: ProfileSummary
    pacing: Pacing
    concurrency: int
    chunks: int
    gateway_us_per_chunk: float  # measured over the profiled window


class _ProfilingMeter(CpuMeter):
    """Starts py-spy on the gateway when the load's window opens."""

    def __init__(
        self, gateway: ServerProcess, pyspy: str, out: Path, duration_s: float, rate: int
    ) -> None:
        super().__init__({"gateway": gateway.process})
        self._args = (pyspy, gateway.process.pid, duration_s, out, rate)
        self.spy: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.spy = start_pyspy(*self._args)
        super().start()


def run_profile(
    work: Workdir, plan: LoadPlan, pyspy: str, pacing: Pacing, concurrency: int
) -> ProfileRun | str:
    """Profile a fresh default gateway under load; the error text if py-spy failed.

    100 Hz: each sample pauses the process for about a millisecond, and a paused gateway
    finds several upstream chunks per read when it resumes, which flatters per-read costs.
    """
    out = work.path / f"profile-{pacing.itl_ms:g}ms.txt"
    rate = 100
    with (
        start_sim(work, pacing.ttft_ms, pacing.itl_ms) as sim,
        start_gateway(work, sim.base_url, DEFAULT_TRANSPORT) as gateway,
    ):
        meter = _ProfilingMeter(gateway, pyspy, out, plan.duration_s, rate)
        load = drive(plan, gateway.base_url, concurrency, meter)
        spy = meter.spy
        assert spy is not None and spy.stderr is not None
        if spy.wait() != 0 or not out.exists():
            return spy.stderr.read().decode(errors="replace")[-500:]
    per_chunk = meter.cpu_s["gateway"] / load.chunks * 1e6 if load.chunks else float("nan")
    return ProfileRun(summarise_pyspy(out), pacing, concurrency, load.chunks, per_chunk)


def pyspy_path() -> str | None:
    return shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")


def start_pyspy(
    pyspy: str, pid: int, duration_s: float, out: Path, rate: int = 100
) -> subprocess.Popen[bytes]:
    argv = [pyspy, "record", "--pid", str(pid), "--duration", str(max(1, round(duration_s)))]
    argv += ["--rate", str(rate), "--native", "--format", "raw", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def cprofile_argv(argv: Sequence[str], out: Path) -> list[str]:
    """``thinkgate serve ...`` as ``python -m cProfile -o OUT -m gateway.cli serve ...``."""
    return [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "gateway.cli", *argv[1:]]


def summarise_pyspy(raw: Path, top: int = 15) -> ProfileSummary:
    components: Counter[str] = Counter()
    hot: Counter[str] = Counter()
    key: Counter[str] = Counter()
    total = 0
    for frames, count in _stacks(raw.read_text().splitlines()):
        if any("Thread._bootstrap" in f for f in frames):
            continue  # not the event-loop thread
        if any("epoll_wait" in f or "epoll_pwait" in f for f in frames[-3:]):
            continue  # the loop waiting for I/O: idle (py-spy's --native keeps such samples)
        total += count
        components[_component(frames)] += count
        python = [m for f in frames if (m := _PY_FRAME.match(f))]
        if python:
            hot[f"{python[-1].group('func')} ({python[-1].group('file')})"] += count
        for func in {m.group("func") for m in python} & set(KEY_FUNCTIONS):
            key[func] += count
    ordered_key = Counter({f: key[f] for f in KEY_FUNCTIONS if f in key})
    return ProfileSummary(
        "py-spy",
        total,
        _shares(components, total, top),
        _shares(hot, total, top),
        _shares(ordered_key, total, len(KEY_FUNCTIONS), ordered=True),
    )


def summarise_cprofile(stats_file: Path, top: int = 15) -> ProfileSummary:
    stats = pstats.Stats(str(stats_file))
    table = stats.stats  # type: ignore[attr-defined]
    total_s = sum(row[2] for row in table.values()) or 1.0
    ranked = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    shares = tuple(
        Share(f"{Path(f).name}:{line} {func}", int(row[1]), row[2] / total_s)
        for (f, line, func), row in ranked
    )
    return ProfileSummary("cProfile (tottime; ranks only)", int(total_s * 1e6), (), shares, ())


def _stacks(lines: Iterable[str]) -> Iterable[tuple[list[str], int]]:
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def _component(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in _NATIVE:
            if pattern in frame:
                return name
        match = _PY_FRAME.match(frame)
        if match is not None:
            return _package(match.group("file"))
    return "native: uvloop / interpreter"


def _package(file: str) -> str:
    for prefix, name in _PACKAGES:
        if prefix in file:
            return name
    return f"other Python ({file.split('/')[0]})"


def _shares(
    counter: Counter[str], total: int, top: int, *, ordered: bool = False
) -> tuple[Share, ...]:
    items = list(counter.items())[:top] if ordered else counter.most_common(top)
    return tuple(Share(n, c, c / total if total else 0.0) for n, c in items)
