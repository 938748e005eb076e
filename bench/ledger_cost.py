"""What recording costs inside the gateway: one gateway process per mode, same simulator, same
load, CPU of the gateway process (all threads, ``CpuMeter``) per request and per chunk.

Modes: ``none`` (the gateway given a ``DiscardSink``: no ledger; only this benchmark's own
launcher can start it so, no setting does), ``async`` and ``strict`` (``AUDIT_MODE``), in
that order, twice, so a drifting machine shows as a difference between the two rounds. Cells:
c = 4 with ``max_tokens`` 1 (the per-request cost, batches of about one record) and c = 32 with
256 tokens (streams, where the cost spreads over the chunks).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from bench.client import Api
from bench.loadgen import LoadSpec, run_load
from bench.procs import CpuMeter, ServerProcess, Workdir, create_client_key, free_port, start_sim
from bench.sections import write_section

LAUNCH = """
import sys, uvicorn
from gateway.app import create_app
from gateway.ledger.record import DiscardSink
from gateway.settings import Settings
mode, port = sys.argv[1], int(sys.argv[2])
settings = Settings(audit_mode="async" if mode == "async" else "strict")
sink = DiscardSink() if mode == "none" else None
uvicorn.run(create_app(settings, sink=sink, freeze_gc=True), host="127.0.0.1", port=port,
            loop="uvloop", http="httptools", access_log=False, log_level="warning")
"""
MODES = ("none", "async", "strict")
CELLS = ((4, 1), (32, 256))


@dataclass(frozen=True, slots=True)
class Cost:
    mode: str
    concurrency: int
    max_tokens: int
    requests: int
    us_per_request: float
    us_per_chunk: float


def start_gateway(work: Workdir, upstream: str, mode: str, launch: str = LAUNCH) -> ServerProcess:
    """A gateway process running ``launch`` (a script given ``mode`` and the port)."""
    port = free_port()
    env = {**work.env, "THINKGATE_UPSTREAMS": upstream,
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}  # fmt: skip
    argv = [sys.executable, "-c", launch, mode, str(port)]
    server = work.spawn(f"gateway-{mode}-{port}", argv, env, port, "/healthz")
    server.wait_ready()
    return server


def measure(work: Workdir, key: str, gateway: ServerProcess, cell: tuple[int, int],
            duration_s: float, *, api: Api = "chat") -> tuple[int, int, float]:  # fmt: skip
    """Requests, chunks and gateway CPU seconds of one cell, on chat completions, the
    Responses API or the Messages API (``api``)."""
    concurrency, max_tokens = cell
    spec = LoadSpec(url=gateway.base_url, api_key=key, model="deepseek-r1",
                    concurrency=concurrency, duration_s=1.0, max_tokens=max_tokens,
                    api=api)  # fmt: skip
    asyncio.run(run_load(spec))  # warm-up: connections, keys, the tenant's data key
    meter = CpuMeter({"gateway": psutil.Process(gateway.popen.pid)})
    result = asyncio.run(run_load(replace(spec, duration_s=duration_s), meter))
    if result.errors:
        raise RuntimeError(f"{result.errors} errors, first: {result.first_error}")
    return result.requests, result.chunks, meter.cpu_s["gateway"]


def run(
    work: Workdir,
    duration_s: float = 6.0,
    modes: tuple[str, ...] = MODES,
    cells: tuple[tuple[int, int], ...] = CELLS,
    rounds: int = 2,
) -> list[Cost]:
    key = create_client_key(work)
    costs = []
    with start_sim(work, 0, 0) as sim:
        for mode in modes * rounds:
            with start_gateway(work, sim.base_url, mode) as gateway:
                for cell in cells:
                    requests, chunks, cpu = measure(work, key, gateway, cell, duration_s)
                    costs.append(Cost(mode, *cell, requests, cpu / requests * 1e6,
                                      cpu / max(chunks, 1) * 1e6))  # fmt: skip
    return costs


def summary(costs: list[Cost]) -> list[str]:
    """Per cell: each mode's best round (the least disturbed by the machine) and what the
    ledger adds over ``none``."""
    lines = []
    modes = [m for m in MODES if any(c.mode == m for c in costs)]
    recorded = [m for m in modes if m != "none"]
    for concurrency, max_tokens in sorted({(c.concurrency, c.max_tokens) for c in costs}):
        cell = [c for c in costs if (c.concurrency, c.max_tokens) == (concurrency, max_tokens)]
        best = {m: min(c.us_per_request for c in cell if c.mode == m) for m in modes}
        per_chunk = {m: min(c.us_per_chunk for c in cell if c.mode == m) for m in modes}
        base, base_chunk = best["none"], per_chunk["none"]
        parts = [f"{m} {best[m]:,.0f} µs/request ({per_chunk[m]:.1f} µs/chunk)" for m in modes]
        added = [
            f"{m} +{best[m] - base:,.0f} µs/request (+{per_chunk[m] - base_chunk:.1f} µs/chunk, "
            f"{per_chunk[m] / base_chunk:.2f}×)"
            for m in recorded
        ]
        lines.append(f"gateway CPU at c = {concurrency}, max_tokens {max_tokens}: "
                     f"{'; '.join(parts)}; the ledger adds {', '.join(added)}")  # fmt: skip
    return lines


def all_rounds(label: str, costs: list[Cost]) -> str:
    """The line under a cost table that lists every round, not only each mode's best."""
    return f"All rounds ({label}, cell, µs/request, µs/chunk): " + "; ".join(
        f"{c.mode} c={c.concurrency}/{c.max_tokens} {c.us_per_request:,.0f}/{c.us_per_chunk:.2f}"
        for c in costs
    )


def cost_main(argv: list[str] | None, description: str,
              run: Callable[[Workdir, float, int], list[Cost]],
              render: Callable[[list[Cost]], str], section: str) -> int:  # fmt: skip
    """The command line of a cost benchmark: ``--duration``, ``--rounds``, ``--write`` (the
    table into ``section`` of bench/RESULTS.md)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        costs = run(Workdir(Path(tmp)), args.duration, args.rounds)
    text = render(costs)
    print(text)
    if args.write:
        write_section(Path(__file__).with_name("RESULTS.md"), section, text)
    return 0
