"""Ledger benchmarks: append throughput, strict vs async latency, proof time, full verify.

``python -m bench.ledger [--db sqlite postgresql] [--records N] [--large N]``

- **append**: N completion records with 4 KiB bodies through ``Ledger.append`` in ``async``
  mode (sealing: HKDF + AES-GCM; hashing; sequencing; group commit), until all are committed;
  quoted with the cost of sealing alone (same records, no database) as the in-run baseline.
- **strict vs async**: 32 concurrent streams, each ~500 ms long (uniform ±50 %, so they end at
  independent moments as real streams do), then its record: the latency of ``append`` is what
  the client waits for ``[DONE]``, a durable commit in strict mode, an enqueue in async mode.
  Also reported, not judged: the saturated worst case, 32 appenders back to back.
- **gateway**: the same gateway process without a ledger, with ``async`` and with ``strict``
  recording, against one simulator (``bench/ledger_cost.py``): CPU per request and per chunk.
- **proof / verify**: a ledger of ``--large`` records (small bodies: proof and verify cost do
  not depend on body size beyond hashing, which ``append`` already measures), then 1,000
  inclusion proofs at random indexes and one full ``verify``.

Databases: SQLite in a temporary directory; PostgreSQL in a fresh database created from
``THINKGATE_TEST_DATABASE_URL`` and dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

from audit.crypto import FileKeyProvider
from audit.ledger import Ledger
from audit.note import NoteSigner, NoteVerifier, create_signing_key, load_signing_key
from audit.record import Body, Facts
from audit.sqlasync import AsyncEngine
from audit.verify import verify
from audit.writer import Mode
from bench import ledger_cost
from bench.procs import Workdir
from bench.sections import cpu_model, revision, write_section
from gateway.db import create_engine
from gateway.settings import Settings

ORIGIN = "bench.thinkgate/ledger"
APPEND_TARGET = {"sqlite": 5000.0, "postgresql": 2000.0}  # records/s, 4 KiB bodies
STRICT_TARGET_MS = 5.0  # added p50 at concurrency 32
PROOF_TARGET_MS = 5.0  # inclusion proof, 1,000,000 records (judged on p99)
VERIFY_TARGET_S = 120.0  # full verify, 1,000,000 records


@dataclass(frozen=True, slots=True)
class Finding:
    text: str
    target: str | None = None
    measured: str | None = None
    ok: bool | None = None


def facts(i: int) -> Facts:
    return Facts(kind="completion", tenant=f"tenant-{i % 8}", key_id="benchkey0001",
                 request_id=f"req_{i:012d}", created_at=time.time(),
                 model="deepseek-r1")  # fmt: skip


def body(size: int) -> Body:
    text = secrets.token_hex(size // 2)
    third = len(text) // 3
    return Body(messages=[{"role": "user", "content": text[:third]}], params={"max_tokens": 256},
                reasoning=(text[third : 2 * third],), content=(text[2 * third :],))  # fmt: skip


@contextlib.asynccontextmanager
async def database(kind: str, work: Path) -> AsyncIterator[str]:
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{work / 'ledger.db'}"
        return
    base = make_url(Settings().test_database_url)
    user, port = base.username or "postgres", base.port or 5432
    dsn = f"postgresql://{user}@{base.host}:{port}/{base.database}"
    name = f"tg_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@contextlib.asynccontextmanager
async def opened(url: str, work: Path, mode: Mode) -> AsyncIterator[tuple[Ledger, AsyncEngine]]:
    keys, signing = work / "keys.json", work / "signing.pem"
    if not keys.exists():
        FileKeyProvider.create(keys)
        create_signing_key(signing)
    engine = create_engine(url)
    signer = NoteSigner(ORIGIN, load_signing_key(signing))
    ledger = await Ledger.open(engine, FileKeyProvider.load(keys), signer, origin=ORIGIN,
                               spool_path=work / "spool.log", mode=mode)  # fmt: skip
    try:
        yield ledger, engine
    finally:
        await ledger.aclose()
        await engine.dispose()


async def append_many(ledger: Ledger, start: int, count: int, size: int) -> float:
    bodies = [body(size) for _ in range(64)]
    began = time.perf_counter()
    for first in range(start, start + count, 1000):
        last = min(first + 1000, start + count)
        await asyncio.gather(*(ledger.append(facts(i), bodies[i % 64]) for i in range(first, last)))
    return time.perf_counter() - began


async def seal_only(ledger: Ledger, count: int, size: int) -> float:
    bodies = [body(size) for _ in range(64)]
    began = time.perf_counter()
    for i in range(count):
        await ledger.seal(facts(i), bodies[i % 64])
    return time.perf_counter() - began


async def bench_append(url: str, work: Path, records: int) -> Finding:
    async with opened(url, work, "async") as (ledger, _):
        sealing = await seal_only(ledger, min(records, 5000), 4096) / min(records, 5000)
        began = time.perf_counter()
        await append_many(ledger, 0, records, 4096)
        await ledger.aclose()  # waits until every queued record is committed
        elapsed = time.perf_counter() - began
        batches = ledger.stats.batches
    rate = records / elapsed
    kind = make_url(url).get_backend_name()
    text = (
        f"append, 4 KiB bodies: {rate:,.0f} records/s ({records} records, {batches} commits); "
        f"sealing alone {1 / sealing:,.0f} records/s (append = "
        f"{sealing * rate:.2f}× the sealing-only rate)"
    )
    target = APPEND_TARGET.get(kind, 0.0)
    return Finding(text, f"append ≥ {target:,.0f} records/s ({kind}, 4 KiB bodies)",
                   f"{rate:,.0f} records/s", rate >= target)  # fmt: skip


async def latencies(ledger: Ledger, workers: int, each: int, stream_s: float) -> list[float]:
    """``workers`` concurrent streams, each ``stream_s`` long on average (uniform ±50 %, so
    streams end at independent moments, as real ones do), then its record: the latency of
    ``append`` is what the client waits for ``[DONE]``. ``stream_s`` 0: back to back."""
    out: list[float] = []
    payload = body(4096)
    rng = random.Random(11)

    async def worker(w: int) -> None:
        for i in range(each):
            if stream_s:
                await asyncio.sleep(stream_s * rng.uniform(0.5, 1.5))
            began = time.perf_counter()
            await ledger.append(facts(w * each + i), payload)
            out.append(time.perf_counter() - began)

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return out


async def bench_strict(url: str, work: Path, stream_s: float, workers: int = 32) -> Finding:
    each = 20 if stream_s else 60
    result = {}
    for mode in ("async", "strict"):
        async with opened(url, work, mode) as (ledger, _):
            await latencies(ledger, workers, 3, 0)  # warm-up: keys cached, pool open
            lat = sorted(await latencies(ledger, workers, each, stream_s))
        result[mode] = (statistics.median(lat) * 1e3, lat[int(len(lat) * 0.99)] * 1e3)
    added = result["strict"][0] - result["async"][0]
    load = f"streams of ~{stream_s * 1e3:.0f} ms" if stream_s else "back to back (saturated)"
    text = (
        f"end of stream at concurrency {workers}, {load}: strict p50 {result['strict'][0]:.2f} "
        f"ms (p99 {result['strict'][1]:.2f}), async p50 {result['async'][0]:.3f} ms "
        f"(p99 {result['async'][1]:.2f}); strict adds {added:.2f} ms p50"
    )
    if not stream_s:
        return Finding(text)  # the worst case, reported, not the target's condition
    kind = make_url(url).get_backend_name()
    return Finding(text, f"strict adds ≤ {STRICT_TARGET_MS:g} ms p50 at c = {workers} ({kind})",
                   f"+{added:.2f} ms", added <= STRICT_TARGET_MS)  # fmt: skip


async def bench_large(url: str, work: Path, size: int) -> list[Finding]:
    async with opened(url, work, "async") as (ledger, engine):
        filled = await append_many(ledger, 0, size, 256)
        await ledger.aclose()
        rng = random.Random(7)
        times = []
        for _ in range(1000):
            index = rng.randrange(size)
            began = time.perf_counter()
            await ledger.inclusion(index, size)
            times.append(time.perf_counter() - began)
        times.sort()
        began = time.perf_counter()
        report = await verify(engine, NoteVerifier(ledger.verifier_key()), ORIGIN)
        verified = time.perf_counter() - began
    kind = make_url(url).get_backend_name()
    p50, p99 = statistics.median(times) * 1e3, times[989] * 1e3
    judged = size >= 1_000_000
    return [
        Finding(f"fill {size:,} records (256 B bodies): {size / filled:,.0f} records/s"),
        Finding(
            f"inclusion proof in a {size:,}-record ledger: p50 {p50:.2f} ms, p99 {p99:.2f} ms "
            f"(1,000 random indexes)",
            f"inclusion proof ≤ {PROOF_TARGET_MS:g} ms, {size:,} records ({kind})",
            f"p99 {p99:.2f} ms",
            p99 <= PROOF_TARGET_MS if judged else None,
        ),
        Finding(
            f"full verify of {report.size:,} records, {report.checkpoints:,} checkpoints: "
            f"{verified:.1f} s ({report.size / verified:,.0f} records/s)",
            f"full verify ≤ {VERIFY_TARGET_S:g} s, {size:,} records ({kind})",
            f"{verified:.1f} s",
            verified <= VERIFY_TARGET_S if judged else None,
        ),
    ]


PARTS = ("append", "strict", "saturated", "large", "gateway")


async def run(kinds: list[str], parts: list[str], records: int, large: int) -> list[Finding]:
    findings: list[Finding] = []
    if "gateway" in parts:  # the default database (SQLite), as `thinkgate serve` runs
        with tempfile.TemporaryDirectory() as tmp:
            costs = await asyncio.to_thread(ledger_cost.run, Workdir(Path(tmp)))
        for line in ledger_cost.summary(costs):
            print(f"- {line}", flush=True)
            findings.append(Finding(line))
    parts = [p for p in parts if p != "gateway"]
    for kind in kinds:
        print(f"## {kind}", flush=True)
        for part in parts:
            if part == "large" and not large:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                async with database(kind, Path(tmp)) as url:
                    found = await _part(part, url, Path(tmp), records, large)
            found = [replace(f, text=f"{kind}: {f.text}") for f in found]
            for finding in found:
                print(f"- {finding.text}", flush=True)
            findings += found
    return findings


async def _part(part: str, url: str, work: Path, records: int, large: int) -> list[Finding]:
    if part == "append":
        return [await bench_append(url, work, records)]
    if part == "strict":
        return [await bench_strict(url, work, 0.5)]
    if part == "saturated":
        return [await bench_strict(url, work, 0)]
    return await bench_large(url, work, large)


def render(findings: list[Finding], kinds: list[str]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    code = revision(("audit", "bench/ledger.py"))
    machine = f"{os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}"
    lines = ["## The audit ledger", "", f"Generated by `python -m bench.ledger` on {when}, code "
             f"at {code}. Machine: {machine}.", "", *_method(), "",
             "| target | measured | result |", "| --- | --- | --- |"]  # fmt: skip
    for f in findings:
        if f.target is not None and f.ok is not None:
            lines.append(f"| {f.target} | {f.measured} | **{'pass' if f.ok else 'FAIL'}** |")
    lines += ["", "All figures (databases in the order run: " + ", ".join(kinds) + "):", ""]
    lines += [f"- {f.text}" for f in findings]
    return "\n".join(lines) + "\n"


def _method() -> list[str]:
    doc = (__doc__ or "").split("\n\n", 2)[2]
    return ["Method (from `bench/ledger.py`):", "", *doc.strip().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--large", type=int, default=0, help="e.g. 1000000")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    findings = asyncio.run(run(args.db, args.parts, args.records, args.large))
    if args.write:
        write_section(Path(__file__).with_name("RESULTS.md"), "ledger", render(findings, args.db))


if __name__ == "__main__":
    main()
