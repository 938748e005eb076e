"""Batches beside interactive traffic: a big batch runs in the capacity interactive work leaves.

The requirement: against the simulator with interactive load, a 5,000-line batch completes,
and interactive TTFT p99 with the batch running is at most 1.2× its value without it.

One simulated engine (``thinkgate sim``: 100 ms to the first token, 10 ms per further one, a
16,384-token KV cache with a FIFO queue in front: a request whose blocks do not fit waits) behind
one thinkgate in the production configuration (``ledger init``, strict ledger, one checkpoint a
second, JSON access log; PostgreSQL and Redis with ``--store postgres``, the default, SQLite and
the budget in process with ``--store sqlite``). The KV capacity is the engine's own
(``vllm:cache_config_info``, scraped), so admission keeps the engine below it: interactive
requests ask at ``standard`` priority, batch lines at ``sheddable`` (the runner's: refused at
once under pressure, the runner then halving how many lines it runs). Sized so that without
shedding the engine would be overloaded: ``BATCH_MAX_CONCURRENCY`` (64) lines of about 240
tokens and the interactive ones do not fit its cache, and interactive requests would queue in
the engine behind batch lines. Two tenants, as in use: ``interactive`` (the users) and
``batch`` (an offline job's key), visible-reasoning client keys; the interactive tenant has a
key per phase, so the gateway's access log tells the phases' requests apart.

- **Alone, before**: ``--interactive-concurrency`` closed-loop clients stream chat completions
  (``deepseek-r1``, a new seeded prompt of about 200 tokens each, ``--interactive-max-tokens``)
  for ``--seconds``; TTFT is the time to the first SSE chunk with reasoning or answer text.
- **With the batch**: ``--lines`` chat lines (prompts like the interactive ones,
  ``--batch-max-tokens``) are uploaded (``POST /v1/files``) and made a batch (``POST
  /v1/batches``); ``--settle`` seconds later, the runner's window open, the same load runs for
  the same time. Then the batch is polled to its end, its output file downloaded and checked:
  every line once by ``custom_id``, each answered 200, no error file.
- **Alone, after**: the same load once more. "Without the batch" is before and after pooled:
  twice the samples, and a drift of the machine over the run shows (and cancels) there.

The machine is shared: before each phase (before the batch is made, for the second) the bench
waits, ``--quiet-wait`` s at most, for a second in which other processes keep fewer than
``--quiet-cores`` cores busy, and reports the cores each part took during the phase (gateway,
engine, this client, PostgreSQL and Redis, the rest of the machine).

Reported per phase: interactive requests, TTFT p50 / p99 / max as the client sees it, the
gateway's own TTFT and overhead (arrival to the engine asked, KV admission included; from its
access log), KV admissions that waited more than 50 ms (``thinkgate_admission_wait_seconds``,
any tenant's), refusals. Then the p99 ratio (target ≤ 1.2), the batch's wall time from its
creation and lines per second, how many lines ended while the load was measured, lines shed
(``thinkgate_batch_lines_shed_total``), the engine's peaks (KV usage, requests running and
waiting, sampled every 250 ms; preemptions): the engine never queueing is what admission is
for. Warnings and errors in the gateway's log are counted and the first few printed. The exit
status is 1 when the batch did not answer every line exactly once or the ratio missed its
target.

``--split``: two replicas on the same PostgreSQL and Redis, the interactive load's with
``BATCH_MAX_CONCURRENCY=0`` (the batch is made there) and one running the batch's lines, as
``docs/batches.md`` advises for production: the interactive replica's event loop then runs no
batch line.

``python -m bench.batches [--lines 5000] [--interactive-concurrency 8] [--seconds 30] [--split]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench.procs import THINKGATE, ServerProcess, Workdir, free_port
from bench.realistic import POSTGRES, psql

MODEL = "deepseek-r1"
REDIS_DB = "redis://127.0.0.1:6379/12"  # bench.realistic's is 13, bench.admission's 14
ENDED = ("completed", "failed", "expired", "cancelled")
RATIO_TARGET = 1.2
PHASES = ("before", "during", "after")  # the interactive load: alone, with the batch, alone
KEYS = ("warm", *PHASES, "batch")  # all but the last of tenant interactive
WORDS = ("ledger", "merkle", "tile", "checkpoint", "tenant", "stream", "token", "engine",
         "cache", "prefix", "block", "replica", "witness", "record", "seal", "route")  # fmt: skip


@dataclass(frozen=True)
class Shape:
    lines: int = 5_000
    interactive_concurrency: int = 8
    seconds: float = 30.0
    settle: float = 3.0  # after the batch is made, before the interactive load is measured
    prompt_tokens: int = 200
    interactive_max_tokens: int = 32
    batch_max_tokens: int = 32
    seed: int = 42
    split: bool = False  # batch lines on a replica of their own (BATCH_MAX_CONCURRENCY=0 here)
    quiet_cores: float = 0.3  # before a phase: other processes below it for a second ...
    quiet_wait: float = 20.0  # ... waited for at most this long


@dataclass(frozen=True)
class Engine:
    ttft_ms: float = 100.0
    itl_ms: float = 10.0
    kv_capacity_tokens: int = 16_384


def prompt(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of seeded words (the simulator counts four characters each)."""
    words: list[str] = []
    size = 0
    while size < tokens * 4:
        word = rng.choice(WORDS) + str(rng.randrange(1000))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def batch_input(shape: Shape) -> bytes:
    rng = random.Random(shape.seed)
    out = []
    for i in range(shape.lines):
        body = {
            "model": MODEL,
            "max_tokens": shape.batch_max_tokens,
            "messages": [{"role": "user", "content": prompt(rng, shape.prompt_tokens)}],
        }
        out.append(orjson.dumps({"custom_id": f"line-{i}", "method": "POST",
                                 "url": "/v1/chat/completions", "body": body}))  # fmt: skip
    return b"\n".join(out) + b"\n"


# -- the interactive load ---------------------------------------------------------------------


@dataclass
class Load:
    ttft: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)  # 0: the connection failed
    first_refusal: str | None = None
    wall: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def refused(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200)


async def _one(client: httpx.AsyncClient, url: str, key: str, body: bytes, out: Load) -> None:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    started, first = time.perf_counter(), None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", content=body,
                                 headers=headers) as response:  # fmt: skip
            out.statuses[response.status_code] += 1
            if response.status_code != 200:
                text = (await response.aread())[:300]
                if out.first_refusal is None:
                    out.first_refusal = f"{response.status_code} {text!r}"
                return
            async for line in response.aiter_lines():
                if first is not None or not line.startswith("data: {"):
                    continue
                delta = (orjson.loads(line[6:]).get("choices") or [{}])[0].get("delta") or {}
                if any(delta.get(k) for k in ("content", "reasoning_content", "reasoning")):
                    first = time.perf_counter() - started
    except httpx.HTTPError as exc:
        out.statuses[0] += 1
        if out.first_refusal is None:
            out.first_refusal = f"{type(exc).__name__}: {exc}"
        return
    if first is not None:
        out.ttft.append(first)


async def interactive(url: str, key: str, shape: Shape, seconds: float, seed: int) -> Load:
    """``interactive_concurrency`` closed-loop streams for ``seconds``; each client's prompts
    are its own seeded ones, new each request (no prefix is shared)."""
    out = Load()
    limits = httpx.Limits(max_connections=shape.interactive_concurrency * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        deadline = time.perf_counter() + seconds

        async def user(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            while time.perf_counter() < deadline:
                body = {"model": MODEL, "stream": True,
                        "max_tokens": shape.interactive_max_tokens,
                        "messages": [{"role": "user",
                                      "content": prompt(rng, shape.prompt_tokens)}]}  # fmt: skip
                await _one(client, url, key, orjson.dumps(body), out)

        started = time.perf_counter()
        await asyncio.gather(*(user(i) for i in range(shape.interactive_concurrency)))
        out.wall = time.perf_counter() - started
    return out


# -- the engine's peaks -----------------------------------------------------------------------


def sample(text: str, name: str, labels: str = "") -> float:
    """The sum of a metric's samples whose labels contain ``labels``."""
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        if labels in (match.group(1) or ""):
            total += float(match.group(2))
    return total


@dataclass
class Peaks:
    kv_usage: float = 0.0
    waiting: float = 0.0
    running: float = 0.0


async def watch(sim: ServerProcess, peaks: Peaks, every: float = 0.25) -> None:
    """The engine's KV usage, queue and running requests at their highest, until cancelled."""
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            try:
                text = (await client.get(f"{sim.url}/metrics")).text
            except httpx.HTTPError:
                text = ""
            peaks.kv_usage = max(peaks.kv_usage, sample(text, "vllm:kv_cache_usage_perc"))
            peaks.waiting = max(peaks.waiting, sample(text, "vllm:num_requests_waiting"))
            peaks.running = max(peaks.running, sample(text, "vllm:num_requests_running"))
            await asyncio.sleep(every)


async def metrics(client: httpx.AsyncClient, server: ServerProcess) -> str:
    return (await client.get(f"{server.url}/metrics")).text


async def admissions(client: httpx.AsyncClient, gateway: ServerProcess) -> tuple[float, float]:
    """KV admissions so far (``thinkgate_admission_wait_seconds``), and those that waited
    more than 50 ms."""
    text = await metrics(client, gateway)
    count = sample(text, "thinkgate_admission_wait_seconds_count")
    return count, count - sample(text, "thinkgate_admission_wait_seconds_bucket", 'le="0.05"')


# -- the batch --------------------------------------------------------------------------------


async def create_batch(client: httpx.AsyncClient, url: str, key: str, content: bytes) -> str:
    auth = {"authorization": f"Bearer {key}"}
    files = {"file": ("in.jsonl", content, "application/jsonl")}
    uploaded = await client.post(f"{url}/v1/files", headers=auth, data={"purpose": "batch"},
                                 files=files)  # fmt: skip
    uploaded.raise_for_status()
    made = await client.post(f"{url}/v1/batches", headers=auth,
                             json={"input_file_id": uploaded.json()["id"],
                                   "endpoint": "/v1/chat/completions",
                                   "completion_window": "24h"})  # fmt: skip
    made.raise_for_status()
    batch_id: str = made.json()["id"]
    return batch_id


async def get_batch(client: httpx.AsyncClient, url: str, key: str, batch_id: str) -> Any:
    response = await client.get(f"{url}/v1/batches/{batch_id}",
                                headers={"authorization": f"Bearer {key}"})  # fmt: skip
    response.raise_for_status()
    return response.json()


async def wait_ended(client: httpx.AsyncClient, url: str, key: str, batch_id: str,
                     within_s: float) -> tuple[Any, float]:  # fmt: skip
    """The batch once ended (or as it stands at the deadline) and when it was seen ended."""
    deadline = time.monotonic() + within_s
    while True:
        batch = await get_batch(client, url, key, batch_id)
        if batch["status"] in ENDED or time.monotonic() > deadline:
            return batch, time.perf_counter()
        await asyncio.sleep(0.25)


@dataclass(frozen=True)
class Checked:
    output_lines: int
    distinct: int
    ok_200: int
    error_lines: int
    exactly_once: bool


async def check_output(client: httpx.AsyncClient, url: str, key: str, batch: Any,
                       lines: int) -> Checked:  # fmt: skip
    auth = {"authorization": f"Bearer {key}"}
    found: list[Any] = []
    errors = 0
    for name in ("output_file_id", "error_file_id"):
        if not batch.get(name):
            continue
        response = await client.get(f"{url}/v1/files/{batch[name]}/content", headers=auth)
        response.raise_for_status()
        parsed = [orjson.loads(line) for line in response.content.splitlines() if line.strip()]
        if name == "error_file_id":
            errors = len(parsed)
        found += parsed
    ids = Counter(line["custom_id"] for line in found)
    ok = sum(1 for line in found if (line.get("response") or {}).get("status_code") == 200)
    once = (set(ids) == {f"line-{i}" for i in range(lines)} and max(ids.values(), default=0) == 1
            and ok == lines and not errors)  # fmt: skip
    return Checked(len(found), len(ids), ok, errors, once)


# -- the machine ------------------------------------------------------------------------------


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:  # it ended meanwhile
        return 0.0
    return float(times.user + times.system)


def _databases() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"])
            if p.info["name"] in ("postgres", "redis-server")]  # fmt: skip


def _busy() -> float:
    """CPU seconds the machine spent busy (Linux counts guest time in user time too)."""
    times = psutil.cpu_times()._asdict()
    idle = ("idle", "iowait", "guest", "guest_nice")
    return float(sum(v for k, v in times.items() if k not in idle))


class Machine:
    """Cores busy over a window: this bench's processes (the gateway, the engine, the client),
    the database servers (PostgreSQL and Redis, which anyone else on the machine may share),
    and everything else (``others``: the machine's busy time less the two)."""

    def __init__(self, ours: dict[str, psutil.Process]) -> None:
        self.ours = ours

    def start(self) -> None:
        self._at, self._busy = time.perf_counter(), _busy()
        self._ours = {name: _cpu(p) for name, p in self.ours.items()}
        self._databases = {p: _cpu(p) for p in _databases()}

    def stop(self) -> dict[str, float]:
        wall = max(time.perf_counter() - self._at, 1e-9)
        cores = {name: (_cpu(p) - self._ours[name]) / wall for name, p in self.ours.items()}
        now = {p: _cpu(p) for p in _databases()}
        databases = sum(now[p] - self._databases.get(p, 0.0) for p in now) / wall
        others = (_busy() - self._busy) / wall - sum(cores.values()) - databases
        return {**cores, "databases": databases, "others": max(others, 0.0)}


async def quiet(ours: dict[str, psutil.Process], most: float, within_s: float) -> float:
    """Wait (at most ``within_s``) for a second in which the machine's other processes keep
    fewer than ``most`` cores busy; the cores they took in the last second looked at."""
    deadline = time.monotonic() + within_s
    while True:
        machine = Machine(ours)
        machine.start()
        await asyncio.sleep(1.0)
        others = machine.stop()["others"]
        if others < most or time.monotonic() > deadline:
            return others


# -- the processes ----------------------------------------------------------------------------


def start_sim(work: Workdir, engine: Engine) -> ServerProcess:
    port = free_port()
    argv = [THINKGATE, "sim", "--port", str(port), "--ttft-ms", str(engine.ttft_ms),
            "--itl-ms", str(engine.itl_ms), "--block-size", "16",
            "--kv-capacity-tokens", str(engine.kv_capacity_tokens)]  # fmt: skip
    sim = work.spawn(f"sim-{port}", argv, work.env, port, "/health")
    sim.wait_ready()
    return sim


def gateway_env(work: Workdir, store: str, database: str) -> dict[str, str]:
    """The production configuration: strict ledger, one checkpoint a second, JSON access log;
    PostgreSQL and Redis (the KV budget shared as replicas share it) unless ``sqlite``."""
    env = {**work.env, "THINKGATE_AUDIT_MODE": "strict", "THINKGATE_LOG_LEVEL": "info",
           "THINKGATE_LOG_FORMAT": "json", "THINKGATE_CHECKPOINT_INTERVAL_MS": "1000"}  # fmt: skip
    if store == "postgres":
        env |= {"THINKGATE_DATABASE_URL": f"{POSTGRES}/{database}",
                "THINKGATE_REDIS_URL": REDIS_DB}  # fmt: skip
    return env


def create_keys(work: Workdir, env: dict[str, str]) -> dict[str, str]:
    """The ledger's keys, then visible-reasoning client keys: tenant ``interactive``'s for the
    warm-up and each measured phase (the access log tells their requests apart by key id),
    tenant ``batch``'s for the batch. The secret is the last line ``keys create`` prints."""
    subprocess.run([THINKGATE, "ledger", "init"], cwd=work.path, env=env, check=True,
                   capture_output=True)  # fmt: skip
    keys = {}
    for name in KEYS:
        tenant = "batch" if name == "batch" else "interactive"
        argv = [THINKGATE, "keys", "create", "--tenant", tenant, "--role", "client",
                "--reasoning", "visible"]  # fmt: skip
        out = subprocess.run(argv, cwd=work.path, env=env, check=True, capture_output=True)
        keys[name] = out.stdout.decode().strip().splitlines()[-1]
    return keys


def key_id(secret: str) -> str:
    """``sk-tg-<key id>-<secret>``."""
    return secret.split("-")[2]


def start_gateway(work: Workdir, sim: ServerProcess, env: dict[str, str],
                  **more: str) -> ServerProcess:  # fmt: skip
    """A gateway with its own spool file (replicas share the rest), ``more`` settings besides."""
    port = free_port()
    argv = [THINKGATE, "serve", "--upstream", sim.base_url, "--port", str(port), "--workers", "1"]
    env = {**env, "THINKGATE_AUDIT_SPOOL_FILE": str(work.path / f"spool-{port}.log"), **more}
    server = work.spawn(f"thinkgate-{port}", argv, env, port, "/healthz")
    server.wait_ready()
    return server


async def warm(client: httpx.AsyncClient, gateway: ServerProcess, keys: dict[str, str]) -> None:
    """One request per key, then wait until the gateway knows the engine's KV capacity (its
    first scrape): before it, nothing is KV-limited."""
    for key in keys.values():
        body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post(f"{gateway.url}/v1/chat/completions", json=body,
                                     headers={"authorization": f"Bearer {key}"})  # fmt: skip
        response.raise_for_status()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        text = await metrics(client, gateway)
        if sample(text, "thinkgate_kv_budget_tokens", 'state="capacity"') > 0:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the gateway never learnt the engine's KV capacity")


def log_problems(log: Path, most: int = 5) -> tuple[Counter[str], list[str]]:
    """Warnings and errors in a JSON log (tracebacks and other text lines count as errors)."""
    counts: Counter[str] = Counter()
    first: list[str] = []
    for raw in log.read_text(errors="replace").splitlines():
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            entry = None
        if isinstance(entry, dict):
            level = str(entry.get("level") or "").lower()
        else:
            level = "error" if "Traceback" in raw or "Error" in raw else ""
        if level in ("warning", "error", "critical"):
            counts[level] += 1
            if len(first) < most:
                first.append(raw[:400])
    return counts, first


def access_times(log: Path, key: str) -> tuple[list[float], list[float]]:
    """The gateway's own TTFT and overhead (seconds; overhead: from arrival to the engine
    asked, admission included, plus the work on every chunk) of the key's chat completions,
    from the access log."""
    ttft: list[float] = []
    overhead: list[float] = []
    wanted = key_id(key)
    for raw in log.read_text(errors="replace").splitlines():
        if '"thinkgate.access"' not in raw or wanted not in raw:
            continue
        entry = orjson.loads(raw)
        if entry.get("key_id") == wanted and entry.get("ttft_ms") is not None:
            ttft.append(entry["ttft_ms"] / 1000)
            overhead.append(entry["overhead_ms"] / 1000)
    return ttft, overhead


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Phase:
    """The interactive load of one phase, the engine's peaks, the machine's busy cores
    (``Machine``) and the others' in the second before it began (``quiet``), and the gateway's
    own view of its requests (filled in from its log)."""

    load: Load
    peaks: Peaks
    cores: dict[str, float]
    others_before: float
    admissions: tuple[float, float]  # KV admissions in the phase, any tenant's; over 50 ms
    gateway_ttft: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)


@dataclass
class BatchRun:
    lines: int
    status: str
    counts: dict[str, int]
    checked: Checked | None
    wall_s: float
    during: int  # lines ended while the interactive load was measured
    ran_through: bool  # the batch was still running when the measured load ended
    shed: float
    kv_refused: float
    preemptions: float


@dataclass
class Result:
    phases: dict[str, Phase]
    batch: BatchRun
    log_counts: Counter[str] = field(default_factory=Counter)
    log_first: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Stack:
    sim: ServerProcess
    gateway: ServerProcess
    keys: dict[str, str]
    shape: Shape
    runner: ServerProcess | None = None  # the replica running batch lines, when split

    @property
    def processes(self) -> dict[str, psutil.Process]:
        ours = {"gateway": self.gateway.process, "engine": self.sim.process,
                "client": psutil.Process()}  # fmt: skip
        if self.runner is not None:
            ours["batch gateway"] = self.runner.process
        return ours

    @property
    def gateways(self) -> list[ServerProcess]:
        return [self.gateway] if self.runner is None else [self.gateway, self.runner]


async def calm(stack: Stack) -> float:
    """Wait for the machine to be quiet enough (``quiet``), saying so when it is not."""
    shape = stack.shape
    others = await quiet(stack.processes, shape.quiet_cores, shape.quiet_wait)
    if others >= shape.quiet_cores:
        _say(f"  the machine is busy: other processes took {others:.2f} cores just before")
    return others


async def phase(stack: Stack, name: str, seed: int, others_before: float) -> Phase:
    shape = stack.shape
    peaks = Peaks()
    watcher = asyncio.create_task(watch(stack.sim, peaks))
    machine = Machine(stack.processes)
    async with httpx.AsyncClient(timeout=10) as client:
        first = await admissions(client, stack.gateway)
        machine.start()
        try:
            load = await interactive(stack.gateway.url, stack.keys[name], shape, shape.seconds,
                                     seed)  # fmt: skip
        finally:
            watcher.cancel()
            cores = machine.stop()
        last = await admissions(client, stack.gateway)
    waited = (last[0] - first[0], last[1] - first[1])
    measured = Phase(load, peaks, cores, others_before, waited)
    _say(f"  {_row(name, measured)}")
    return measured


async def measure(stack: Stack) -> Result:
    url, batch_key, shape = stack.gateway.url, stack.keys["batch"], stack.shape
    phases = {}
    async with httpx.AsyncClient(timeout=120) as client:
        await warm(client, stack.gateway, stack.keys)
        await interactive(url, stack.keys["warm"], shape, 2.0, seed=0)  # not counted
        _say(f"alone: {shape.interactive_concurrency} streams for {shape.seconds:.0f} s")
        phases["before"] = await phase(stack, "before", 1, await calm(stack))

        content = batch_input(shape)
        others = await calm(stack)
        _say(f"batch: {shape.lines:,} lines ({len(content) / 1e6:.1f} MB) uploaded and made")
        batch_id = await create_batch(client, url, batch_key, content)
        made_at = time.perf_counter()
        await asyncio.sleep(shape.settle)
        start = await get_batch(client, url, batch_key, batch_id)
        _say(f"with the batch running ({_done(start)} lines done): the same load")
        phases["during"] = await phase(stack, "during", 2, others)
        end = await get_batch(client, url, batch_key, batch_id)
        _say(f"  ({_done(end)} lines done, {end['status']})")

        batch, ended_at = await wait_ended(client, url, batch_key, batch_id, 900)
        _say(f"batch {batch['status']} {ended_at - made_at:.1f} s after it was made")
        checked = None
        if batch["status"] in ENDED:
            checked = await check_output(client, url, batch_key, batch, shape.lines)
        text = "\n".join([await metrics(client, g) for g in stack.gateways])
        engine = (await client.get(f"{stack.sim.url}/metrics")).text
        _say("alone again, after the batch")
        phases["after"] = await phase(stack, "after", 3, await calm(stack))
    run = BatchRun(shape.lines, batch["status"], batch["request_counts"], checked,
                   ended_at - made_at, _done(end) - _done(start), end["status"] not in ENDED,
                   sample(text, "thinkgate_batch_lines_shed_total"),
                   sample(text, "thinkgate_ratelimit_rejections_total", 'kind="kv_budget"'),
                   sample(engine, "vllm:num_preemptions_total"))  # fmt: skip
    return Result(phases, run)


def _done(batch: Any) -> int:
    counts = batch["request_counts"]
    return int(counts["completed"]) + int(counts["failed"])


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def run(shape: Shape, engine: Engine, store: str) -> Result:
    database = f"bench_{os.getpid()}_batches"
    with tempfile.TemporaryDirectory(prefix="tg-batches-") as tmp:
        work = Workdir(Path(tmp))
        if store == "postgres":
            psql(f"CREATE DATABASE {database}")
        started: list[ServerProcess] = []
        try:
            env = gateway_env(work, store, database)
            keys = create_keys(work, env)
            started.append(start_sim(work, engine))
            if shape.split:  # interactive here, batch lines on the other replica only
                started.append(start_gateway(work, started[0], env,
                                             THINKGATE_BATCH_MAX_CONCURRENCY="0"))  # fmt: skip
                started.append(start_gateway(work, started[0], env))
            else:
                started.append(start_gateway(work, started[0], env))
            result = await measure(Stack(started[0], started[1], keys, shape,
                                         started[2] if shape.split else None))  # fmt: skip
        finally:
            for server in reversed(started):
                server.stop()
            if store == "postgres":
                psql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        log = started[1].log
        for server in started[1:]:
            counts, first = log_problems(server.log)
            result.log_counts += counts
            result.log_first += first
        for name, measured in result.phases.items():
            measured.gateway_ttft, measured.overhead = access_times(log, keys[name])
        return result


# -- the report -------------------------------------------------------------------------------


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000 if ordered else 0.0


LABELS = {"before": "alone, before the batch", "during": "with the batch running",
          "after": "alone, after the batch"}  # fmt: skip


def _row(name: str, p: Phase) -> str:
    load, c = p.load, p.cores
    return (f"| {LABELS[name]} | {load.requests:,} | {load.requests / max(load.wall, 1e-9):.1f} | "
            f"{_p(load.ttft, 0.5):.1f} | {_p(load.ttft, 0.99):.1f} | {_p(load.ttft, 1):.1f} | "
            f"{_p(p.gateway_ttft, 0.5):.1f} / {_p(p.gateway_ttft, 0.99):.1f} | "
            f"{_p(p.overhead, 0.5):.1f} / {_p(p.overhead, 0.99):.1f} | "
            f"{p.admissions[1]:,.0f} of {p.admissions[0]:,.0f} | {load.refused} | "
            f"{_gateways(c)} / {c['engine']:.2f} / {c['client']:.2f} / {c['databases']:.2f} | "
            f"{c['others']:.2f} ({p.others_before:.2f}) |")  # fmt: skip


def _gateways(cores: dict[str, float]) -> str:
    """The gateway's cores; with a batch replica, the interactive one's + the batch one's."""
    if "batch gateway" in cores:
        return f"{cores['gateway']:.2f} + {cores['batch gateway']:.2f}"
    return f"{cores['gateway']:.2f}"


def baseline(result: Result) -> list[float]:
    """The interactive TTFTs without the batch: before and after it, pooled."""
    return result.phases["before"].load.ttft + result.phases["after"].load.ttft


def ratio(result: Result) -> float:
    base = _p(baseline(result), 0.99)
    return _p(result.phases["during"].load.ttft, 0.99) / base if base else float("inf")


def table(result: Result, shape: Shape, engine: Engine) -> str:
    r, b = result, result.batch
    once = "yes" if b.checked is not None and b.checked.exactly_once else "**no**"
    ran = "still running at its end" if b.ran_through else "**ended before its end**"
    a, w = r.phases["before"].peaks, r.phases["during"].peaks
    lines = [
        f"Engine: `thinkgate sim`, TTFT {engine.ttft_ms:.0f} ms, {engine.itl_ms:.0f} ms a token, "
        f"KV cache {engine.kv_capacity_tokens:,} tokens. Interactive: "
        f"{shape.interactive_concurrency} closed-loop streams, ~{shape.prompt_tokens}-token "
        f"prompts, max_tokens {shape.interactive_max_tokens}, {shape.seconds:.0f} s a phase. "
        f"Batch: {shape.lines:,} lines, max_tokens {shape.batch_max_tokens}. "
        + ("Two replicas: the interactive load's (`BATCH_MAX_CONCURRENCY=0`, where the batch "
           "is made) and one running the batch's lines. " if shape.split else
           "One replica, taking the interactive load and running the batch's lines. ")
        + "Cores busy: gateway / engine / bench client / PostgreSQL and Redis; others: the "
        "rest of the machine (in the second before the phase).",
        "",
        "| interactive load | requests | req/s | TTFT p50 ms | TTFT p99 ms | TTFT max ms | "
        "gateway's TTFT p50 / p99 ms | gateway overhead p50 / p99 ms | KV admissions > 50 ms | "
        "refused or failed | cores busy | others |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_row(name, p) for name, p in r.phases.items()),
        "",
        "| figure | value |",
        "|---|---|",
        f"| TTFT p99 without the batch (before and after, pooled) | "
        f"{_p(baseline(r), 0.99):.1f} ms |",
        f"| TTFT p99 with batch / without (target ≤ {RATIO_TARGET}) | **{ratio(r):.2f}** |",
        f"| batch status, counts | {b.status}, {b.counts} |",
        f"| batch wall time from creation | {b.wall_s:.1f} s |",
        f"| batch lines/s | {b.lines / b.wall_s:.1f} |",
        f"| lines ended during the measured load | {b.during:,} ({ran}) |",
        f"| every line answered once, 200, no error file | {once} |",
        f"| lines shed (thinkgate_batch_lines_shed_total) | {b.shed:,.0f} |",
        f"| KV refusals (thinkgate_ratelimit_rejections_total kv_budget) | {b.kv_refused:,.0f} |",
        f"| engine peak KV usage: alone / with batch | {a.kv_usage:.0%} / {w.kv_usage:.0%} |",
        f"| engine peak running: alone / with batch | {a.running:.0f} / {w.running:.0f} |",
        f"| engine peak waiting: alone / with batch | {a.waiting:.0f} / {w.waiting:.0f} |",
        f"| engine preemptions | {b.preemptions:.0f} |",
        f"| gateway log: warnings / errors | {r.log_counts['warning']} / "
        f"{r.log_counts['error'] + r.log_counts['critical']} |",
    ]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=Shape.lines)
    parser.add_argument("--interactive-concurrency", type=int,
                        default=Shape.interactive_concurrency)  # fmt: skip
    parser.add_argument("--seconds", type=float, default=Shape.seconds)
    parser.add_argument("--settle", type=float, default=Shape.settle)
    parser.add_argument("--prompt-tokens", type=int, default=Shape.prompt_tokens)
    parser.add_argument("--interactive-max-tokens", type=int,
                        default=Shape.interactive_max_tokens)  # fmt: skip
    parser.add_argument("--batch-max-tokens", type=int, default=Shape.batch_max_tokens)
    parser.add_argument("--quiet-cores", type=float, default=Shape.quiet_cores)
    parser.add_argument("--quiet-wait", type=float, default=Shape.quiet_wait)
    parser.add_argument("--kv-capacity-tokens", type=int, default=Engine.kv_capacity_tokens)
    parser.add_argument("--ttft-ms", type=float, default=Engine.ttft_ms)
    parser.add_argument("--itl-ms", type=float, default=Engine.itl_ms)
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--split", action="store_true",
                        help="batch lines on a replica of their own (PostgreSQL only)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.split and args.store != "postgres":
        parser.error("--split needs --store postgres: replicas share the database")
    shape = Shape(lines=args.lines, interactive_concurrency=args.interactive_concurrency,
                  seconds=args.seconds, settle=args.settle, prompt_tokens=args.prompt_tokens,
                  interactive_max_tokens=args.interactive_max_tokens,
                  batch_max_tokens=args.batch_max_tokens, quiet_cores=args.quiet_cores,
                  quiet_wait=args.quiet_wait, split=args.split)  # fmt: skip
    engine = Engine(args.ttft_ms, args.itl_ms, args.kv_capacity_tokens)
    result = asyncio.run(run(shape, engine, args.store))
    for line in result.log_first:
        _say(f"gateway log: {line}")
    for name, measured in result.phases.items():
        if measured.load.first_refusal is not None:
            _say(f"first interactive refusal ({name}): {measured.load.first_refusal}")
    print(table(result, shape, engine))
    met = result.batch.checked is not None and result.batch.checked.exactly_once
    return 0 if met and ratio(result) <= RATIO_TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
