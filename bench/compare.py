"""``python -m bench.compare``: the gateway against the simulator it fronts, in one run.

Recipe: make a private work folder and a client key → for each pacing, start the simulator, the
byte pump and one gateway per upstream transport, then for each concurrency run the direct,
pump and gateway cells back to back → the fixed cost of a request (one-chunk requests) →
profile the default gateway with py-spy → the in-process micro-benchmarks → write
``bench/RESULTS.md``. ``--quick`` is a smoke run: short windows, few micro-benchmark calls,
and the report goes to stdout unless ``--output`` names a file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from bench.cells import TARGETS, TRANSPORTS, Cell, LoadPlan, Pacing, Target, run_cell
from bench.micro import run_micro
from bench.procs import (
    ServerProcess,
    Workdir,
    create_client_key,
    start_gateway,
    start_pump,
    start_sim,
)
from bench.profile import ProfileRun, pyspy_path, run_profile
from bench.results import Run, render
from bench.sections import carry_sections, cpu_model, revision

PACINGS = (Pacing(ttft_ms=0, itl_ms=0), Pacing(ttft_ms=50, itl_ms=10))
CONCURRENCIES = (1, 32, 128)
# The profile (c = 32, 0 ms), and a paced one at c = 128: paced, the gateway idles
# most of the time, and c = 128 gives the sampler enough busy samples.
PROFILES = ((PACINGS[0], 32), (PACINGS[1], 128))
REQUEST_COST_CONCURRENCY = 4
RESULTS = Path(__file__).with_name("RESULTS.md")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    duration = args.duration if args.duration is not None else 2.0 if args.quick else 9.0
    warmup = 0.5 if args.quick else 1.0
    output: Path | None = args.output or (None if args.quick else RESULTS)
    start_rss: dict[str, int] = {}
    measured = revision(("gateway",))
    with tempfile.TemporaryDirectory(prefix="thinkgate-bench-") as tmp:
        work = Workdir(Path(tmp))
        plan = LoadPlan(create_client_key(work), duration, warmup)
        cells = [c for pacing in PACINGS for c in run_pacing(work, plan, pacing, start_rss)]
        request_cells = run_request_cost(work, replace(plan, max_tokens=1))
        profiles = () if args.no_profile else run_profiles(work, plan)
        if args.keep is not None:
            shutil.copytree(work.path, args.keep, dirs_exist_ok=True)
    _progress("micro-benchmarks")
    micro = run_micro(calls=20_000 if args.quick else 200_000)
    if (now := revision(("gateway",))) != measured:
        measured += f", then {now}: the code changed during the run"
    run = Run(
        date=time.strftime("%Y-%m-%d %H:%M %Z"),
        revision=measured,
        nproc=os.cpu_count() or 1,
        cpu_model=cpu_model(),
        duration_s=duration,
        warmup_s=warmup,
        max_tokens=plan.max_tokens,
        cells=tuple(cells),
        request_cells=tuple(request_cells),
        start_rss=start_rss,
        micro=tuple(micro),
        profiles=profiles,
    )
    text = render(run)
    if output is None:
        print(text)
    else:
        old = output.read_text() if output.exists() else ""
        output.write_text(carry_sections(old, text))  # other benchmarks' sections stay
        _progress(f"wrote {output}")
    return 0


def run_pacing(
    work: Workdir, plan: LoadPlan, pacing: Pacing, start_rss: dict[str, int]
) -> list[Cell]:
    """Every (concurrency, target) cell of one pacing, against one simulator process."""
    with ExitStack() as stack:
        sim = stack.enter_context(start_sim(work, pacing.ttft_ms, pacing.itl_ms))
        relays = _start_relays(stack, work, sim)
        for name, relay in relays.items():
            start_rss.setdefault(name, relay.process.memory_info().rss)
        return _run_cells(plan, pacing, CONCURRENCIES, sim, relays)


def run_request_cost(work: Workdir, plan: LoadPlan) -> list[Cell]:
    """Requests of one chunk at c = 4: what a request costs besides its chunks."""
    with ExitStack() as stack:
        sim = stack.enter_context(start_sim(work, 0, 0))
        relays = _start_relays(stack, work, sim)
        return _run_cells(plan, PACINGS[0], (REQUEST_COST_CONCURRENCY,), sim, relays)


def run_profiles(work: Workdir, plan: LoadPlan) -> tuple[ProfileRun, ...]:
    """The default gateway under py-spy, for each of ``PROFILES``."""
    pyspy = pyspy_path()
    if pyspy is None:
        _progress("py-spy not found (pip install py-spy): no profile")
        return ()
    runs = []
    for pacing, concurrency in PROFILES:
        _progress(f"profile: py-spy, c = {concurrency}, {pacing.label}")
        profile = run_profile(work, plan, pyspy, pacing, concurrency)
        if isinstance(profile, str):
            _progress(f"  py-spy failed: {profile}")
        else:
            runs.append(profile)
    return tuple(runs)


def _start_relays(stack: ExitStack, work: Workdir, sim: ServerProcess) -> dict[str, ServerProcess]:
    relays = {"pump": stack.enter_context(start_pump(work, sim))}
    for transport in TRANSPORTS:
        relays[transport] = stack.enter_context(start_gateway(work, sim.base_url, transport))
    return relays


def _run_cells(
    plan: LoadPlan,
    pacing: Pacing,
    concurrencies: Sequence[int],
    sim: ServerProcess,
    relays: dict[str, ServerProcess],
) -> list[Cell]:
    cells: list[Cell] = []
    for concurrency in concurrencies:
        for target in TARGETS:
            cells.append(_run_one(plan, pacing, concurrency, target, sim, relays.get(target)))
    return cells


def _run_one(
    plan: LoadPlan,
    pacing: Pacing,
    concurrency: int,
    target: Target,
    sim: ServerProcess,
    relay: ServerProcess | None,
) -> Cell:
    _progress(f"{pacing.label}, max_tokens {plan.max_tokens}: c = {concurrency}, {target}")
    cell = run_cell(plan, pacing, concurrency, target, sim, relay)
    _progress("  " + _summary(cell))
    if cell.load.errors:
        _progress(_log_tail(relay))
    return cell


def _summary(cell: Cell) -> str:
    load = cell.load
    gateway = f", gateway {cell.us_per_chunk('gateway'):.1f} µs/chunk" if cell.gateway_rss else ""
    return (
        f"{load.chunks_per_s:,.0f} chunks/s, TTFT p50 {load.ttft.p50 * 1000:.2f} ms, "
        f"errors {load.errors}{gateway}"
        + (f" (first: {load.first_error})" if load.first_error else "")
    )


def _log_tail(server: ServerProcess | None, lines: int = 20) -> str:
    if server is None:
        return ""
    text = server.log.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(f"  | {line}" for line in text)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--duration", type=float, default=None, help="window per cell, s")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--output", type=Path, default=None, help="default bench/RESULTS.md")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    parser.add_argument(
        "--keep", type=Path, default=None, help="copy logs and raw py-spy stacks to this folder"
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
