"""Admission and settlement: what the rate limits and the KV budget cost per request, in one
process and through the gateway, with Redis and without.

``python -m bench.admission [--duration S] [--quick] [--parts ...] [--redis-url URL] [--write]``

- **micro**: one process on uvloop, the gateway's own objects built as its lifespan builds them:
  ``open_redis`` (the process's one client, auto-pipelined), ``open_limiter`` and
  ``open_admission`` on it, with ``KV_CAPACITY_TOKENS`` 10⁹ (capacity known, never full), one key
  whose rpm / tpm (10⁷ / 2³¹ − 1) are evaluated but never refuse, one upstream, no scraping. An
  *admission* is ``gateway.admission.gate.Gate.admit`` itself (``limiter.admit`` and ``kv.admit``
  at once), a *settlement* ``limiter.settle`` and ``kv.release`` at once, as ``Exchange.finish``
  does them; 1,024 tokens reserved, 600 used, so the refund has something to give back. C workers
  (C = 1, 64) share the key and loop admission then settlement for the cell's duration (after a
  0.5 s warm-up); a third shape gives 64 workers 64 keys, each its own tenant (the KV budget
  queues admissions per tenant: this separates that queue from Redis itself). Latency is
  ``perf_counter_ns`` around the admission, settlement timed apart. Baseline: the same objects
  with ``REDIS_URL`` unset (the in-process backends). Per shape the cells alternate in-process,
  Redis, in-process, Redis, so a drifting machine shows between rounds. CPU per admission +
  settlement: this process (``time.process_time``) and the Redis server (``INFO cpu``; other
  clients of that Redis add to it); round trips: the client's ``AutoPipeline.round_trips``.
- **commands**: the same objects against Redis after a warm-up (scripts loaded, a connection
  open), one call at a time, each of the four calls alone and then the admission and the
  settlement as the app makes them. Round trips: ``AutoPipeline.round_trips``; commands: every
  one a ``redis.asyncio`` client of this process sends, alone or queued in a pipeline (both
  ``execute_command``s wrapped). Inside Redis: ``INFO commandstats`` deltas around batches of
  20 calls per step, the least disturbed of 5 windows, a window counting only if its EVALSHA
  count is exactly ours (the server is shared), with the server's µs of script per call.
- **gateway**: one simulator, gateway processes started in turn against it, off, on, off, on
  (a fresh process each): ``off`` without ``REDIS_URL``, a key without limits and no
  ``KV_CAPACITY_TOKENS`` (the scraper still learns the simulator's capacity, so KV admission
  runs, in process); ``on`` with ``REDIS_URL``, a key with rpm / tpm 10⁷ / 2³¹ − 1 and
  ``KV_CAPACITY_TOKENS`` 10⁹. Both record into a ``DiscardSink`` (the ledger has its own
  benchmark; here it would only add noise). Load: 64 workers streaming ``max_tokens`` 8 back
  to back through ``bench.loadgen``, which also times each whole request (written → response
  ended); 1 s warm-up. The simulator is paced (by default TTFT 200 ms, 20 ms between
  tokens) so that the ``off`` gateway stays below saturation on 2 shared cores; flat out, the
  difference would be queueing for the CPU. Added latency = on − off within a round; gateway
  CPU per request from ``procs.CpuMeter``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Literal

import psutil
import uvloop
from redis.asyncio import Redis

from audit.record import Usage
from bench.loadgen import LoadSpec, Percentiles, run_load
from bench.procs import THINKGATE, CpuMeter, ServerProcess, Workdir, free_port, start_sim
from bench.sections import cpu_model, revision, write_section
from gateway.admission.budget import Grant, KVAdmission, open_admission
from gateway.admission.gate import Gate, Ticket
from gateway.admission.limiter import Admission
from gateway.admission.ratelimits import KeyLimiter, open_limiter
from gateway.admission.redisconn import open_redis
from gateway.admission.spending import SpendAsk
from gateway.auth.keys import KeyInfo
from gateway.settings import Settings
from gateway.upstream.engine import Upstream
from ratelimit.autopipe import AutoPipeline

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"
TOKENS = 1024  # reserved per admission: prompt estimate + max_tokens
USED = 600  # used: the settlement refunds the rest
KV_CAPACITY = 10**9
# tpm: the CLI's largest (a 32-bit column), still never reached in a cell
RPM, TPM = 10**7, 2**31 - 1
ADMISSIONS_TARGET = 5_000.0  # admissions/s at C = 64 against Redis
ADDED_P99_TARGET_MS = 1.0  # through the gateway at c = 64
GATEWAY_CONCURRENCY = 64
GATEWAY_MAX_TOKENS = 8
PARTS = ("micro", "commands", "gateway")
SHAPES = ((1, 1), (64, 1), (64, 64))  # (concurrency, tenants) of the in-process cells

Backend = Literal["memory", "redis"]
Mode = Literal["off", "on"]
Step = Literal["limiter.admit", "kv.admit", "kv.release", "limiter.settle", "admission",
               "settlement"]  # fmt: skip
STEPS: tuple[Step, ...] = ("limiter.admit", "kv.admit", "kv.release", "limiter.settle")
PHASES: tuple[Step, ...] = ("admission", "settlement")  # as the app does them: both at once


# -- the gateway's admission objects ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Probe:
    """One run's private key and engine, so its Redis keys are its own (and can be removed)."""

    key: KeyInfo
    upstream: Upstream

    @classmethod
    def new(cls) -> Probe:
        tag = secrets.token_hex(4)
        key = KeyInfo(key_id=secrets.token_hex(6), tenant=f"bench-{tag}", role="client",
                      reasoning="visible", rpm=RPM, tpm=TPM, created_at=datetime.now(UTC),
                      revoked_at=None, secret_hash=b"")  # fmt: skip
        return cls(key, Upstream(f"http://engine-{tag}/v1"))

    @property
    def patterns(self) -> tuple[str, str, str]:
        """The limiter's keys and budgets' counters (no prefix) and the KV budget's (its
        default prefix)."""
        tenant = self.key.tenant
        return (f"rl:{{{tenant}}}:*", f"spend:{{{tenant}}}:*",
                f"thinkgate:kv:{{pool}}:{self.upstream.base_url}:*")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Stack:
    """What the app's lifespan builds for admission: the process's one Redis client (``None``
    without ``REDIS_URL``), and the limiter and the KV budget on it."""

    limiter: KeyLimiter
    kv: KVAdmission
    redis: AutoPipeline | None

    @property
    def round_trips(self) -> int:
        return self.redis.round_trips if self.redis is not None else 0

    async def admit(self, probe: Probe, spend: SpendAsk | None = None) -> Ticket:
        """``gateway.admission.gate.Gate.admit`` itself, as every route asks it (``spend``:
        with the request's budgets)."""
        ticket, _ = await Gate(self.limiter, self.kv).admit(
            probe.key, [probe.upstream], "standard", TOKENS, spend=spend
        )
        return ticket

    async def settle(self, ticket: Ticket, usage: Usage | None = None) -> None:
        """As ``Exchange.finish`` settles: refund and release at once (and record, not here)."""
        await Gate(self.limiter, self.kv).settle(ticket, USED, usage)


@contextlib.asynccontextmanager
async def admission_stack(redis_url: str) -> AsyncIterator[Stack]:
    settings = Settings(redis_url=redis_url, kv_capacity_tokens=KV_CAPACITY).admission
    redis = open_redis(settings)
    try:
        yield Stack(open_limiter(settings, redis), open_admission(settings, redis), redis)
    finally:
        if redis is not None:
            await redis.aclose()


@contextlib.asynccontextmanager
async def redis_admin(url: str) -> AsyncIterator[Redis | None]:
    """A separate client for INFO and clean-up (``None`` without Redis)."""
    if not url:
        yield None
        return
    client = Redis.from_url(url, socket_connect_timeout=2)
    try:
        await client.ping()
        yield client
    finally:
        await client.aclose()


async def remove_keys(client: Redis | None, patterns: Sequence[str]) -> None:
    if client is None:
        return
    for pattern in patterns:
        keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
        if keys:
            await client.delete(*keys)


async def redis_cpu_s(client: Redis | None) -> float:
    if client is None:
        return math.nan
    cpu = await client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


# -- part 1: in process -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MicroCell:
    backend: Backend
    concurrency: int
    tenants: int  # workers share keys (and tenants) round-robin
    round: int
    admissions: int
    elapsed_s: float
    admit: Percentiles  # seconds
    settle: Percentiles
    client_cpu_us: float  # this process, per admission + settlement
    redis_cpu_us: float  # the Redis server, per admission + settlement (NaN in process)
    round_trips: float  # per admission + settlement (NaN in process)

    @property
    def rate(self) -> float:
        return self.admissions / self.elapsed_s


async def _cycles(stack: Stack, probe: Probe, until_ns: int, admits: list[int],
                  settles: list[int]) -> None:  # fmt: skip
    """One worker: admission, settlement, again, until ``until_ns``."""
    clock = time.perf_counter_ns
    while clock() < until_ns:
        start = clock()
        ticket = await stack.admit(probe)
        admitted = clock()
        await stack.settle(ticket)
        admits.append(admitted - start)
        settles.append(clock() - admitted)


async def _drive(stack: Stack, probes: Sequence[Probe], concurrency: int,
                 seconds: float) -> tuple[list[int], list[int], float]:  # fmt: skip
    admits: list[int] = []
    settles: list[int] = []
    start = time.perf_counter_ns()
    until = start + int(seconds * 1e9)
    await asyncio.gather(*(_cycles(stack, probes[i % len(probes)], until, admits, settles)
                           for i in range(concurrency)))  # fmt: skip
    return admits, settles, (time.perf_counter_ns() - start) / 1e9


async def micro_cell(backend: Backend, shape: tuple[int, int], seconds: float, redis_url: str,
                     round_: int = 1, warmup_s: float = 0.5) -> MicroCell:  # fmt: skip
    url = redis_url if backend == "redis" else ""
    concurrency, tenants = shape
    probes = [Probe.new() for _ in range(tenants)]
    async with admission_stack(url) as stack, redis_admin(url) as admin:
        try:
            await _drive(stack, probes, concurrency, warmup_s)  # connections, scripts
            cpu, server, trips = time.process_time(), await redis_cpu_s(admin), stack.round_trips
            admits, settles, elapsed = await _drive(stack, probes, concurrency, seconds)
            cpu, server = time.process_time() - cpu, await redis_cpu_s(admin) - server
            trips = stack.round_trips - trips
        finally:
            await remove_keys(admin, [p for probe in probes for p in probe.patterns])
        if stack.kv.store.degraded:
            raise RuntimeError("Redis failed during the cell: the KV budget fell back in process")
    n = len(admits)
    return MicroCell(backend, concurrency, tenants, round_, n, elapsed, _percentiles(admits),
                     _percentiles(settles), cpu / n * 1e6, server / n * 1e6,
                     trips / n if stack.redis is not None else math.nan)  # fmt: skip


def _percentiles(samples_ns: list[int]) -> Percentiles:
    return Percentiles.of([s / 1e9 for s in samples_ns])


async def run_micro(redis_url: str, seconds: float, shapes: Sequence[tuple[int, int]] = SHAPES,
                    rounds: int = 2) -> list[MicroCell]:  # fmt: skip
    cells = []
    for shape in shapes:
        for round_ in range(1, rounds + 1):
            for backend in ("memory", "redis"):
                cells.append(await micro_cell(backend, shape, seconds, redis_url, round_))
    return cells


# -- commands per step --------------------------------------------------------------------------


class CommandLog:
    """The commands the gateway's Redis client (``ratelimit.autopipe.AutoPipeline``, through
    which every command of the request path goes) sends while ``active``."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.active = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[CommandLog]:
        original = AutoPipeline._send

        async def counting(pipe: AutoPipeline) -> None:  # sends what is pending as it starts
            if self.active:
                self.sent += [str(command[0]).upper() for command, _ in pipe._pending]
            await original(pipe)

        AutoPipeline._send = counting  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            AutoPipeline._send = original  # type: ignore[method-assign]


@dataclass(frozen=True, slots=True)
class StepCount:
    step: Step
    round_trips: float  # per call: the auto-pipeline's flushes
    sent: Mapping[str, float]  # commands per call from the client
    inner: Mapping[str, float] | None  # per call, run by the scripts inside Redis (None: disturbed)
    server_us: float  # the server's µs of script per call (NaN: disturbed)


@dataclass(slots=True)
class _Window:
    round_trips: list[int] = field(default_factory=list)
    sent: list[Counter[str]] = field(default_factory=list)
    inner: list[tuple[Counter[str], float] | None] = field(default_factory=list)


async def count_commands(redis_url: str, calls: int = 20, windows: int = 5) -> list[StepCount]:
    """Each step alone, one call at a time, so nothing else shares its round trips."""
    probe = Probe.new()
    seen = {step: _Window() for step in (*STEPS, *PHASES)}
    async with admission_stack(redis_url) as stack, redis_admin(redis_url) as admin:
        assert admin is not None
        try:
            await _drive(stack, [probe], 1, 0.05)  # scripts loaded, a connection open
            with CommandLog().installed() as log:
                for _ in range(windows):
                    await _one_window(stack, probe, calls, admin, log, seen)
        finally:
            await remove_keys(admin, probe.patterns)
    return [_step_count(step, window, calls) for step, window in seen.items()]


def _work(stack: Stack, probe: Probe) -> dict[Step, Callable[[int], Awaitable[None]]]:
    """Each step's ``calls``-th call; the later steps give back what the earlier ones took."""
    limiter, kv = stack.limiter, stack.kv
    admissions: list[Admission] = []
    grants: list[Grant] = []
    pairs: list[Ticket] = []

    async def put(into: list[Any], result: Awaitable[Any]) -> None:
        into.append(await result)

    async def grant() -> Grant:
        return (await kv.admit([probe.upstream], probe.key.tenant, "standard", TOKENS))[0]

    return {
        "limiter.admit": lambda _: put(admissions, limiter.admit(probe.key, TOKENS)),
        "kv.admit": lambda _: put(grants, grant()),
        "kv.release": lambda i: kv.release(grants[i]),
        "limiter.settle": lambda i: limiter.settle(admissions[i], USED),
        "admission": lambda _: put(pairs, stack.admit(probe)),
        "settlement": lambda i: stack.settle(pairs[i]),
    }


async def _one_window(stack: Stack, probe: Probe, calls: int, admin: Redis, log: CommandLog,
                      seen: dict[Step, _Window]) -> None:  # fmt: skip
    work = _work(stack, probe)
    for step, window in seen.items():
        before, trips = await admin.info("commandstats"), stack.round_trips
        log.sent.clear()
        log.active = True
        for i in range(calls):
            await work[step](i)
        log.active = False
        window.round_trips.append(stack.round_trips - trips)
        after = await admin.info("commandstats")
        sent = Counter(log.sent)
        window.sent.append(sent)
        window.inner.append(_inner(before, after, sent))


def _inner(before: Mapping[str, Any], after: Mapping[str, Any],
           sent: Counter[str]) -> tuple[Counter[str], float] | None:  # fmt: skip
    """What Redis ran inside the scripts, and its µs of script; ``None`` when another client's
    scripts ran in the window too."""
    delta: Counter[str] = Counter()
    for name, stats in after.items():
        command = name.removeprefix("cmdstat_").upper()
        calls = int(stats["calls"]) - int(before.get(name, {"calls": 0})["calls"])
        if calls and command != "INFO":
            delta[command] = calls
    if delta["EVALSHA"] != sent["EVALSHA"]:
        return None
    zero = {"usec": 0}
    usec = float(after.get("cmdstat_evalsha", zero)["usec"]) - float(
        before.get("cmdstat_evalsha", zero)["usec"])  # fmt: skip
    return delta - sent, usec


def _step_count(step: Step, window: _Window, calls: int) -> StepCount:
    sent = window.sent[-1]
    if any(other != sent for other in window.sent) or len(set(window.round_trips)) > 1:
        raise RuntimeError(f"{step}: the client's commands differ between windows")
    per_call = {name: n / calls for name, n in sorted(sent.items())}
    trips = window.round_trips[-1] / calls
    clean = [w for w in window.inner if w is not None]
    if not clean:
        return StepCount(step, trips, per_call, None, math.nan)
    inner, usec = min(clean, key=lambda w: w[0].total())
    inner_per_call = {name: n / calls for name, n in sorted(inner.items())}
    return StepCount(step, trips, per_call, inner_per_call, usec / calls)


# -- part 2: through the gateway ----------------------------------------------------------------

LAUNCH = """
import sys, uvicorn
from gateway.app import create_app
from gateway.ledger.record import DiscardSink
from gateway.settings import Settings
uvicorn.run(create_app(Settings(), sink=DiscardSink(), freeze_gc=True), host="127.0.0.1",
            port=int(sys.argv[1]), loop="uvloop", http="httptools", access_log=False,
            log_level="warning")
"""


@dataclass(frozen=True, slots=True)
class GatewayRound:
    mode: Mode
    round: int
    requests: int
    elapsed_s: float
    ttft: Percentiles  # seconds
    total: Percentiles
    cpu_us: float  # gateway CPU per request

    @property
    def rate(self) -> float:
        return self.requests / self.elapsed_s


@dataclass(frozen=True, slots=True)
class GatewayPlan:
    redis_url: str
    seconds: float
    ttft_ms: float
    itl_ms: float
    rounds: int = 2
    warmup_s: float = 1.0


def start_gateway(work: Workdir, upstream: str, mode: Mode, redis_url: str,
                  extra: Mapping[str, str] | None = None) -> ServerProcess:  # fmt: skip
    """A gateway process (``extra``: more settings, ``bench.budgets``' prices file)."""
    env = {**work.env, "THINKGATE_UPSTREAMS": upstream, **(extra or {}),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}  # fmt: skip
    if mode == "on":
        env |= {"THINKGATE_REDIS_URL": redis_url, "THINKGATE_KV_CAPACITY_TOKENS": str(KV_CAPACITY)}
    port = free_port()
    server = work.spawn(f"gateway-{mode}-{port}", [sys.executable, "-c", LAUNCH, str(port)],
                        env, port, "/healthz")  # fmt: skip
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def create_key(work: Workdir, tenant: str, limited: bool) -> str:
    """A visible-reasoning client key (with rpm / tpm when ``limited``); the secret is the last
    line of the CLI's output."""
    argv = [THINKGATE, "keys", "create", "--tenant", tenant, "--role", "client"]
    argv += ["--reasoning", "visible"]
    if limited:
        argv += ["--rpm", str(RPM), "--tpm", str(TPM)]
    out = subprocess.run(argv, cwd=work.path, env=work.env, check=True, capture_output=True)
    return out.stdout.decode().strip().splitlines()[-1]


def gateway_round(plan: GatewayPlan, gateway: ServerProcess, key: str, mode: Mode,
                  round_: int) -> GatewayRound:  # fmt: skip
    spec = LoadSpec(url=gateway.base_url, api_key=key, concurrency=GATEWAY_CONCURRENCY,
                    duration_s=plan.seconds, max_tokens=GATEWAY_MAX_TOKENS,
                    warmup_s=plan.warmup_s)  # fmt: skip
    meter = CpuMeter({"gateway": psutil.Process(gateway.popen.pid)})
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        load = runner.run(run_load(spec, meter))
    if load.errors or not load.requests:
        raise RuntimeError(f"{mode}: {load.errors} errors, first: {load.first_error}")
    return GatewayRound(mode, round_, load.requests, load.elapsed_s, load.ttft, load.e2e,
                        meter.cpu_s["gateway"] / load.requests * 1e6)  # fmt: skip


def run_gateway(plan: GatewayPlan) -> list[GatewayRound]:
    with TemporaryDirectory(prefix="tg-admission-") as tmp:
        work = Workdir(Path(tmp))
        subprocess.run([THINKGATE, "ledger", "init"], cwd=work.path, env=work.env, check=True,
                       capture_output=True)  # fmt: skip
        tenant = f"bench-{secrets.token_hex(4)}"
        keys: dict[Mode, str] = {"off": create_key(work, tenant, False),
                                 "on": create_key(work, tenant, True)}  # fmt: skip
        with start_sim(work, plan.ttft_ms, plan.itl_ms) as sim:
            try:
                return _gateway_rounds(plan, work, sim, keys)
            finally:
                kv_keys = f"thinkgate:kv:{{pool}}:{sim.base_url}:*"
                asyncio.run(clean_keys(plan.redis_url, (f"rl:{{{tenant}}}:*", kv_keys)))


def _gateway_rounds(plan: GatewayPlan, work: Workdir, sim: ServerProcess,
                    keys: Mapping[Mode, str]) -> list[GatewayRound]:  # fmt: skip
    rounds: list[GatewayRound] = []
    for round_ in range(1, plan.rounds + 1):
        for mode in ("off", "on"):
            with start_gateway(work, sim.base_url, mode, plan.redis_url) as gateway:
                rounds.append(gateway_round(plan, gateway, keys[mode], mode, round_))
            if "unreachable" in gateway.log.read_text():
                raise RuntimeError(f"the {mode} gateway lost Redis; see {gateway.log}")
    return rounds


async def clean_keys(url: str, patterns: Sequence[str]) -> None:
    async with redis_admin(url) as admin:
        await remove_keys(admin, patterns)


# -- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Findings:
    micro: list[MicroCell]
    commands: list[StepCount]
    gateway: list[GatewayRound]
    redis_version: str = "unknown"
    micro_seconds: float = 0.0
    gateway_plan: GatewayPlan | None = None


def render(found: Findings) -> str:
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    code = revision(("gateway", "ratelimit", "bench/admission.py"))
    machine = (f"{os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
               f"uvloop {version('uvloop')}, Redis {found.redis_version} on 127.0.0.1")  # fmt: skip
    lines = ["## Admission and settlement", "",
             f"Generated by `python -m bench.admission` on {when}, code at {code}. "
             f"Machine: {machine}.", "", *_method(), "", "| target | measured | result |",
             "| --- | --- | --- |", *_targets(found)]  # fmt: skip
    if found.micro:
        lines += ["", f"### In process ({found.micro_seconds:g} s per cell)", "", *_micro(found)]
    if found.commands:
        lines += ["", "### Redis commands per call", "", *_commands(found)]
    if found.gateway and found.gateway_plan is not None:
        plan = found.gateway_plan
        lines += ["", f"### Through the gateway (c = {GATEWAY_CONCURRENCY}, max_tokens "
                  f"{GATEWAY_MAX_TOKENS}, simulator TTFT {plan.ttft_ms:g} ms, inter-token "
                  f"{plan.itl_ms:g} ms, {plan.seconds:g} s windows)", "",
                  *_gateway(found.gateway)]  # fmt: skip
    return "\n".join(lines) + "\n"


def _method() -> list[str]:
    doc = (__doc__ or "").split("\n\n", 2)[2]
    return ["Method (from `bench/admission.py`):", "", *doc.strip().splitlines()]


def _verdict(target: str, measured: str, ok: bool) -> str:
    return f"| {target} | {measured} | **{'pass' if ok else 'FAIL'}** |"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _targets(found: Findings) -> list[str]:
    rows = []
    judged = [c for c in found.micro if (c.concurrency, c.tenants) == (64, 1)]
    if any(c.backend == "redis" for c in judged):
        rate = _mean([c.rate for c in judged if c.backend == "redis"])
        base = _mean([c.rate for c in judged if c.backend == "memory"])
        each = ", ".join(f"{c.rate:,.0f}" for c in judged if c.backend == "redis")
        rows.append(_verdict(
            f"≥ {ADMISSIONS_TARGET:,.0f} admissions/s from one gateway process against local "
            "Redis (C = 64, one key; each admission settled)",
            f"{rate:,.0f}/s (mean of rounds {each}; in-process baseline {base:,.0f}/s, "
            f"{rate / base:.2f}×)", rate >= ADMISSIONS_TARGET))  # fmt: skip
    if found.commands:
        phases = [s for s in found.commands if s.step in PHASES]
        text = "; ".join(f"{s.step} {s.round_trips:g} ({_per_call(s.sent)})" for s in phases)
        ok = all(s.round_trips <= 1 for s in phases)
        rows.append(_verdict("one Redis round trip per admission and one per settlement", text, ok))
    if found.gateway:
        added = _added(found.gateway)
        ttft, total = _mean([a[1] for a in added]), _mean([a[3] for a in added])
        each = "; ".join(f"{a[1]:+.2f} / {a[3]:+.2f}" for a in added)
        rows.append(_verdict(
            f"added latency p99 ≤ {ADDED_P99_TARGET_MS:g} ms through the gateway at "
            f"c = {GATEWAY_CONCURRENCY} (Redis on − off)",
            f"TTFT {ttft:+.2f} ms, whole request {total:+.2f} ms (mean of {len(added)} paired "
            f"rounds, TTFT / request per round: {each})",
            max(ttft, total) <= ADDED_P99_TARGET_MS))  # fmt: skip
    return rows


def _us(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e6:,.0f}"


def _pq(p: Percentiles) -> str:
    return f"{_us(p.p50)} / {_us(p.p99)}"


def _micro(found: Findings) -> list[str]:
    lines = ["| C | round | admissions/s in-process | admissions/s Redis | Redis ÷ in-process "
             "| admission p50 / p99 µs in-process | admission p50 / p99 µs Redis "
             "| settlement p50 / p99 µs in-process; Redis "
             "| this process CPU µs per cycle in-process / Redis | Redis server CPU µs per cycle "
             "| round trips per cycle |", "| --- " * 11 + "|"]  # fmt: skip
    cells = {(c.backend, c.concurrency, c.tenants, c.round): c for c in found.micro}
    for (backend, concurrency, tenants, round_), redis in cells.items():
        mem = cells.get(("memory", concurrency, tenants, round_))
        if backend != "redis" or mem is None:
            continue
        shape = f"{concurrency}" + (f" ({tenants} keys)" if tenants > 1 else "")
        lines.append(
            f"| {shape} | {round_} | {mem.rate:,.0f} | {redis.rate:,.0f} | "
            f"{redis.rate / mem.rate:.2f}× | {_pq(mem.admit)} | {_pq(redis.admit)} | "
            f"{_pq(mem.settle)}; {_pq(redis.settle)} | {mem.client_cpu_us:,.0f} / "
            f"{redis.client_cpu_us:,.0f} | {redis.redis_cpu_us:,.0f} | {redis.round_trips:.2f} |"
        )
    lines += ["", "A cycle is one admission and its settlement. C workers share one key unless "
              "the row says otherwise (each key its own tenant). At C = 64 latency includes "
              "waiting behind the other workers: the loop is closed and saturated."]  # fmt: skip
    return lines


def _per_call(counts: Mapping[str, float] | None) -> str:
    if counts is None:
        return "n/a (other clients' scripts ran in every window)"
    return ", ".join(f"{name} {n:g}" for name, n in counts.items()) or "none"


def _commands(found: Findings) -> list[str]:
    lines = ["| step | round trips | client commands | run inside Redis by the scripts "
             "| Redis µs of script |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for s in found.commands:
        name = f"**{s.step}** (as the app does it)" if s.step in PHASES else s.step
        ran = _per_call(s.inner)
        if s.step in PHASES and s.inner is not None:
            ran = f"{sum(s.inner.values()):g} commands"
        lines.append(f"| {name} | {s.round_trips:g} | {_per_call(s.sent)} | {ran} | "
                     f"{s.server_us:.1f} |")  # fmt: skip
    return lines


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.2f}"


def _added(rounds: list[GatewayRound]) -> list[tuple[float, float, float, float, float]]:
    """Per round: on − off of TTFT p50, p99, request p50, p99 (ms) and CPU µs/request."""
    out = []
    by = {(r.mode, r.round): r for r in rounds}
    for (mode, round_), on in by.items():
        off = by.get(("off", round_))
        if mode == "on" and off is not None:
            out.append(((on.ttft.p50 - off.ttft.p50) * 1e3, (on.ttft.p99 - off.ttft.p99) * 1e3,
                        (on.total.p50 - off.total.p50) * 1e3, (on.total.p99 - off.total.p99) * 1e3,
                        on.cpu_us - off.cpu_us))  # fmt: skip
    return out


def _gateway(rounds: list[GatewayRound]) -> list[str]:
    lines = ["| round | mode | requests/s | TTFT p50 / p99 ms | request p50 / p99 ms "
             "| gateway CPU µs/request | added TTFT p50 / p99 ms | added request p50 / p99 ms "
             "| added CPU µs/request |", "| --- " * 9 + "|"]  # fmt: skip
    added = iter(_added(rounds))
    for r in rounds:
        extra = "- | - | -"
        if r.mode == "on":
            t50, t99, r50, r99, cpu = next(added)
            extra = f"{t50:+.2f} / {t99:+.2f} | {r50:+.2f} / {r99:+.2f} | {cpu:+,.0f}"
        lines.append(f"| {r.round} | {r.mode} | {r.rate:,.0f} | {_ms(r.ttft.p50)} / "
                     f"{_ms(r.ttft.p99)} | {_ms(r.total.p50)} / {_ms(r.total.p99)} | "
                     f"{r.cpu_us:,.0f} | {extra} |")  # fmt: skip
    return lines


# -- the command line ---------------------------------------------------------------------------


async def measure_in_process(url: str, parts: Sequence[str], seconds: float,
                             rounds: int) -> Findings:  # fmt: skip
    async with redis_admin(url) as admin:  # fails here, loudly, when Redis is not there
        assert admin is not None
        redis_version = str((await admin.info("server"))["redis_version"])
    micro = await run_micro(url, seconds, rounds=rounds) if "micro" in parts else []
    commands = await count_commands(url) if "commands" in parts else []
    return Findings(micro, commands, [], redis_version, seconds)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measured cell")
    parser.add_argument("--quick", action="store_true", help="0.3 s cells, one round (tests)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--ttft-ms", type=float, default=200.0, help="the simulator's TTFT")
    parser.add_argument("--itl-ms", type=float, default=20.0, help="its inter-token delay")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args(argv)
    seconds, rounds = (min(args.duration, 0.3), 1) if args.quick else (args.duration, 2)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        found = runner.run(measure_in_process(args.redis_url, args.parts, seconds, rounds))
    if "gateway" in args.parts:
        plan = GatewayPlan(args.redis_url, max(seconds, 1.0), args.ttft_ms, args.itl_ms, rounds)
        found = replace(found, gateway=run_gateway(plan), gateway_plan=plan)
    text = render(found)
    print(text)
    if args.write:
        write_section(Path(__file__).with_name("RESULTS.md"), "admission", text)
    return text


if __name__ == "__main__":
    main()
