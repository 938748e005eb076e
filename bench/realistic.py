"""``python -m bench.realistic``: the gateway as users run it, against a bare relay, in one run.

Recipe: a private work folder → the paced upstream (``bench.paced``: one event per write, and
at 10 ms one per read, as vLLM sends) → the systems in front of it: ``direct`` (no proxy),
``relay`` (``bench.relay``, nothing parsed: the baseline), ``thinkgate`` in the production
configuration (``ledger init``, strict ledger on SQLite, metrics, the access log, a key with
visible reasoning), ``thinkgate_pg`` (the same on PostgreSQL with Redis rate limits and KV
admission), with ``--before DIR`` the same two from another source tree (``@before``:
the code before a change, measured back to back), and two Rust gateways from the benchmark's
own environment (``bench.rust_gateways``: ``tensorzero``, which parses and re-emits every
chunk, and ``vllm-router``, which relays bytes; skipped, with a notice, when not installed) →
for each round, every cell against every system, the order rotated per round →
``bench/RESULTS.md``'s ``realistic`` section (medians over rounds), or stdout with
``--output -``.

Cells (``CELLS``): chat at c = 32 flat out, at c = 32, c = 1 (the added TTFT of a request's own
work, with no other stream to wait behind) and c = 128 with 10 ms between tokens,
three-chunk answers at c = 32 (the per-request cost), two worker processes on PostgreSQL +
Redis at c = 256 paced (``thinkgate_pg×2``, against direct: scaling out; with ``--pg``), the
same gateway with ``bench/pii.yaml``'s guardrail policy at c = 32 paced (``thinkgate+pii``,
against ``thinkgate``: what scanning every chunk costs; with ``--before``, the same pair from the
code before, ``thinkgate+pii@before`` with the same policy file), and the
Responses, Messages and legacy completions endpoints paced at c = 32. CPU is what the proxy
process (its worker processes, summed) ran in the window (``procs.CpuMeter``) per chunk the
client received, or per request; RSS is the largest worker's; ratios are against the relay of
the same round; added TTFT against direct of the same round. After the rounds, each thinkgate's
``ledger verify`` verdict is reported: one tree per deployment, however many workers wrote it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.cells import LoadPlan, drive
from bench.client import Api
from bench.loadgen import Context, LoadResult
from bench.procs import CpuMeter, ServerProcess, Workdir, free_port, pinned
from bench.rust_gateways import BENCH_VENV, PACKAGES, plan
from bench.rust_gateways import start as start_rust
from bench.sections import cpu_model, revision, write_section

RESULTS = Path(__file__).with_name("RESULTS.md")
ROOT = Path(__file__).resolve().parent.parent
RELAY_KEY = "relay-bench-key"
REDIS_DB = "redis://127.0.0.1:6379/13"
# The production configuration's (deploy/k8s/base/configmap.yaml): one checkpoint a second.
# THINKGATE_BENCH_CHECKPOINT_INTERVAL_MS=0 measures one per commit instead.
CHECKPOINT_INTERVAL_MS = os.environ.get("THINKGATE_BENCH_CHECKPOINT_INTERVAL_MS", "1000")
POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432"


@dataclass(frozen=True, slots=True)
class CellSpec:
    name: str
    model: str  # bench.paced.MODELS
    concurrency: int
    api: Api = "chat"
    per_request: bool = False  # the figure is CPU per request, not per chunk
    systems: tuple[str, ...] = ()  # () = every system
    # the load generator alone on a CPU of its own, the servers on the others (``procs.pinned``)
    pin: bool = False
    context: Context = "short"  # the prompt: one question, or an agent's (``loadgen``)


# The Rust gateways (bench.rust_gateways) speak chat only: they take part in the chat cells
# open to every system. The endpoints are compared per request (the same 61 upstream tokens
# each): a client of the legacy completions gets no reasoning, so fewer chunks for the same work.
ENDPOINT_SYSTEMS = ("thinkgate", "thinkgate@before")
CHAT_PER_REQUEST = "chat, c=32, 10 ms"
AGENT_CHAT = "c=8, agent context, 3-chunk answers"  # an endpoint's agent cell is against it
# Scaling out: two worker processes on PostgreSQL + Redis against the upstream itself.
TWO_WORKERS = "thinkgate_pg×2"
# The guardrails' cost: the same gateway with bench/pii.yaml's policy over reasoning and answer
# (the paced text holds no match: what every chunk pays for being scanned).
PII = "thinkgate+pii"
PII_FILE = Path(__file__).with_name("pii.yaml")
PII_BEFORE = f"{PII}@before"  # with --before: the policy's cost in the code before the change
EXTRA_SYSTEMS = (TWO_WORKERS, PII, PII_BEFORE)  # only in the cells that name them
CELLS = (
    CellSpec("c=32, flat out", "bench-flat", 32),
    CellSpec("c=32, 10 ms", "bench-paced", 32),
    CellSpec("c=1, 10 ms", "bench-paced", 1),  # one stream: the added TTFT without queueing
    CellSpec("c=128, 10 ms", "bench-paced", 128),
    CellSpec("c=32, 3-chunk answers", "bench-short", 32, per_request=True),
    # an agent's growing context: what a request's own work costs when its body is 150 kB
    CellSpec(AGENT_CHAT, "bench-short", 8, per_request=True, context="agent"),
    # the same context through Anthropic's Messages API: Claude Code's requests
    CellSpec(
        "messages, c=8, agent context, 3-chunk answers",
        "bench-short",
        8,
        api="messages",
        per_request=True,
        systems=ENDPOINT_SYSTEMS,
        context="agent",
    ),
    CellSpec(
        "c=256, 10 ms, 2 workers", "bench-paced", 256, systems=("direct", TWO_WORKERS), pin=True
    ),
    CellSpec(
        "c=32, 10 ms, pii policy",
        "bench-paced",
        32,
        systems=("thinkgate", PII, "thinkgate@before", PII_BEFORE),
    ),
    CellSpec(CHAT_PER_REQUEST, "bench-paced", 32, per_request=True, systems=ENDPOINT_SYSTEMS),
    CellSpec(
        "responses, c=32, 10 ms",
        "bench-paced",
        32,
        api="responses",
        per_request=True,
        systems=ENDPOINT_SYSTEMS,
    ),
    CellSpec(
        "messages, c=32, 10 ms",
        "bench-paced",
        32,
        api="messages",
        per_request=True,
        systems=ENDPOINT_SYSTEMS,
    ),
    CellSpec(
        "completions, c=32, 10 ms",
        "bench-paced",
        32,
        api="completions",
        per_request=True,
        systems=ENDPOINT_SYSTEMS,
    ),
)


@dataclass(frozen=True, slots=True)
class System:
    name: str
    server: ServerProcess | None  # None: direct (the upstream itself)
    base_url: str
    key: str
    model_prefix: str = ""  # before bench.paced's model name (TensorZero's model_name::)
    # thinkgate's: the CLI and its environment, for ``ledger verify`` after the run
    cli_env: tuple[Path, dict[str, str]] | None = None


@dataclass(frozen=True, slots=True)
class Measured:
    cell: str
    system: str
    round: int
    load: LoadResult
    cpu_s: float | None
    rss: int | None

    def cost_us(self, per_request: bool) -> float:
        count = self.load.requests if per_request else self.load.chunks
        return float("nan") if self.cpu_s is None or not count else self.cpu_s / count * 1e6


def start_upstream(work: Workdir) -> ServerProcess:
    port = free_port()
    env = {**work.env, "PYTHONPATH": str(ROOT)}
    server = work.spawn("paced", [sys.executable, "-m", "bench.paced", "--port", str(port)],
                        env, port, "/health")  # fmt: skip
    server.wait_ready()
    return server


def start_relay(work: Workdir, upstream: ServerProcess) -> System:
    port = free_port()
    argv = [sys.executable, "-m", "bench.relay", "--port", str(port), "--upstream",
            upstream.base_url, "--key", RELAY_KEY]  # fmt: skip
    server = work.spawn("relay", argv, {**work.env, "PYTHONPATH": str(ROOT)}, port, "/health")
    server.wait_ready()
    return System("relay", server, server.base_url, RELAY_KEY)


def start_thinkgate(work: Workdir, upstream: ServerProcess, name: str, tree: Path,
                    workers: int = 1, guardrails: Path | None = None,
                    serve_env: dict[str, str] | None = None) -> System:  # fmt: skip
    """thinkgate from ``tree`` in the production configuration; ``_pg`` names PostgreSQL with
    Redis (rate limits and the KV budget); ``workers`` worker processes (``serve --workers``);
    ``serve_env``: more of the environment, for the serving process alone."""
    home = work.path / name.replace("@", "-")
    home.mkdir()
    env = {k: v for k, v in work.env.items() if not k.startswith("THINKGATE_")}
    env.update(PYTHONPATH=str(tree), THINKGATE_HOME=str(home), THINKGATE_AUDIT_MODE="strict",
               THINKGATE_LOG_LEVEL="info", THINKGATE_LOG_FORMAT="json",
               THINKGATE_CHECKPOINT_INTERVAL_MS=CHECKPOINT_INTERVAL_MS)  # fmt: skip
    if guardrails is not None:
        env["THINKGATE_GUARDRAILS_FILE"] = str(guardrails)
    if "_pg" in name:
        database = f"bench_{os.getpid()}_{name.replace('@', '_').replace('×', '_x')}"
        psql(f"CREATE DATABASE {database}")
        env.update(THINKGATE_DATABASE_URL=f"{POSTGRES}/{database}", THINKGATE_REDIS_URL=REDIS_DB,
                   THINKGATE_KV_CAPACITY_TOKENS="100000000")  # fmt: skip
    else:
        env["THINKGATE_DATABASE_URL"] = f"sqlite+aiosqlite:///{home / 'thinkgate.db'}"
    cli = [sys.executable, "-m", "gateway.cli"]
    subprocess.run([*cli, "ledger", "init"], cwd=home, env=env, check=True, capture_output=True)
    limits = ["--rpm", "100000000", "--tpm", "2000000000"] if "_pg" in name else []
    made = subprocess.run([*cli, "keys", "create", "--tenant", "bench", "--role", "client",
                           "--reasoning", "visible", *limits], cwd=home, env=env, check=True,
                          capture_output=True)  # fmt: skip
    key = made.stdout.decode().strip().splitlines()[-1]
    port = free_port()
    argv = [*cli, "serve", "--upstream", upstream.base_url, "--port", str(port), "--workers",
            str(workers)]  # fmt: skip
    server = work.spawn(name, argv, {**env, **(serve_env or {})}, port, "/healthz")
    server.wait_ready()
    return System(name, server, server.base_url, key, cli_env=(home, env))


def verify_ledger(system: System) -> str:
    """``ledger verify``'s verdict on the system's ledger after the run (its last line)."""
    assert system.cli_env is not None
    home, env = system.cli_env
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "ledger", "verify"], cwd=home,
                          env=env, capture_output=True, text=True)  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines() or ["(no output)"]
    return f"exit {done.returncode}: {lines[-1]}"


def psql(sql: str) -> str:
    done = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc", sql],
                          check=True, capture_output=True)  # fmt: skip
    return done.stdout.decode()


def drop_databases() -> None:
    for database in psql("SELECT datname FROM pg_database").split():
        if database.startswith(f"bench_{os.getpid()}_"):
            psql(f"DROP DATABASE {database} WITH (FORCE)")


def start_systems(work: Workdir, upstream: ServerProcess, args: argparse.Namespace,
                  started: list[ServerProcess]) -> list[System]:  # fmt: skip
    """Every system in front of ``upstream``, each server added to ``started`` as it comes
    up (so that a later failure still stops it)."""
    systems = [System("direct", None, upstream.base_url, "")]

    def add(system: System) -> None:
        systems.append(system)
        if system.server is not None:
            started.append(system.server)

    add(start_relay(work, upstream))
    if args.pg and (not args.cells or "c=256, 10 ms, 2 workers" in args.cells):
        add(start_thinkgate(work, upstream, TWO_WORKERS, ROOT, workers=2))
    if not args.cells or "c=32, 10 ms, pii policy" in args.cells:
        add(start_thinkgate(work, upstream, PII, ROOT, guardrails=PII_FILE))
        if args.before is not None:  # the same policy file, read by the code before
            add(start_thinkgate(work, upstream, PII_BEFORE, args.before.resolve(),
                                guardrails=PII_FILE))  # fmt: skip
    for name in ["thinkgate", "thinkgate_pg"] if args.pg else ["thinkgate"]:
        add(start_thinkgate(work, upstream, name, ROOT))
        if args.before is not None:
            add(start_thinkgate(work, upstream, f"{name}@before", args.before.resolve()))
    names, notice = plan(args.bench_venv)
    if notice is not None:
        print(notice, file=sys.stderr, flush=True)
    for name in names:
        rust = start_rust(name, work, upstream, args.bench_venv)
        add(System(rust.name, rust.server, rust.base_url, "", rust.model_prefix))
    return systems


def measure(cell: CellSpec, system: System, round_: int, duration: float, warmup: float,
            upstream: ServerProcess) -> Measured:  # fmt: skip
    if not cell.pin:
        return _measure(cell, system, round_, duration, warmup)
    servers = [upstream.process] + ([system.server.process] if system.server else [])
    with pinned(psutil.Process(), servers):
        return _measure(cell, system, round_, duration, warmup)


def _measure(
    cell: CellSpec, system: System, round_: int, duration: float, warmup: float
) -> Measured:
    processes = {"client": psutil.Process()}
    if system.server is not None:  # the server, or its worker processes under a supervisor
        workers = system.server.process.children() or [system.server.process]
        processes.update({f"proxy{i}": p for i, p in enumerate(workers)})
    meter = CpuMeter(processes)
    plan = LoadPlan(system.key, duration, warmup, max_tokens=512,
                    model=system.model_prefix + cell.model)  # fmt: skip
    load = drive(plan, system.base_url, cell.concurrency, meter, api=cell.api,
                 context=cell.context)  # fmt: skip
    proxies = [name for name in processes if name.startswith("proxy")]
    rss = max((processes[n].memory_info().rss for n in proxies), default=None)  # per process
    cpu = sum(meter.cpu_s[n] for n in proxies) if proxies else None
    return Measured(cell.name, system.name, round_, load, cpu, rss)


def quiet(upstream: ServerProcess, seconds: float = 0.5) -> None:
    """Let the previous run's aborted streams drain before the next one starts."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if upstream.process.cpu_percent(interval=seconds) < 5:
            return


def render(runs: list[Measured], systems: list[str], rounds: int, measured: str) -> str:
    lines = [
        "## Realistic streams: the production configuration against a bare relay",
        "",
        f"Generated by `python -m bench.realistic` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "  # noqa: E501
        f"code at {measured}; {os.cpu_count()} CPUs ({cpu_model()}), Python {sys.version.split()[0]}; "  # noqa: E501
        f"{rounds} rounds, system order rotated per round, medians (min–max) over rounds.",
        "",
        "Upstream: `bench.paced` (one SSE event per write; at 10 ms one per read, as vLLM "
        "sends; 40 reasoning + 20 answer words paced, 150 + 50 flat out, each a token; the "
        "`</think>` event between, which thinkgate drops and a relay passes as a chunk, so "
        "thinkgate is charged per chunk for 60 of 61, 2 of 4 in the 3-chunk cell). `relay`: "
        "`bench.relay`, nothing parsed. `thinkgate`: `ledger init`, strict ledger on SQLite, "
        "metrics, JSON access log, a visible-reasoning key; `_pg`: PostgreSQL, Redis rate "
        "limits and KV admission. `@before`: the same from the code before this change. "
        f"`tensorzero`: TensorZero {PACKAGES['tensorzero'][1]}'s Rust gateway, embedded with "
        "no database, one OpenAI-provider model per upstream shape: it parses every chunk "
        f"and writes its own. `vllm-router`: vLLM's Rust router {PACKAGES['vllm-router'][1]}, "
        "the upstream its only worker (round robin): it relays the bytes, the floor of a "
        "compiled proxy.",
        "",
        "Endpoint cells compare CPU per request (the same 61 upstream tokens) with chat's: "
        "their `× relay` column is `× chat` of the same system and round.",
        "",
        "| cell | system | chunks/s | × direct | CPU µs per chunk (per request) | × relay | "
        "TTFT p50 ms | added TTFT p50 ms | added TTFT p99 ms | gap p50 ms | RSS MB | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in CELLS:
        here = [r for r in runs if r.cell == cell.name]
        if not here:
            continue
        for system in systems:
            mine = [r for r in here if r.system == system]
            if not mine:
                continue
            lines.append(_row(cell, system, mine, here, runs))
    return "\n".join(lines) + "\n"


def _row(cell: CellSpec, system: str, mine: list[Measured], here: list[Measured],
         runs: list[Measured]) -> str:  # fmt: skip
    def by_round(name: str, within: list[Measured] = here) -> dict[int, Measured]:
        return {r.round: r for r in within if r.system == name}

    direct, relay = by_round("direct"), by_round("relay")
    if cell.api != "chat":  # an endpoint: against chat's cost per request, same system
        chat = AGENT_CHAT if cell.context == "agent" else CHAT_PER_REQUEST
        relay = by_round(system, [r for r in runs if r.cell == chat])
    rate = [r.load.chunks_per_s for r in mine]
    ratio = [r.load.chunks_per_s / direct[r.round].load.chunks_per_s for r in mine
             if r.round in direct and direct[r.round].load.chunks_per_s]  # fmt: skip
    cost = [r.cost_us(cell.per_request) for r in mine]
    vs_relay = [r.cost_us(cell.per_request) / relay[r.round].cost_us(cell.per_request)
                for r in mine if r.round in relay and system != "direct"]  # fmt: skip
    ttft = [r.load.ttft.p50 * 1000 for r in mine]
    added = [(r.load.ttft.p50 - direct[r.round].load.ttft.p50) * 1000 for r in mine
             if r.round in direct]  # fmt: skip
    added99 = [(r.load.ttft.p99 - direct[r.round].load.ttft.p99) * 1000 for r in mine
               if r.round in direct]  # fmt: skip
    gap = [r.load.gap.p50 * 1000 for r in mine]
    rss = [r.rss / 2**20 for r in mine if r.rss is not None]
    errors = sum(r.load.errors for r in mine)
    unit = " /req" if cell.per_request else ""
    return (f"| {cell.name} | {system} | {_span(rate, '{:,.0f}')} | {_span(ratio, '{:.2f}')} | "
            f"{_span(cost, '{:,.1f}')}{unit if cost and system != 'direct' else ''} | "
            f"{_span(vs_relay, '{:.2f}')} | {_span(ttft, '{:.2f}')} | "
            f"{_span(added, '{:+.2f}') if system != 'direct' else ''} | "
            f"{_span(added99, '{:+.1f}') if system != 'direct' else ''} | {_span(gap, '{:.2f}')} | "
            f"{_span(rss, '{:.0f}')} | "
            f"{errors} |")  # fmt: skip


def _span(values: list[float], fmt: str) -> str:
    values = [v for v in values if v == v]  # NaN: not measured
    if not values:
        return ""
    middle = fmt.format(statistics.median(values))
    if len(values) == 1:
        return middle
    return f"{middle} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cells = [c for c in CELLS if not args.cells or c.name in args.cells]
    measured = revision(("gateway", "audit"))
    runs: list[Measured] = []
    started: list[ServerProcess] = []
    with tempfile.TemporaryDirectory(prefix="thinkgate-realistic-") as tmp:
        work = Workdir(Path(tmp))
        try:
            upstream = start_upstream(work)
            started.append(upstream)
            systems = start_systems(work, upstream, args, started)
            for round_ in range(args.rounds):
                for cell in cells:
                    chosen = [s for s in systems if (s.name in cell.systems if cell.systems
                                                     else s.name not in EXTRA_SYSTEMS)]  # fmt: skip
                    shift = round_ % len(chosen)
                    for system in chosen[shift:] + chosen[:shift]:
                        quiet(upstream)
                        run = measure(cell, system, round_, args.duration, args.warmup,
                                      upstream)  # fmt: skip
                        runs.append(run)
                        print(f"round {round_} {cell.name:28} {system.name:22} "
                              f"{run.load.chunks_per_s:9,.0f} chunks/s "
                              f"{run.cost_us(cell.per_request):8.1f} µs "
                              f"ttft {run.load.ttft.p50 * 1000:6.2f} ms err {run.load.errors}",
                              file=sys.stderr, flush=True)  # fmt: skip
            order = [s.name for s in systems]
            ran = {r.system for r in runs}
            verdicts = {s.name: verify_ledger(s) for s in systems
                        if s.cli_env is not None and s.name in ran}  # fmt: skip
        finally:
            for server in reversed(started):
                server.stop()
            if args.pg:
                drop_databases()
    report = (
        render(runs, order, args.rounds, measured)
        + "\n"
        + "\n".join(
            ["`ledger verify` after the run, per system:", ""]
            + [f"- `{name}`: {verdict}" for name, verdict in verdicts.items()]
        )
        + "\n"
    )
    if args.json is not None:
        args.json.write_text("\n".join(json.dumps(_flat(r)) for r in runs) + "\n")
    if args.output == "-":
        print(report)
    else:
        write_section(Path(args.output), "realistic", report)
        print(f"wrote the realistic section of {args.output}", file=sys.stderr)
    return 0


def _flat(run: Measured) -> dict[str, object]:
    return {"cell": run.cell, "system": run.system, "round": run.round,
            "chunks": run.load.chunks, "requests": run.load.requests,
            "elapsed_s": run.load.elapsed_s, "errors": run.load.errors,
            "ttft_p50_s": run.load.ttft.p50, "ttft_p99_s": run.load.ttft.p99,
            "gap_p50_s": run.load.gap.p50, "cpu_s": run.cpu_s, "rss": run.rss}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.realistic",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="window per run, s")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--before", type=Path, help="a source tree (a git worktree) to "
                        "measure as thinkgate@before, with the same virtualenv")  # fmt: skip
    parser.add_argument(
        "--pg",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also thinkgate_pg (PostgreSQL and Redis on 127.0.0.1)",
    )
    parser.add_argument("--cells", nargs="*", help="only these cells, by name")
    parser.add_argument("--bench-venv", type=Path, default=BENCH_VENV,
                        help="the environment with tensorzero and vllm-router "
                        "(a gateway not in it is skipped)")  # fmt: skip
    parser.add_argument("--output", default=str(RESULTS), help="'-': stdout")
    parser.add_argument("--json", type=Path, help="also every run as JSON lines")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
