"""Ledger benchmarks: append throughput, strict vs async latency, proof time, full verify.

``python -m bench.ledger [--db sqlite postgresql] [--records N] [--large N]``

- **append**: N completion records with 4 KiB bodies through ``Ledger.append`` in ``async``
  mode (sealing: HKDF + AES-GCM; hashing; sequencing; group commit), until all are committed;
  quoted with the cost of sealing alone (same records, no database) as the in-run baseline.
- **strict vs async**: 32 concurrent appenders, each appending back to back: the latency of
  ``append`` is what strict mode adds before ``[DONE]``; in async mode it is an enqueue.
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
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.crypto import FileKeyProvider
from audit.ledger import Ledger
from audit.note import NoteSigner, NoteVerifier, create_signing_key, load_signing_key
from audit.record import Body, Facts
from audit.verify import verify
from audit.writer import Mode
from gateway.db import create_engine
from gateway.settings import Settings

ORIGIN = "bench.thinkgate/ledger"


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


async def bench_append(url: str, work: Path, records: int) -> str:
    async with opened(url, work, "async") as (ledger, _):
        sealing = await seal_only(ledger, min(records, 5000), 4096) / min(records, 5000)
        began = time.perf_counter()
        await append_many(ledger, 0, records, 4096)
        await ledger.aclose()  # waits until every queued record is committed
        elapsed = time.perf_counter() - began
        batches = ledger.stats.batches
    return (
        f"append, 4 KiB bodies: {records / elapsed:,.0f} records/s ({records} records, "
        f"{batches} commits); sealing alone {1 / sealing:,.0f} records/s "
        f"(append = {sealing * records / elapsed:.2f}× the sealing-only rate)"
    )


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


async def bench_strict(url: str, work: Path, stream_s: float, workers: int = 32) -> str:
    each = 20 if stream_s else 60
    result = {}
    for mode in ("async", "strict"):
        async with opened(url, work, mode) as (ledger, _):
            await latencies(ledger, workers, 3, 0)  # warm-up: keys cached, pool open
            lat = sorted(await latencies(ledger, workers, each, stream_s))
        result[mode] = (statistics.median(lat) * 1e3, lat[int(len(lat) * 0.99)] * 1e3)
    added = result["strict"][0] - result["async"][0]
    load = f"streams of ~{stream_s * 1e3:.0f} ms" if stream_s else "back to back (saturated)"
    return (
        f"end of stream at concurrency {workers}, {load}: strict p50 {result['strict'][0]:.2f} "
        f"ms (p99 {result['strict'][1]:.2f}), async p50 {result['async'][0]:.3f} ms "
        f"(p99 {result['async'][1]:.2f}); **strict adds {added:.2f} ms p50**"
    )


async def bench_large(url: str, work: Path, size: int) -> list[str]:
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
    return [
        f"fill {size:,} records (256 B bodies): {size / filled:,.0f} records/s",
        f"inclusion proof in a {size:,}-record ledger: p50 {statistics.median(times) * 1e3:.2f} "
        f"ms, p99 {times[989] * 1e3:.2f} ms (1,000 random indexes)",
        f"full verify of {report.size:,} records, {report.checkpoints:,} checkpoints: "
        f"{verified:.1f} s ({report.size / verified:,.0f} records/s)",
    ]


PARTS = ("append", "strict", "saturated", "large")


async def run(kinds: list[str], parts: list[str], records: int, large: int) -> None:
    for kind in kinds:
        print(f"## {kind}")
        for part in parts:
            if part == "large" and not large:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                async with database(kind, Path(tmp)) as url:
                    if part == "append":
                        lines = [await bench_append(url, Path(tmp), records)]
                    elif part == "strict":
                        lines = [await bench_strict(url, Path(tmp), 0.5)]
                    elif part == "saturated":
                        lines = [await bench_strict(url, Path(tmp), 0)]
                    else:
                        lines = await bench_large(url, Path(tmp), large)
            for line in lines:
                print(f"- {line}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--large", type=int, default=0, help="e.g. 1000000")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = parser.parse_args()
    asyncio.run(run(args.db, args.parts, args.records, args.large))


if __name__ == "__main__":
    main()
