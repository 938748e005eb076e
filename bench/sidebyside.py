"""``python -m bench.sidebyside --before DIR``: this tree's thinkgate and another's, driven at
the same time, so the machine's drift falls on both alike.

Why: ``bench.realistic`` measures its systems one after another, and on a shared machine the
same code moves ±10 % from one window to the next (``bench/RESULTS.md``); a change worth 2–5 %
disappears in it. Here both gateways run in the production configuration (as
``bench.realistic.start_thinkgate`` starts them) behind one paced upstream, and for every round
two load processes drive them at once, one each, with the same cell; each gateway's CPU is read
over the same window. The figure is the ratio of the two costs per round (this tree's over
``--before``'s), its median and range: both saw the same neighbours, the same frequency, the
same upstream. Beside it, the difference of their TTFT p50s and p99s in the same window (the
``c=1`` cell: the added TTFT of a request's own work, change against change). ``--pg``: both on
PostgreSQL and Redis, with rate limits (``bench.realistic``'s ``thinkgate_pg``), where
admission is a Redis round trip.

The two gateways share the machine's CPUs, so each is slower than it would be alone; at the
cells' loads (c = 32 paced is about a tenth of a CPU each) that changes little, and it changes
it for both. A round with a failed request on either side is reported and left out.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.cells import LoadPlan, drive
from bench.procs import CpuMeter, Workdir
from bench.realistic import (
    CELLS,
    ROOT,
    CellSpec,
    System,
    drop_databases,
    start_thinkgate,
    start_upstream,
)

MARGIN_S = 0.3  # the CPU window starts this long after the loads and ends as long before them


@dataclass(frozen=True, slots=True)
class Round:
    after: float  # CPU µs per chunk (or per request) of this tree's gateway
    before: float  # the same of --before's
    ttft_ms: float = 0.0  # this tree's TTFT p50 less --before's, in the same window
    ttft_p99_ms: float = 0.0  # the same of the TTFT p99s

    @property
    def ratio(self) -> float:
        return self.after / self.before


class _NoMeter:
    def start(self) -> None: ...

    def stop(self) -> None: ...


def _load(system: System, cell: CellSpec, seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    plan = LoadPlan(system.key, seconds, 0, max_tokens=512, model=cell.model)
    result = drive(plan, system.base_url, cell.concurrency, _NoMeter(), api=cell.api,
                   context=cell.context)  # fmt: skip
    out.put((system.name, result.requests, result.chunks, result.errors,
             (result.ttft.p50, result.ttft.p99)))  # fmt: skip


def one_round(
    cell: CellSpec, systems: Sequence[System], seconds: float
) -> dict[str, tuple[float, tuple[float, float]]] | None:
    """Drive every system at once for ``seconds``; each one's CPU µs per unit of the cell over
    the middle of the window and its TTFT p50 and p99 (s); ``None`` when a request failed on
    either side."""
    servers = {s.name: s.server.process for s in systems if s.server is not None}
    meter = CpuMeter(servers)
    done: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    loads = [multiprocessing.Process(target=_load, args=(s, cell, seconds, done)) for s in systems]
    for load in loads:
        load.start()
    time.sleep(MARGIN_S)
    meter.start()
    time.sleep(seconds - 2 * MARGIN_S)
    meter.stop()
    counts = {}
    for _ in loads:
        name, requests, chunks, errors, ttft = done.get()
        counts[name] = (requests, chunks, errors, ttft)
    for load in loads:
        load.join()
    if any(errors for _, _, errors, _ in counts.values()):
        print(f"a round with failed requests, left out: {counts}", file=sys.stderr)
        return None
    costs = {}
    for name, (requests, chunks, _, ttft) in counts.items():
        units = (requests if cell.per_request else chunks) * (seconds - 2 * MARGIN_S) / seconds
        costs[name] = (meter.cpu_s[name] / units * 1e6, ttft)
    return costs


def measured(cell: CellSpec, systems: Sequence[System], args: argparse.Namespace) -> Round | None:
    """One round of ``cell`` on both gateways, printed as it ends; ``None`` if it failed."""
    costs = one_round(cell, systems, args.duration)
    if costs is None:
        return None
    this, other = (s.name for s in systems)
    (after, ttft), (before, then) = costs[this], costs[other]
    done = Round(after, before, (ttft[0] - then[0]) * 1000, (ttft[1] - then[1]) * 1000)
    print(f"  {cell.name}: {done.after:.1f} against {done.before:.1f} ({done.ratio:.3f}), "
          f"TTFT p50 {done.ttft_ms:+.2f} ms, p99 {done.ttft_p99_ms:+.2f} ms",
          flush=True)  # fmt: skip
    return done


def summary(cell: CellSpec, rounds: Sequence[Round]) -> str:
    """One line: the medians, the ratio's median and range over the rounds, and the median
    difference of the TTFT p50s."""
    unit = "request" if cell.per_request else "chunk"
    ratios = [r.ratio for r in rounds]
    after, before = (statistics.median(r.after for r in rounds),
                     statistics.median(r.before for r in rounds))  # fmt: skip
    ttft = statistics.median(r.ttft_ms for r in rounds)
    p99 = statistics.median(r.ttft_p99_ms for r in rounds)
    return (f"{cell.name}: CPU µs per {unit}, this tree {after:.1f}, before {before:.1f}; ratio "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}); TTFT p50 "
            f"{ttft:+.2f} ms, p99 {p99:+.2f} ms; {len(rounds)} rounds")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cells = [c for c in CELLS if c.name in args.cells]
    if len(cells) != len(args.cells):
        known = ", ".join(repr(c.name) for c in CELLS)
        raise SystemExit(f"unknown cell among {args.cells}; known: {known}")
    with tempfile.TemporaryDirectory(prefix="thinkgate-sidebyside-") as folder:
        work = Workdir(Path(folder))
        upstream = start_upstream(work)
        started = [upstream]
        try:
            systems = []
            this = "thinkgate_pg" if args.pg else "thinkgate"
            for name, tree in ((this, ROOT), (f"{this}@before", args.before.resolve())):
                systems.append(start_thinkgate(work, upstream, name, tree))
                started.append(systems[-1].server)  # type: ignore[arg-type]
            for cell in cells:
                one_round(cell, systems, min(3.0, args.duration))  # warm-up
                rounds = [r for _ in range(args.rounds) if (r := measured(cell, systems, args))]
                if rounds:
                    print(summary(cell, rounds), flush=True)
        finally:
            for server in started:
                server.stop()
            drop_databases()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.sidebyside", description=__doc__)
    parser.add_argument("--before", type=Path, required=True,
                        help="a source tree (a git worktree) of the code before")  # fmt: skip
    parser.add_argument("--cells", nargs="+", default=["c=32, 10 ms", "c=32, 3-chunk answers"],
                        help="cells of bench.realistic, by name")  # fmt: skip
    parser.add_argument("--pg", action="store_true", help="both on PostgreSQL and Redis, with "
                        "rate limits (bench.realistic's thinkgate_pg)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=12.0, help="window per round, s")
    return parser


if __name__ == "__main__":
    sys.exit(main())
