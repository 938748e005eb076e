"""Routing on an agent trace: which policy finds the engines' prefix caches.

A seeded multi-turn agent trace: sessions share a system prompt and tool definitions (about
2k tokens), and each turn appends a tool result, so a session's context grows from about 2k to
30k tokens; each turn asks ``deepseek-r1`` (reasoning, then an answer) for a few tokens. Four
simulated engines (``thinkgate sim``) keep a prefix cache as vLLM does (16-token blocks, LRU
eviction, KV events over ZMQ) and take ``--prefill-tokens-per-s`` per uncached prompt token
before the first, so a cache hit shows as a shorter time to first token.

Policies, side by side in one run, each on fresh engines (``/reset_prefix_cache``) and a fresh
router:

- ``round-robin``: vllm-router ``--policy round_robin``;
- ``least-loaded``: thinkgate ``ROUTING=least_loaded`` (before issue 41);
- ``session-hash``: thinkgate without events (``UPSTREAM_KV_EVENTS=off``), the session's key
  in ``x-session-id``: rendezvous hashing with bounded load;
- ``vllm-router``: vllm-router ``--policy cache_aware`` (its approximate radix tree);
- ``prefix``: thinkgate ``ROUTING=prefix``, the engines' events found by ``/kv_event_sources``;
- ``prefix x2``: two thinkgate replicas, each session's turns alternating between them.

Each session runs its turns in order with a think time between them (the agent's tool call,
100–600 ms, seeded), ``--concurrency`` sessions at a time: closed-loop clients without it make
least-loaded routing look sticky (a session's engine is the one its last answer just freed).
The simulators' prefill speed is shared by the requests prefilling at once, so piling onto one
engine costs time there, as on a real one.

Reported per policy: time to first token p50 and p99 (first reasoning or answer byte, as the
client sees it), sessions per second, the cache hit rate (the engines' cached tokens over
prompt tokens, from usage), and the busiest engine's prompt tokens over the mean.

``python -m bench.routing [--sessions 24] [--turns 6] [--concurrency 8]``; vllm-router from
``make bench-env`` (skipped, and said, without it). Results: ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.procs import THINKGATE, ServerProcess, Workdir, create_client_key, free_port
from gateway.cache import one_blas_thread

ROOT = Path(__file__).resolve().parents[1]
BENCH_VENV = ROOT / ".venv-bench"
MODEL = "deepseek-r1"
CHARS_PER_TOKEN = 4  # the simulator's tokenizer
WORDS = ("ledger", "merkle", "tile", "checkpoint", "tenant", "stream", "token", "engine",
         "cache", "prefix", "block", "replica", "witness", "record", "seal", "route")  # fmt: skip


@dataclass(frozen=True)
class Shape:
    sessions: int = 24
    turns: int = 32
    concurrency: int = 16
    start_tokens: int = 2_000
    end_tokens: int = 30_000
    max_tokens: int = 12
    seed: int = 41
    think_ms: tuple[float, float] = (100.0, 600.0)  # the agent's tool call between turns


def _text(rng: random.Random, tokens: int) -> str:
    words: list[str] = []
    size = 0
    while size < tokens * CHARS_PER_TOKEN:
        word = rng.choice(WORDS) + str(rng.randrange(1000))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def trace(shape: Shape) -> list[list[list[dict[str, Any]]]]:
    """Per session, per turn: the messages sent (each turn the previous turn's plus one)."""
    rng = random.Random(shape.seed)
    system = "You are a coding agent. Tools: " + _text(rng, shape.start_tokens - 200)
    step = (shape.end_tokens - shape.start_tokens) // max(shape.turns - 1, 1)
    sessions = []
    for index in range(shape.sessions):
        history: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {index}: " + _text(rng, 150)},
        ]
        turns = [list(history)]
        for turn in range(1, shape.turns):
            result = "Tool result: " + _text(rng, step)
            history += [{"role": "assistant", "content": f"Calling a tool, step {turn}."},
                        {"role": "user", "content": result}]  # fmt: skip
            turns.append(list(history))
        sessions.append(turns)
    return sessions


@dataclass
class Measured:
    ttft: list[float] = field(default_factory=list)
    prompt: int = 0
    cached: int = 0
    failed: int = 0


async def _turn(client: httpx.AsyncClient, url: str, key: str, session: str,
                messages: list[dict[str, Any]], shape: Shape, out: Measured) -> None:  # fmt: skip
    body = {"model": MODEL, "messages": messages, "max_tokens": shape.max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {
        "authorization": f"Bearer {key}",
        "x-session-id": session,
        "content-type": "application/json",
    }
    started, first = time.perf_counter(), None
    async with client.stream("POST", f"{url}/v1/chat/completions", content=orjson.dumps(body),
                             headers=headers) as response:  # fmt: skip
        if response.status_code != 200:
            out.failed += 1
            first_failure = out.failed == 1
            text = (await response.aread())[:300]
            if first_failure:
                print(f"{url}: {response.status_code} {text!r}", file=sys.stderr)
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = orjson.loads(line[6:])
            delta = (event.get("choices") or [{}])[0].get("delta") or {}
            if first is None and any(delta.get(k) for k in ("content", "reasoning_content",
                                                             "reasoning")):  # fmt: skip
                first = time.perf_counter() - started
            usage = event.get("usage")
            if usage:
                out.prompt += usage.get("prompt_tokens") or 0
                out.cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    if first is not None:
        out.ttft.append(first)


async def drive(urls: Sequence[tuple[str, str]], shape: Shape) -> tuple[Measured, float]:
    """Every session's turns in order, ``concurrency`` sessions at a time; a session's turn
    ``i`` goes to ``urls[i % len(urls)]`` (two replicas: alternating)."""
    sessions, out = trace(shape), Measured()
    gate = asyncio.Semaphore(shape.concurrency)
    limits = httpx.Limits(max_connections=shape.concurrency * 2)

    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def session(index: int) -> None:
            pauses = random.Random(shape.seed + index)
            async with gate:
                for turn, messages in enumerate(sessions[index]):
                    if turn:  # the agent runs its tool before the next turn
                        await asyncio.sleep(pauses.uniform(*shape.think_ms) / 1000)
                    url, key = urls[turn % len(urls)]
                    await _turn(client, url, key, f"s{index}", messages, shape, out)

        started = time.perf_counter()
        await asyncio.gather(*(session(i) for i in range(len(sessions))))
        return out, time.perf_counter() - started


# -- the engines and the routers --------------------------------------------------------------


def start_sims(work: Workdir, count: int, prefill: float, capacity: int) -> list[ServerProcess]:
    sims = []
    for _ in range(count):
        port = free_port()
        argv = [THINKGATE, "sim", "--port", str(port), "--ttft-ms", "20", "--itl-ms", "5",
                "--block-size", "16", "--kv-capacity-tokens", str(capacity),
                "--prefill-tokens-per-s", str(prefill), "--kv-events", "tcp://127.0.0.1:0",
                "--kv-events-replay", "tcp://127.0.0.1:0"]  # fmt: skip
        sims.append(work.spawn(f"sim-{port}", argv, work.env, port, "/health"))
    for sim in sims:
        sim.wait_ready()
    return sims


def start_thinkgate(work: Workdir, sims: Sequence[ServerProcess], **env: str) -> ServerProcess:
    port = free_port()
    upstreams = ",".join(s.base_url for s in sims)
    environment = {**work.env, "THINKGATE_UPSTREAMS": upstreams, **env}
    argv = [THINKGATE, "serve", "--port", str(port), "--workers", "1"]
    server = work.spawn(f"thinkgate-{port}", argv, environment, port, "/healthz")
    server.wait_ready()
    return server


def start_vllm_router(work: Workdir, sims: Sequence[ServerProcess], policy: str) -> ServerProcess:
    port = free_port()
    argv = [str(BENCH_VENV / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *(s.url for s in sims), "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--log-level", "warning"]  # fmt: skip
    server = work.spawn(f"vllm-router-{policy}", argv, work.env, port, "/health")
    server.wait_ready()
    return server


async def _engine_prompt_tokens(sims: Sequence[ServerProcess]) -> list[float]:
    async with httpx.AsyncClient(timeout=10) as client:
        texts = [(await client.get(f"{s.url}/metrics")).text for s in sims]
    found = []
    for text in texts:
        match = re.search(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)$", text, re.M)
        found.append(float(match.group(1)) if match else 0.0)
    return found


async def _decisions(routers: Sequence[ServerProcess]) -> list[dict[str, float]]:
    """Each thinkgate replica's ``thinkgate_routing_decisions_total`` by reason."""
    found = []
    async with httpx.AsyncClient(timeout=10) as client:
        for router in routers:
            text = (await client.get(f"{router.url}/metrics")).text
            pattern = r'^thinkgate_routing_decisions_total\{reason="(\w+)"\} (\S+)$'
            found.append({m[0]: float(m[1]) for m in re.findall(pattern, text, re.M)})
    return found


async def _reset(sims: Sequence[ServerProcess]) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        for sim in sims:
            (await client.post(f"{sim.url}/reset_prefix_cache")).raise_for_status()


@dataclass(frozen=True)
class Row:
    policy: str
    ttft_p50_ms: float
    ttft_p99_ms: float
    sessions_per_s: float
    hit_rate: float
    busiest_over_mean: float
    failed: int


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000 if ordered else 0.0


async def measure(policy: str, urls: Sequence[tuple[str, str]], sims: Sequence[ServerProcess],
                  shape: Shape) -> Row:  # fmt: skip
    await _reset(sims)
    before = await _engine_prompt_tokens(sims)
    out, wall = await drive(urls, shape)
    after = await _engine_prompt_tokens(sims)
    load = [b - a for a, b in zip(before, after, strict=True)]
    mean = statistics.mean(load) or 1.0
    return Row(policy, _p(out.ttft, 0.5), _p(out.ttft, 0.99), shape.sessions / wall,
               out.cached / max(out.prompt, 1), max(load) / mean, out.failed)  # fmt: skip


def table(rows: Sequence[Row], baseline: str = "least-loaded") -> str:
    base = next((r for r in rows if r.policy == baseline), None)
    lines = ["| policy | TTFT p50 ms | TTFT p99 ms | sessions/s | cache hit rate | "
             "busiest / mean | p50 × least-loaded | failed |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        ratio = f"{r.ttft_p50_ms / base.ttft_p50_ms:.2f}" if base and base.ttft_p50_ms else ""
        lines.append(f"| {r.policy} | {r.ttft_p50_ms:.0f} | {r.ttft_p99_ms:.0f} | "
                     f"{r.sessions_per_s:.2f} | {r.hit_rate:.1%} | {r.busiest_over_mean:.2f} | "
                     f"{ratio} | {r.failed} |")  # fmt: skip
    return "\n".join(lines)


async def run(shape: Shape, prefill: float, capacity: int) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tg-routing-") as tmp:
        work = Workdir(Path(tmp))
        key = create_client_key(work)
        sims = start_sims(work, 4, prefill, capacity)
        started: list[ServerProcess] = list(sims)
        try:
            plans: list[tuple[str, dict[str, str] | str, int]] = [
                ("least-loaded", {"THINKGATE_ROUTING": "least_loaded"}, 1),
                ("session-hash", {"THINKGATE_UPSTREAM_KV_EVENTS": "off,off,off,off"}, 1),
                ("prefix", {"THINKGATE_ROUTING": "prefix"}, 1),
                ("prefix x2", {"THINKGATE_ROUTING": "prefix"}, 2),
            ]
            if (BENCH_VENV / "bin" / "vllm-router").exists():
                plans = [("round-robin", "round_robin", 1), *plans[:2],
                         ("vllm-router", "cache_aware", 1), *plans[2:]]  # fmt: skip
            else:
                print("vllm-router missing (make bench-env): its rows are left out",
                      file=sys.stderr)  # fmt: skip
            for policy, how, replicas in plans:
                if isinstance(how, str):
                    routers = [start_vllm_router(work, sims, how)]
                    urls = [(routers[0].url, "unused")]
                else:
                    routers = [start_thinkgate(work, sims, **how) for _ in range(replicas)]
                    urls = [(r.url, key) for r in routers]
                started += routers
                try:
                    await _warm(urls, sims)
                    rows.append(await measure(policy, urls, sims, shape))
                    print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
                    if not isinstance(how, str):
                        print(f"  routed by: {await _decisions(routers)}", file=sys.stderr)
                finally:
                    for router in routers:
                        router.stop()
        finally:
            for server in started:
                server.stop()
    return rows


async def _warm(urls: Sequence[tuple[str, str]], sims: Sequence[ServerProcess]) -> None:
    """One small request through each router, then wait until thinkgate's routers have found
    every engine's events (they ask each engine at start)."""
    async with httpx.AsyncClient(timeout=30) as client:
        for url, key in urls:
            body = {"model": MODEL, "max_tokens": 1,
                    "messages": [{"role": "user", "content": "warm up"}]}  # fmt: skip
            response = await client.post(f"{url}/v1/chat/completions", json=body,
                                         headers={"authorization": f"Bearer {key}"})  # fmt: skip
            response.raise_for_status()
    await asyncio.sleep(1.5)  # the routers' first discovery round (every second) has run


# -- micro-benchmarks: routing one prompt, consuming events -------------------------------------


def micro_route(tokens: int = 30_000, engines: int = 4, rounds: int = 200) -> list[str]:
    """CPU µs to route a prompt whose token ids are known (as the gateway holds them: read from
    ``/tokenize``'s answer into an array): its blocks' keys and every engine's cached prefix,
    each engine holding a different share of it; and the reading of that answer."""
    one_blas_thread()  # as the gateway does before numpy's import
    import orjson

    from gateway.cache.blocks import prompt_keys, token_ids
    from gateway.cache.events import decode
    from gateway.cache.index import PrefixIndex
    from gateway.side.sim.prefix import PrefixCache

    rng = random.Random(7)
    ids = [rng.randrange(150_000) for _ in range(tokens)]
    answer = orjson.dumps({"count": tokens, "max_model_len": 32_768, "tokens": ids,
                           "token_strs": None})  # fmt: skip
    known = token_ids(answer)
    assert known is not None
    lines = []
    for size in (16, 128):
        index = PrefixIndex()
        for engine in range(engines):  # engine e holds the first (e + 1) / engines of it
            cache = PrefixCache(10**7, size)
            held = ids[: tokens * (engine + 1) // engines]
            found = cache.lookup(held, None)
            index.apply(f"e{engine}", decode(_batch(cache.acquire(found, held, None))))
        started = time.process_time()
        for _ in range(rounds):
            keys = prompt_keys(known, size)
            matched = [index.matched(f"e{e}", keys) for e in range(engines)]
        spent = (time.process_time() - started) / rounds * 1e6
        assert matched[-1] == len(keys)
        lines.append(f"| route a {tokens:,}-token prompt, {engines} engines, {size}-token "
                     f"blocks | {spent:,.0f} µs |")  # fmt: skip
    for name, read in (("token_ids", token_ids), ("orjson", orjson.loads)):
        started = time.process_time()
        for _ in range(rounds):
            read(answer)
        spent = (time.process_time() - started) / rounds * 1e6
        lines.append(f"| read `/tokenize`'s answer for {tokens:,} tokens ({name}) | "
                     f"{spent:,.0f} µs |")  # fmt: skip
    return lines


def _batch(events: list[dict[str, Any]]) -> bytes:
    """One published batch, as vLLM's publisher encodes it."""
    import msgpack

    return msgpack.packb([time.time(), events, 0])  # type: ignore[no-any-return]


def micro_consume(batches: int = 20_000, per_batch: int = 8) -> list[str]:
    """Events decoded and applied per second of CPU, as an engine publishes them: each step a
    batch of ``per_batch`` events, stores of new 16-token blocks chained on the last and
    removals of old ones."""
    one_blas_thread()  # as the gateway does before numpy's import
    from gateway.cache.events import decode
    from gateway.cache.index import PrefixIndex

    payloads, block, parent = [], 0, None
    for _ in range(batches):
        events = []
        for _ in range(per_batch // 2):
            block += 1
            events.append({"type": "BlockStored", "block_hashes": [block],
                           "parent_block_hash": parent, "token_ids": list(range(block, block + 16)),
                           "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None,
                           "extra_keys": [None], "group_idx": 0,
                           "kv_cache_spec_kind": "full_attention"})  # fmt: skip
            parent = block
            events.append({"type": "BlockRemoved", "block_hashes": [block - 1000],
                           "medium": "GPU", "group_idx": 0})  # fmt: skip
        payloads.append(_batch(events))
    index = PrefixIndex()
    started = time.process_time()
    for payload in payloads:
        index.apply("e", decode(payload))
    spent = time.process_time() - started
    rate = batches * per_batch / spent
    return [f"| consume KV events ({per_batch} per batch: stores and removals) | "
            f"{rate:,.0f} events/s of one core |"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=Shape.sessions)
    parser.add_argument("--turns", type=int, default=Shape.turns)
    parser.add_argument("--concurrency", type=int, default=Shape.concurrency)
    parser.add_argument("--prefill-tokens-per-s", type=float, default=20_000.0)
    parser.add_argument("--kv-capacity-tokens", type=int, default=200_000)
    parser.add_argument("--micro", action="store_true", help="the micro-benchmarks only")
    args = parser.parse_args(argv)
    if args.micro:
        print("\n".join(["| what | CPU |", "|---|---|", *micro_route(), *micro_consume()]))
        return 0
    shape = Shape(sessions=args.sessions, turns=args.turns, concurrency=args.concurrency)
    rows = asyncio.run(run(shape, args.prefill_tokens_per_s, args.kv_capacity_tokens))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
