"""One measured cell of the comparison: a load against one target, plus what the processes cost.

A cell is (pacing, concurrency, target): ``direct`` is the simulator itself, ``pump`` the byte
pump of ``bench.pump`` in front of it (the floor of any Python proxy), ``aiohttp`` and ``httpx``
the gateway with that upstream transport; the relaying process is the cell's "gateway". CPU
figures are the seconds each process ran inside the load's window (``procs.CpuMeter``),
divided by the chunks the client received in that window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import psutil
import uvloop

from bench.client import Api
from bench.loadgen import Context, LoadResult, LoadSpec, Meter, run_load
from bench.procs import CpuMeter, ServerProcess

Target = Literal["direct", "pump", "aiohttp", "httpx"]
TARGETS: tuple[Target, ...] = ("direct", "pump", "aiohttp", "httpx")
TRANSPORTS: tuple[Target, ...] = ("aiohttp", "httpx")
DEFAULT_TRANSPORT: Target = "aiohttp"


@dataclass(frozen=True, slots=True)
class Pacing:
    ttft_ms: float
    itl_ms: float

    @property
    def label(self) -> str:
        return f"inter-token delay {self.itl_ms:g} ms, TTFT {self.ttft_ms:g} ms"


@dataclass(frozen=True, slots=True)
class Cell:
    pacing: Pacing
    concurrency: int
    target: Target
    load: LoadResult
    cpu_s: Mapping[str, float]  # "gateway" (absent for direct), "sim", "client"
    system_s: Mapping[str, float]  # the kernel's part of cpu_s
    gateway_rss: int | None  # bytes, at the end of the cell

    def us_per_chunk(self, process: str, *, kernel_only: bool = False) -> float:
        cpu = (self.system_s if kernel_only else self.cpu_s).get(process)
        if cpu is None or not self.load.chunks:
            return float("nan")
        return cpu / self.load.chunks * 1e6


@dataclass(frozen=True, slots=True)
class LoadPlan:
    api_key: str
    duration_s: float
    warmup_s: float
    max_tokens: int = 256
    model: str = "deepseek-r1"


def run_cell(
    plan: LoadPlan,
    pacing: Pacing,
    concurrency: int,
    target: Target,
    sim: ServerProcess,
    gateway: ServerProcess | None,
) -> Cell:
    processes = {"sim": sim.process, "client": psutil.Process()}
    if gateway is not None:
        processes["gateway"] = gateway.process
    meter = CpuMeter(processes)
    url = (gateway or sim).base_url
    load = drive(plan, url, concurrency, meter)
    rss = gateway.process.memory_info().rss if gateway is not None else None
    return Cell(pacing, concurrency, target, load, meter.cpu_s, meter.system_s, rss)


def drive(
    plan: LoadPlan, url: str, concurrency: int, meter: Meter, api: Api = "chat",
    context: Context = "short",
) -> LoadResult:  # fmt: skip
    """Run one load on a fresh uvloop event loop (the client must stay lean)."""
    spec = LoadSpec(
        context=context,
        url=url,
        api_key=plan.api_key,
        model=plan.model,
        concurrency=concurrency,
        duration_s=plan.duration_s,
        max_tokens=plan.max_tokens,
        warmup_s=plan.warmup_s,
        api=api,
    )
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_load(spec, meter))
