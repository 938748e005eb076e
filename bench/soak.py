"""Soak: many concurrent streams through one gateway process for minutes, then a check that it
left nothing behind.

``python -m bench.soak [--duration S] [--concurrency C] [--warmup S] [--write]`` (``make soak``;
not in CI: ``tests/e2e/test_soak.py`` runs a short version with the same checks).

- **Stack**: the simulator (``LAUNCH_SIM``: ``create_sim_app`` under uvicorn, for the error and
  drop rates that ``thinkgate sim`` does not expose) and ``thinkgate serve`` in front of it, each
  a process. The gateway records into a fresh PostgreSQL database (``soak_<random>``, dropped
  at the end; strict audit mode), shares limits and KV budget through Redis (db 13) and knows
  the engine's KV capacity (large: admission does not wait). The simulator is paced (TTFT
  300 ms, 40 ms per token) so that 128 streams take about a core of a shared 2-core machine.
- **Traffic**: C workers, each with a keep-alive connection, send streamed completions back to
  back (a raw HTTP/1.1 client). Each request draws its kind: *normal* (read to ``[DONE]``),
  *disconnect* (read 1 to 3 reasoning chunks, then close) or *limited* (a key with a small
  rpm: mostly 429, then the worker backs off). The simulator fails some requests: HTTP 500
  before the body, or a connection cut mid-stream. Each ``x-request-id`` is kept with what the
  client saw.
- **Phases**: warm-up traffic, rest, measured traffic, rest. A *rest* waits for no client
  connection, the simulator's keep-alive timeout + 2 s (idle upstream connections close) and
  an fd count unchanged over 3 reads 1 s apart; the gateway's RSS, fds and threads are read
  then (psutil): the first rest is the baseline, the second the end state. RSS, fds, threads
  and the KV leases in Redis are also sampled every ``sample_s``.
- **Checks** after the second rest: KV reservations zero (``thinkgate_kv_budget_tokens{state=
  "reserved"}`` and the lease set in Redis, read within the 30 s lease TTL of the last
  requests, so an unreleased lease would still be there); this run's Redis keys gone once
  expired (``--key-wait``; with 0, only that each expires); ledger records == requests the
  gateway took in (the client's ids of every stream that started and every failure after
  admission, compared as sets; the gateway's completion count; ``ledger_records_total``);
  then the gateway stops and ``thinkgate ledger verify`` must exit 0.
- asyncio tasks are **not** counted: the gateway exports no task count, and neither py-spy 0.4
  (thread stacks only) nor CPython 3.11 lists another process's tasks without code inside it.
  A leaked task holding a connection shows as fds; one holding a lease, in Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Literal
from urllib.parse import urlsplit
from urllib.request import urlopen

import asyncpg  # type: ignore[import-untyped]
import psutil
import redis
import uvloop
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from bench.procs import THINKGATE, CpuMeter, ServerProcess, Workdir, free_port
from bench.sections import cpu_model, revision, write_section
from gateway.settings import Settings

LAUNCH_SIM = """
import sys, uvicorn
from gateway.side.sim.app import SimConfig, create_sim_app
port, ttft, itl, error, drop, capacity, keepalive = sys.argv[1:]
config = SimConfig(ttft_ms=float(ttft), itl_ms=float(itl), error_rate=float(error),
                   drop_rate=float(drop), kv_capacity_tokens=int(capacity), seed=7)
uvicorn.run(create_sim_app(config), host="127.0.0.1", port=int(port), loop="uvloop",
            http="httptools", access_log=False, log_level="critical",
            timeout_keep_alive=int(keepalive))
"""
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
KV_CAPACITY = 1 << 22  # tokens, the simulator's and the gateway's: admission never waits
RSS_GROWTH_MAX = 0.05
FD_TOLERANCE = 3  # e.g. a pooled PostgreSQL or Redis connection more than at the baseline
REST_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 60.0
REFUSALS = frozenset({"no_healthy_upstream", "service_unavailable", "ledger_unavailable"})
LEDGER_STATUS = {"ok": "ok", "disconnected": "client_disconnected",
                 "stream_error": "upstream_error", "upstream_error": "upstream_error"}  # fmt: skip

Kind = Literal["normal", "disconnect", "limited"]
Outcome = Literal["ok", "disconnected", "stream_error", "upstream_error", "rate_limited",
                  "refused", "invalid", "transport", "timeout"]  # fmt: skip
Scraped = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True, slots=True)
class SoakPlan:
    duration_s: float = 600.0
    concurrency: int = 128
    warmup_s: float = 60.0
    sample_s: float = 5.0
    redis_url: str = DEFAULT_REDIS_URL
    database_url: str | None = None  # None: a fresh PostgreSQL database, dropped at the end
    ttft_ms: float = 300.0
    itl_ms: float = 40.0
    max_tokens: int = 48
    error_rate: float = 0.02  # the simulator's HTTP 500 before the body
    drop_rate: float = 0.02  # the simulator's connection cut mid-stream
    disconnect_share: float = 0.15
    limited_share: float = 0.15
    limited_rpm: int = 120
    backoff_s: float = 0.25  # after a refusal
    sim_keepalive_s: int = 5  # uvicorn's default, and vLLM's
    key_wait_s: float = 90.0  # for this run's Redis keys to expire (0: check their TTLs only)
    seed: int = 1


# -- the client: one keep-alive HTTP/1.1 connection per worker ----------------------------------


@dataclass(slots=True)
class Reply:
    status: int = 0
    request_id: str = ""
    outcome: Outcome = "transport"
    code: str = ""

    @property
    def recorded(self) -> bool:
        """Whether the gateway took the request in, so the ledger must hold it: every stream
        that started, and every failure after admission (refusals come before)."""
        return self.status == 200 or (self.status >= 500 and self.code not in REFUSALS)


class SSEWatch:
    """Follows one event stream: ``[DONE]``, an ``error`` event, reasoning chunks."""

    def __init__(self, stop_after: int) -> None:
        self.stop_after = stop_after  # reasoning chunks before hanging up; 0: never
        self.reasoning = 0
        self.done = False
        self.error = ""
        self._buffer = b""

    def feed(self, data: bytes) -> bool:
        """Take body bytes; ``True`` once the client wants to hang up."""
        *events, self._buffer = (self._buffer + data).split(b"\n\n")
        for event in events:
            if event.startswith(b"event: error"):
                self.error = _error_code(event.partition(b"data: ")[2]) or "error_event"
            elif event == b"data: [DONE]":
                self.done = True
            elif b'"reasoning_content":"' in event and b'"reasoning_content":""' not in event:
                self.reasoning += 1
        return 0 < self.stop_after <= self.reasoning and not self.done

    def outcome(self) -> tuple[Outcome, str]:
        if self.error:
            return "stream_error", self.error
        return ("ok", "") if self.done else ("transport", "no [DONE]")


def _error_code(body: bytes) -> str:
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return ""
    return str(error.get("code") or error.get("type") or "")


def _refusal(status: int, code: str) -> Outcome:
    fault: Outcome = "refused" if code in REFUSALS else "upstream_error"
    return "rate_limited" if status == 429 else fault if status >= 500 else "invalid"


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = raw.split("\r\n")
    pairs = (line.partition(":") for line in lines if line)
    return int(status_line.split(" ", 2)[1]), {k.strip().lower(): v.strip() for k, _, v in pairs}


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]
                ) -> AsyncGenerator[bytes, None]:  # fmt: skip
    """The body's bytes as they come: chunked or ``content-length`` (all uvicorn sends)."""
    if headers.get("transfer-encoding", "").lower() != "chunked":
        yield await reader.readexactly(int(headers.get("content-length", "0")))
        return
    while size := int((await reader.readline()).split(b";")[0], 16):
        yield (await reader.readexactly(size + 2))[:-2]
    await reader.readline()  # the blank line after the last chunk (no trailers)


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes,
                   stop_after: int) -> tuple[Reply, bool]:  # fmt: skip
    """Send one request and read its response; also whether the connection can carry another."""
    writer.write(request)
    status, headers = await _head(reader)
    reply = Reply(status, headers.get("x-request-id", ""))
    reusable = headers.get("connection", "").lower() != "close"
    if status != 200:
        reply.code = _error_code(b"".join([piece async for piece in _body(reader, headers)]))
        reply.outcome = _refusal(status, reply.code)
        return reply, reusable
    watch = SSEWatch(stop_after)
    async with contextlib.aclosing(_body(reader, headers)) as pieces:
        async for piece in pieces:
            if watch.feed(piece):
                reply.outcome = "disconnected"
                return reply, False
    reply.outcome, reply.code = watch.outcome()
    return reply, reusable and reply.outcome != "transport"


@dataclass(slots=True)
class Tally:
    """What the clients saw, over every phase."""

    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # "outcome: code", all but ok
    recorded: dict[str, Outcome] = field(default_factory=dict)  # request id -> outcome
    unnamed: int = 0  # taken in, yet without a request id (must stay 0)

    def add(self, reply: Reply) -> None:
        self.outcomes[reply.outcome] += 1
        if reply.outcome not in ("ok", "disconnected"):
            self.errors[f"{reply.outcome}: {reply.code or reply.status}"] += 1
        if reply.recorded and reply.request_id:
            self.recorded[reply.request_id] = reply.outcome
        elif reply.recorded:
            self.unnamed += 1


@dataclass(frozen=True, slots=True)
class Target:
    port: int
    requests: dict[Kind, tuple[bytes, ...]]  # 64 prompts per kind, ready to send

    @classmethod
    def make(cls, port: int, keys: dict[Kind, str], max_tokens: int) -> Target:
        return cls(port, {kind: tuple(_request(port, key, max_tokens, n) for n in range(64))
                          for kind, key in keys.items()})  # fmt: skip


def _request(port: int, key: str, max_tokens: int, n: int) -> bytes:
    body = json.dumps({"model": "deepseek-r1", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": f"Question {n}: think."}],
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _one(target: Target, conn: Conn | None, kind: Kind, stop_after: int,
               rng: random.Random) -> tuple[Reply, Conn | None]:  # fmt: skip
    """One request on ``conn`` (opened if ``None``); the connection to reuse, if any."""
    try:
        conn = conn or await asyncio.open_connection("127.0.0.1", target.port)
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            reply, reusable = await exchange(*conn, rng.choice(target.requests[kind]), stop_after)
    except TimeoutError:
        reply, reusable = Reply(outcome="timeout", code="client timeout"), False
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        reply, reusable = Reply(outcome="transport", code=type(exc).__name__), False
    if not reusable and conn is not None:
        conn[1].close()
    return reply, conn if reusable else None


async def _worker(target: Target, plan: SoakPlan, tally: Tally, stop: asyncio.Event,
                  index: int) -> None:  # fmt: skip
    rng = random.Random(plan.seed * 100_003 + index)
    conn: Conn | None = None
    try:
        while not stop.is_set():
            roll, stop_after = rng.random(), rng.randint(1, 3)
            kind: Kind = "disconnect" if roll < plan.disconnect_share else "normal"
            if plan.disconnect_share <= roll < plan.disconnect_share + plan.limited_share:
                kind = "limited"
            reply, conn = await _one(target, conn, kind, stop_after if kind == "disconnect"
                                     else 0, rng)  # fmt: skip
            tally.add(reply)
            if reply.outcome in ("rate_limited", "refused", "transport"):
                await asyncio.sleep(plan.backoff_s)
    finally:
        if conn is not None:
            conn[1].close()


async def drive(target: Target, plan: SoakPlan, tally: Tally, seconds: float) -> int:
    """``plan.concurrency`` workers for ``seconds``; each then ends the request it has in
    flight. Returns how many had to be cancelled (0 unless a response hung)."""
    stop = asyncio.Event()
    workers = [asyncio.create_task(_worker(target, plan, tally, stop, i))
               for i in range(plan.concurrency)]  # fmt: skip
    await asyncio.sleep(seconds)
    stop.set()
    _, pending = await asyncio.wait(workers, timeout=STOP_TIMEOUT_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return len(pending)


def run_traffic(target: Target, plan: SoakPlan, tally: Tally, seconds: float) -> int:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(drive(target, plan, tally, seconds))


# -- what the gateway holds ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the start of the warm-up
    phase: str
    rss: int
    fds: int
    threads: int
    leases: int  # KV leases held in Redis on the simulator


class Sampler(threading.Thread):
    """Reads the gateway's RSS, fds and threads, and the leases in Redis, every ``every_s``."""

    def __init__(self, process: psutil.Process, every_s: float, leases_key: str,
                 client: redis.Redis) -> None:  # fmt: skip
        super().__init__(name="soak-sampler", daemon=True)
        self.process, self.every_s, self.phase = process, every_s, "warm-up"
        self.samples: list[Sample] = []
        self._key, self._client, self._start = leases_key, client, time.monotonic()
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.every_s):
            self.samples.append(self.take())

    def take(self) -> Sample:
        with self.process.oneshot():
            rss, fds = self.process.memory_info().rss, self.process.num_fds()
            threads = self.process.num_threads()
        leases = int(self._client.zcard(self._key))
        return Sample(time.monotonic() - self._start, self.phase, rss, fds, threads, leases)

    def stop(self) -> None:
        self._stopped.set()
        self.join()


@dataclass(frozen=True, slots=True)
class Rest:
    sample: Sample
    waited_s: float
    quiet: bool  # False: REST_TIMEOUT_S passed first
    peers: dict[str, int]  # the gateway's TCP connections by peer


def _peers(process: psutil.Process, own_port: int, ports: dict[int, str]) -> dict[str, int]:
    found: Counter[str] = Counter()
    for conn in process.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == own_port:
            found["clients"] += 1
        elif conn.status != psutil.CONN_LISTEN and conn.raddr:
            found[ports.get(conn.raddr.port, f"port {conn.raddr.port}")] += 1
    return dict(sorted(found.items()))


def wait_for_rest(sampler: Sampler, own_port: int, ports: dict[int, str],
                  settle_s: float) -> Rest:  # fmt: skip
    """No client connected, ``settle_s`` passed and the fd count unchanged over 3 reads."""
    start, fds = time.monotonic(), [-1, -2, -3]
    while True:
        peers, sample = _peers(sampler.process, own_port, ports), sampler.take()
        fds, waited = [*fds[1:], sample.fds], time.monotonic() - start
        quiet = not peers.get("clients") and waited >= settle_s and len(set(fds)) == 1
        if quiet or waited > REST_TIMEOUT_S:
            return Rest(sample, waited, quiet, peers)
        time.sleep(1.0)


def scrape(url: str) -> Scraped:
    """The gateway's /metrics: (sample name, labels) -> value."""
    with urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def metric(scraped: Scraped, name: str, by: str = "", **labels: str) -> dict[str, float]:
    """``name``'s samples matching ``labels``, added up by the label ``by`` ("all": none)."""
    out: dict[str, float] = {}
    for (sample, pairs), value in scraped.items():
        have = dict(pairs)
        if sample == name and all(have.get(k) == v for k, v in labels.items()):
            out[have.get(by, "all")] = out.get(have.get(by, "all"), 0.0) + value
    return out


def redis_leftovers(client: redis.Redis, patterns: Sequence[str],
                    wait_s: float) -> tuple[dict[str, int], float]:  # fmt: skip
    """This run's keys left after waiting up to ``wait_s`` for none: key -> PTTL ms (-1: no
    expiry); and the wait."""
    start = time.monotonic()
    while True:
        names = sorted({k for p in patterns for k in client.scan_iter(match=p, count=1000)})
        if not names or time.monotonic() - start >= wait_s:
            break
        time.sleep(1.0)
    return {name.decode(): int(client.pttl(name)) for name in names}, time.monotonic() - start


# -- the database and the ledger -----------------------------------------------------------------


@contextlib.contextmanager
def database(given: str | None) -> Iterator[str]:
    """``given``, or a fresh PostgreSQL database beside ``TEST_DATABASE_URL``'s, then dropped."""
    if given is not None:
        yield given
        return
    base = make_url(Settings().test_database_url)
    name = f"soak_{secrets.token_hex(5)}"
    asyncio.run(_sql(base.render_as_string(hide_password=False), f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_sql(base.render_as_string(hide_password=False),
                         f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))  # fmt: skip


async def _sql(url: str, statement: str) -> list[tuple[str, str]]:
    """``statement`` in the database of the SQLAlchemy ``url``, by asyncpg; the rows."""
    parsed = make_url(url)
    conn = await asyncpg.connect(user=parsed.username, password=parsed.password,
                                 host=parsed.host, port=parsed.port, database=parsed.database,
                                 timeout=10)  # fmt: skip
    try:
        return [tuple(row) for row in await conn.fetch(statement)]
    finally:
        await conn.close()


def ledger_rows(url: str) -> dict[str, str]:
    """The completion records: request id -> status."""
    query = "SELECT request_id, status FROM ledger_entries WHERE kind = 'completion'"
    return dict(asyncio.run(_sql(url, query)))


@dataclass(frozen=True, slots=True)
class Ledger:
    rows: dict[str, str]  # request id -> status, once the gateway stopped
    completions: float  # the requests the gateway took in, by its own count
    committed: float  # its thinkgate_ledger_records_total
    verify_rc: int
    verify_output: str
    verify_s: float


def verify_ledger(work: Workdir, env: dict[str, str], db_url: str, scraped: Scraped) -> Ledger:
    rows, start = ledger_rows(db_url), time.monotonic()
    done = subprocess.run([THINKGATE, "ledger", "verify"], cwd=work.path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    completions = sum(metric(scraped, "thinkgate_request_duration_seconds_count").values())
    committed = sum(metric(scraped, "thinkgate_ledger_records_total").values())
    return Ledger(rows, completions, committed, done.returncode, lines[-1] if lines else "",
                  time.monotonic() - start)  # fmt: skip


# -- one run -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stack:
    work: Workdir
    env: dict[str, str]
    sim: ServerProcess
    gateway: ServerProcess
    tenants: tuple[str, str]

    @property
    def kv_prefix(self) -> str:  # ratelimit.kvbudget's keys for the simulator
        return f"thinkgate:kv:{{pool}}:{self.sim.base_url}:"

    @property
    def patterns(self) -> tuple[str, ...]:  # and ratelimit.limits' for the two tenants
        return (*(f"rl:{{{tenant}}}:*" for tenant in self.tenants), self.kv_prefix + "*")


def start_sim(work: Workdir, plan: SoakPlan) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-c", LAUNCH_SIM, str(port), str(plan.ttft_ms), str(plan.itl_ms),
            str(plan.error_rate), str(plan.drop_rate), str(KV_CAPACITY),
            str(plan.sim_keepalive_s)]  # fmt: skip
    env = {**work.env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    server = work.spawn(f"sim-{port}", argv, env, port, "/health")
    server.wait_ready()
    return server


def create_key(work: Workdir, env: dict[str, str], tenant: str, rpm: int = 0) -> str:
    argv = [THINKGATE, "keys", "create", "--tenant", tenant, "--role", "client",
            "--reasoning", "visible", *(["--rpm", str(rpm)] if rpm else [])]  # fmt: skip
    out = subprocess.run(argv, cwd=work.path, env=env, check=True, capture_output=True)
    return out.stdout.decode().strip().splitlines()[-1]


@contextlib.contextmanager
def soak_stack(work: Workdir, plan: SoakPlan, db_url: str) -> Iterator[tuple[Stack, Target]]:
    env = {**work.env, "THINKGATE_DATABASE_URL": db_url, "THINKGATE_REDIS_URL": plan.redis_url,
           "THINKGATE_KV_CAPACITY_TOKENS": str(KV_CAPACITY),
           "THINKGATE_LOG_LEVEL": "warning"}  # fmt: skip
    subprocess.run([THINKGATE, "ledger", "init"], cwd=work.path, env=env, check=True,
                   capture_output=True)  # fmt: skip
    tag = secrets.token_hex(4)
    tenants = (f"soak-{tag}", f"soak-{tag}-limited")
    normal = create_key(work, env, tenants[0])
    limited = create_key(work, env, tenants[1], plan.limited_rpm)
    keys: dict[Kind, str] = {"normal": normal, "disconnect": normal, "limited": limited}
    with start_sim(work, plan) as sim:
        port = free_port()
        argv = [THINKGATE, "serve", "--upstream", sim.base_url, "--port", str(port),
                "--workers", "1"]  # fmt: skip
        with work.spawn("gateway", argv, env, port, "/healthz") as gateway:
            gateway.wait_ready()
            yield Stack(work, env, sim, gateway, tenants), Target.make(port, keys, plan.max_tokens)


@dataclass(frozen=True, slots=True)
class Findings:
    plan: SoakPlan
    tally: Tally
    samples: list[Sample]
    rests: tuple[Rest, Rest]
    reserved: float  # the gateway's gauge after the second rest
    leases: int  # in Redis after the second rest
    keys: tuple[dict[str, int], float]  # Redis keys left (-> PTTL ms), after waiting so long
    ledger: Ledger
    counters: dict[str, dict[str, float]]  # the gateway's own, by title
    cpu_s: dict[str, float]  # in the measured window, by process
    load_s: float
    load_requests: int
    cancelled: int  # workers cancelled at a stop
    loadavg: tuple[float, float]  # the machine's 1-minute load average, start and end
    log: Counter[str]  # the gateway's log lines by level and message

    @property
    def status_mismatches(self) -> int:
        """Records whose status is not what their client saw (a disconnect recorded as ok)."""
        rows, seen = self.ledger.rows, self.tally.recorded
        return sum(rid in rows and LEDGER_STATUS.get(out, rows[rid]) != rows[rid]
                   for rid, out in seen.items())  # fmt: skip


def run(plan: SoakPlan) -> Findings:
    with TemporaryDirectory(prefix="tg-soak-") as tmp, database(plan.database_url) as db_url:
        work = Workdir(Path(tmp))
        with soak_stack(work, plan, db_url) as (stack, target):
            client = redis.Redis.from_url(plan.redis_url)
            try:
                return _soak(stack, target, plan, db_url, client)
            finally:
                client.close()


def _soak(stack: Stack, target: Target, plan: SoakPlan, db_url: str,
          client: redis.Redis) -> Findings:  # fmt: skip
    leases_key, gateway = stack.kv_prefix + "expiries", stack.gateway
    sampler = Sampler(gateway.process, plan.sample_s, leases_key, client)
    ports = {stack.sim.port: "simulator", make_url(db_url).port or 5432: "postgresql",
             urlsplit(plan.redis_url).port or 6379: "redis"}  # fmt: skip
    settle = plan.sim_keepalive_s + 2.0
    tally, loadavg, meter = Tally(), os.getloadavg()[0], CpuMeter(
        {"gateway": gateway.process, "simulator": stack.sim.process})  # fmt: skip
    sampler.start()
    try:
        cancelled = run_traffic(target, plan, tally, plan.warmup_s)
        sampler.phase = "rest"
        before = wait_for_rest(sampler, gateway.port, ports, settle)
        sampler.phase, started, warm = "load", time.monotonic(), tally.outcomes.total()
        meter.start()
        cancelled += run_traffic(target, plan, tally, plan.duration_s)
        meter.stop()
        load_s, sampler.phase = time.monotonic() - started, "rest"
        after = wait_for_rest(sampler, gateway.port, ports, settle)
    finally:
        sampler.stop()
    # A rest lasts longer than a commit (strict mode) and than the reserved gauge's refresh (1 s).
    scraped, leases = scrape(gateway.url), int(client.zcard(leases_key))
    reserved = sum(metric(scraped, "thinkgate_kv_budget_tokens", state="reserved").values())
    left = redis_leftovers(client, stack.patterns, plan.key_wait_s)
    gateway.stop()
    return Findings(plan, tally, sampler.samples, (before, after), reserved, leases, left,
                    verify_ledger(stack.work, stack.env, db_url, scraped), _counters(scraped),
                    meter.cpu_s, load_s, tally.outcomes.total() - warm, cancelled,
                    (loadavg, os.getloadavg()[0]), _log_lines(gateway.log))  # fmt: skip


def _counters(scraped: Scraped) -> dict[str, dict[str, float]]:
    return {"requests": metric(scraped, "thinkgate_requests_total", "status"),
            "upstream errors": metric(scraped, "thinkgate_upstream_errors_total", "kind"),
            "rate-limit rejections": metric(scraped, "thinkgate_ratelimit_rejections_total",
                                            "kind"),
            "client disconnects": metric(scraped, "thinkgate_client_disconnects_total"),
            "spooled records": metric(scraped, "thinkgate_ledger_spool_records")}  # fmt: skip


def _log_lines(log: Path) -> Counter[str]:
    """The gateway's log lines (JSON, warning and up) by level and message, URLs cut out."""
    found: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            entry = {"level": "unparsed", "msg": line}
        words = str(entry.get("msg", ""))[:80].split()
        found[f"{entry.get('level')}: {' '.join(w for w in words if '://' not in w)}"] += 1
    return found


# -- verdicts and the report --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    name: str
    criterion: str
    measured: str
    ok: bool


def rss_growth(samples: Sequence[Sample]) -> tuple[float, float, float]:
    """Under load: the median RSS of the first and of the last tenth of the samples (at least
    3 each when there are 6) and the growth between them."""
    load = [s.rss for s in samples if s.phase == "load"]
    if len(load) < 2:
        return math.nan, math.nan, math.nan
    n = max(min(3, len(load) // 2), len(load) // 10)
    first, last = statistics.median(load[:n]), statistics.median(load[-n:])
    return first, last, last / first - 1


def judge(found: Findings) -> list[Verdict]:
    return [_rss_verdict(found), _fd_verdict(found), _reserved_verdict(found),
            _keys_verdict(found), *_ledger_verdicts(found)]  # fmt: skip


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


def _rss_verdict(found: Findings) -> Verdict:
    before, after = (r.sample.rss for r in found.rests)
    first, last, load = rss_growth(found.samples)
    rest = after / before - 1
    text = (f"at rest {_mb(before)} → {_mb(after)} ({rest:+.1%}); under load, first tenth "
            f"{_mb(first)} → last tenth {_mb(last)} ({load:+.1%})")  # fmt: skip
    return Verdict("rss", f"RSS growth after warm-up < {RSS_GROWTH_MAX:.0%}, at rest and under "
                   "load", text, max(rest, load) < RSS_GROWTH_MAX)  # fmt: skip


def _fd_verdict(found: Findings) -> Verdict:
    before, after = found.rests
    text = (f"{before.sample.fds} → {after.sample.fds} fds, {before.sample.threads} → "
            f"{after.sample.threads} threads; TCP connections {before.peers} → {after.peers}; "
            f"rest reached after {before.waited_s:.0f} s and {after.waited_s:.0f} s")  # fmt: skip
    ok = (after.sample.fds <= before.sample.fds + FD_TOLERANCE and after.quiet and before.quiet
          and after.sample.threads <= before.sample.threads)  # fmt: skip
    return Verdict("fds", f"open fds (± {FD_TOLERANCE}) and threads back to the baseline at rest",
                   text, ok)  # fmt: skip


def _reserved_verdict(found: Findings) -> Verdict:
    peak = max((s.leases for s in found.samples), default=0)
    text = (f"gauge {found.reserved:g} tokens, {found.leases} leases in Redis (most "
            f"sampled under load: {peak}, for {found.plan.concurrency} streams)")  # fmt: skip
    return Verdict("reserved", "KV reservations zero once the streams end", text,
                   found.reserved == 0 and found.leases == 0)  # fmt: skip


def _keys_verdict(found: Findings) -> Verdict:
    (left, waited), wait = found.keys, found.plan.key_wait_s
    bad = [name for name, ttl in left.items() if ttl < 0 or wait > 0]  # waited: none may be left
    text = f"{len(left)} left after {waited:.0f} s" + (f": {', '.join(bad)}" if bad else "")
    text += f", each expiring within {max(left.values()) / 1000:.0f} s" if left and not bad else ""
    return Verdict("keys", f"this run's Redis keys gone once expired (waiting ≤ {wait:g} s)"
                   if wait > 0 else "this run's Redis keys all expire (not waited for)", text,
                   not bad)  # fmt: skip


def _ledger_verdicts(found: Findings) -> list[Verdict]:
    ledger, tally = found.ledger, found.tally
    expected, held = set(tally.recorded), set(ledger.rows)
    missing, unknown = sorted(expected - held), held - expected
    text = (f"{len(held):,} records; the client: {len(expected):,} requests taken in "
            f"({tally.unnamed} without an id); the gateway: {ledger.completions:,.0f} taken in, "
            f"{ledger.committed:,.0f} committed; missing {len(missing)}, unknown "
            f"{len(unknown)}; status ≠ what the client saw: {found.status_mismatches}")  # fmt: skip
    if missing:
        text += f" (first missing {missing[0]}: the client saw {tally.recorded[missing[0]]})"
    same = len(held) == len(expected) == ledger.completions == ledger.committed
    return [Verdict("records", "ledger records == requests (nothing lost)", text,
                    same and not missing and not unknown and not tally.unnamed),
            Verdict("verify", "`thinkgate ledger verify` exits 0", f"exit {ledger.verify_rc} "
                    f"in {ledger.verify_s:.1f} s: {ledger.verify_output}",
                    ledger.verify_rc == 0)]  # fmt: skip


def render(found: Findings, verdicts: Sequence[Verdict]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    code = revision(("gateway", "ratelimit", "audit", "bench/soak.py"))
    machine = (f"{os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
               f"1-minute load average {found.loadavg[0]:.2f} at the start and "
               f"{found.loadavg[1]:.2f} at the end (the machine is shared)")  # fmt: skip
    rows = [f"| {v.criterion} | {v.measured} | **{'pass' if v.ok else 'FAIL'}** |"
            for v in verdicts]  # fmt: skip
    return "\n".join(["## Soak", "", f"Generated by `python -m bench.soak` on {when}, code at "
                      f"{code}. Machine: {machine}.", "", _plan_line(found), "",
                      "| criterion | measured | result |", "| --- | --- | --- |", *rows, "",
                      *_traffic_lines(found), "", *_timeline(found.samples), ""])  # fmt: skip


def _plan_line(found: Findings) -> str:
    p, short = found.plan, "" if found.plan.duration_s >= 600 else " (**< the 600 s target**)"
    return (f"{p.concurrency} streams for {found.load_s:.0f} s{short} after a {p.warmup_s:g} s "
            f"warm-up. Simulator: TTFT {p.ttft_ms:g} ms, {p.itl_ms:g} ms per token, max_tokens "
            f"{p.max_tokens}, {p.error_rate:.0%} HTTP 500, {p.drop_rate:.0%} cut mid-stream. "
            f"Requests: {p.disconnect_share:.0%} hang up after 1–3 reasoning chunks, "
            f"{p.limited_share:.0%} on a key limited to {p.limited_rpm} rpm, the rest read to the "
            "end. Method: the docstring of `bench/soak.py`.")  # fmt: skip


def _traffic_lines(found: Findings) -> list[str]:
    t, load_s, cpu_s = found.tally, max(found.load_s, 1e-9), found.cpu_s
    outcomes = ", ".join(f"{k} {v:,}" for k, v in t.outcomes.most_common())
    errors = "; ".join(f"{k} × {v:,}" for k, v in t.errors.most_common(12)) or "none"
    counters = "; ".join(f"{title} " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(c.items()))
                         for title, c in found.counters.items() if c)  # fmt: skip
    per = max(found.load_requests, 1) / 1e3
    cpu = ", ".join(f"{name} {s / load_s:.0%} of a core ({s / per:.1f} ms per request)"
                    for name, s in cpu_s.items())  # fmt: skip
    return [f"- Requests: {t.outcomes.total():,} ({found.load_requests:,} in the measured window, "
            f"{found.load_requests / load_s:,.0f}/s); what the clients saw: {outcomes}.",
            f"- Errors by kind, client side: {errors}.",
            f"- The gateway's counters: {counters}.",
            f"- CPU in the measured window: {cpu}. Workers cancelled at a stop: {found.cancelled}.",
            "- The gateway's log (level warning): " + ("; ".join(
                f"{line} × {n:,}" for line, n in found.log.most_common(6)) or "empty") + ".",
            "- asyncio tasks are not counted (see the method): a leaked task holding a "
            "connection would show as fds, one holding a lease in Redis."]  # fmt: skip


def _timeline(samples: Sequence[Sample], rows: int = 12) -> list[str]:
    """A row per twelfth of the run: median RSS, fds and threads at its end, most leases."""
    span, lines = (samples[-1].t if samples else 0) / rows + 1e-9, []
    for i in range(rows):
        if part := [s for s in samples if i * span <= s.t < (i + 1) * span]:
            lines.append(f"| {part[0].t:.0f}–{part[-1].t:.0f} | "
                         f"{Counter(s.phase for s in part).most_common(1)[0][0]} | "
                         f"{_mb(statistics.median(s.rss for s in part))} | {part[-1].fds} | "
                         f"{part[-1].threads} | {max(s.leases for s in part)} |")  # fmt: skip
    return ["The gateway process over time (median RSS, fds and threads at the end of each "
            "row, most KV leases held):", "", "| t (s) | phase | RSS | fds | threads | leases |",
            "| --- | --- | --- | --- | --- | --- |", *lines]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds, before the baseline")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--key-wait", type=float, default=90.0,
                        help="seconds to wait for this run's Redis keys to expire")  # fmt: skip
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args(argv)
    found = run(SoakPlan(duration_s=args.duration, concurrency=args.concurrency,
                         warmup_s=args.warmup, redis_url=args.redis_url,
                         key_wait_s=args.key_wait))  # fmt: skip
    text = render(found, judge(found))
    print(text)
    if args.write:
        write_section(Path(__file__).with_name("RESULTS.md"), "soak", text)
    return text


if __name__ == "__main__":
    main()
