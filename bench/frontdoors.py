"""``python -m bench.frontdoors``: one relay behind three front doors, to choose the gateway's.

Issue 44 asks whether the hot endpoints should leave ASGI's layers, and for which server. The
relay of ``bench.relay`` (check the key, forward the body with aiohttp, write every upstream
read to the client) is served three ways, everything else equal:

- ``uvicorn``: ASGI on uvicorn with uvloop and httptools, as thinkgate runs today;
- ``granian``: Granian's RSGI interface (a Rust HTTP server calling a Python coroutine per
  request), from the benchmark environment (``.venv-bench``; skipped when absent);
- ``protocol``: an ``asyncio.Protocol`` on uvloop with httptools' parser, written here: one
  task per request, the response written to the transport directly (chunked), keep-alive.

Each serves ``bench.paced`` at c = 32, paced (10 ms a token) and 3-chunk answers; CPU per
chunk and per request as ``bench.realistic`` measures it, rounds alternated. The protocol
server here is the floor of what a front door of our own could reach, not one: it has no
limits, no pipelining, no ``Expect: 100-continue``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psutil
import uvloop

from bench.cells import LoadPlan, drive
from bench.procs import CpuMeter, ServerProcess, Workdir, free_port
from bench.relay_doors import KEY, serve_protocol

ROOT = Path(__file__).resolve().parent.parent
DOORS = ("uvicorn", "granian", "protocol")
CELLS = (("c=32, 10 ms", "bench-paced", False), ("c=32, 3-chunk answers", "bench-short", True))


def start_door(work: Workdir, door: str, upstream: ServerProcess, venv: Path) -> ServerProcess:
    port = free_port()
    env = {**work.env, "PYTHONPATH": str(ROOT), "FRONTDOOR_UPSTREAM": upstream.base_url}
    if door == "uvicorn":
        argv = [sys.executable, "-m", "bench.relay", "--port", str(port), "--upstream",
                upstream.base_url, "--key", KEY]  # fmt: skip
    elif door == "granian":
        argv = [str(venv / "bin" / "granian"), "--interface", "rsgi", "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1", "--loop", "uvloop", "--no-ws",
                "--log-level", "warning", "--factory", "bench.relay_doors:rsgi_app"]  # fmt: skip
    else:
        argv = [sys.executable, "-m", "bench.frontdoors", "--serve", str(port), "--upstream",
                upstream.base_url]  # fmt: skip
    server = work.spawn(door, argv, env, port, "/health")
    server.wait_ready()
    return server


def measure(server: ServerProcess, model: str, per_request: bool, seconds: float) -> float:
    processes = {"client": psutil.Process(), "door": server.process}
    processes.update({f"door{i}": p for i, p in enumerate(server.process.children())})
    meter = CpuMeter(processes)
    plan = LoadPlan(KEY, seconds, 2.0, max_tokens=512, model=model)
    load = drive(plan, server.base_url, 32, meter)
    cpu = sum(s for name, s in meter.cpu_s.items() if name.startswith("door"))
    count = load.requests if per_request else load.chunks
    return cpu / count * 1e6 if count and not load.errors else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.serve:
        uvloop.run(serve_protocol(args.serve, args.upstream))
        return 0
    from bench.realistic import start_upstream

    venv = args.bench_venv
    doors = [d for d in DOORS if d != "granian" or (venv / "bin" / "granian").exists()]
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="thinkgate-doors-") as tmp:
        work = Workdir(Path(tmp))
        started = [start_upstream(work)]
        try:
            servers = {d: start_door(work, d, started[0], venv) for d in doors}
            started += servers.values()
            for round_ in range(args.rounds):
                for cell, model, per_request in CELLS:
                    shift = round_ % len(doors)
                    for door in doors[shift:] + doors[:shift]:
                        cost = measure(servers[door], model, per_request, args.duration)
                        results.setdefault((cell, door), []).append(cost)
                        print(f"round {round_} {cell:24} {door:9} {cost:8.1f} µs",
                              file=sys.stderr, flush=True)  # fmt: skip
        finally:
            for server in reversed(started):
                server.stop()
    print("| cell | front door | CPU µs per chunk (per request) | × uvicorn |")
    print("|---|---|---|---|")
    for cell, _, per_request in CELLS:
        base = statistics.median(results[(cell, "uvicorn")])
        for door in doors:
            got = results[(cell, door)]
            unit = " /req" if per_request else ""
            print(f"| {cell} | {door} | {statistics.median(got):,.1f} ({min(got):,.1f}–"
                  f"{max(got):,.1f}){unit} | {statistics.median(got) / base:.2f} |")  # fmt: skip
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.frontdoors",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0, help="window per run, s")
    parser.add_argument("--bench-venv", type=Path, default=ROOT / ".venv-bench")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the protocol door
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
