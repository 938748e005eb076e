"""Two gateway replicas, as two OS processes, write to one PostgreSQL ledger at the same time.

Each process opens its own ``Ledger`` (both migrate the empty database at once), says it is
ready, and waits on its stdin; the test releases both with one write each, so their appends
really overlap. Afterwards the ledger must hold both processes' records under one contiguous
index range, each record once, with every checkpoint signed and consistent with the next.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from audit.merkle import verify_consistency
from audit.note import parse_checkpoint
from audit.schema import checkpoints, entries
from tests.audit.conftest import ORIGIN, LedgerFactory, body, leaf_hashes, root_of

PER_PROCESS = 200
BATCH = 10  # appends gathered at once in each process: 20 rounds of group commit each
REPO = Path(__file__).resolve().parents[2]

WRITER = """
import asyncio, json, sys
from pathlib import Path

from audit.crypto import FileKeyProvider
from audit.ledger import Ledger
from audit.note import NoteSigner, load_signing_key
from gateway.db import create_engine
from tests.audit.conftest import body, completion

async def main(config):
    engine = create_engine(config["url"])
    signer = NoteSigner(config["origin"], load_signing_key(Path(config["signing_key_file"])))
    ledger = await Ledger.open(
        engine, FileKeyProvider.load(Path(config["key_file"])), signer,
        origin=config["origin"], spool_path=Path(config["spool"]),
    )
    print("ready", flush=True)
    assert (await asyncio.to_thread(sys.stdin.readline)).strip() == "go"
    tag, count, batch = config["tag"], config["count"], config["batch"]
    for first in range(0, count, batch):
        await asyncio.gather(*(
            ledger.append(
                completion(i, tenant="shared" if i % 2 else f"tenant-{tag}",
                           request_id=f"{tag}-{i:04d}"),
                body(i, tag),
            )
            for i in range(first, first + batch)
        ))
    await ledger.aclose()
    stats = ledger.stats
    await engine.dispose()
    print(json.dumps({"writer": ledger.writer_id, "committed": stats.committed,
                      "batches": stats.batches, "spooled": stats.spooled}), flush=True)

asyncio.run(main(json.loads(sys.argv[1])))
"""


async def start_writer(
    script: Path, factory: LedgerFactory, url: str, tag: str
) -> asyncio.subprocess.Process:
    config = {
        "url": url,
        "origin": ORIGIN,
        "key_file": str(factory.key_file),
        "signing_key_file": str(factory.signing_key_file),
        "spool": str(factory.directory / f"spool-writer-{tag}.log"),
        "tag": tag,
        "count": PER_PROCESS,
        "batch": BATCH,
    }
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return await asyncio.create_subprocess_exec(
        sys.executable, str(script), json.dumps(config), cwd=REPO, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def run_writers(
    tmp_path: Path, factory: LedgerFactory, url: str, tags: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Start one process per tag, release them together, return what each reports."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    processes = [await start_writer(script, factory, url, tag) for tag in tags]
    try:
        for process in processes:  # each has opened its ledger (and migrated) and now waits
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), timeout=60)
            assert line == b"ready\n", await failure(process, line)
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(b"go\n")
        await asyncio.gather(*(p.stdin.drain() for p in processes if p.stdin is not None))
        outputs = [await asyncio.wait_for(p.communicate(), timeout=60) for p in processes]
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr.decode(errors="replace")
    return [json.loads(stdout) for stdout, _ in outputs]


async def failure(process: asyncio.subprocess.Process, line: bytes) -> str:
    process.kill()
    _, stderr = await process.communicate()
    return f"writer said {line!r}: {stderr.decode(errors='replace')}"


async def test_two_processes_write_one_contiguous_verified_ledger(
    postgres_url: str, ledger_factory: LedgerFactory, tmp_path: Path
) -> None:
    reports = await run_writers(tmp_path, ledger_factory, postgres_url, ("a", "b"))
    total = 2 * PER_PROCESS

    assert [r["committed"] for r in reports] == [PER_PROCESS, PER_PROCESS]
    assert [r["spooled"] for r in reports] == [0, 0]  # every record went to the database
    writers = {r["writer"]: tag for r, tag in zip(reports, "ab", strict=True)}
    assert len(writers) == 2
    engine = ledger_factory.engine(postgres_url)
    async with engine.connect() as conn:
        query = select(entries.c.idx, entries.c.writer, entries.c.sequence, entries.c.request_id)
        rows = (await conn.execute(query.order_by(entries.c.idx))).all()
        heads = (await conn.execute(select(checkpoints).order_by(checkpoints.c.size))).all()
        duplicates = (
            await conn.execute(
                select(entries.c.writer, entries.c.sequence)
                .group_by(entries.c.writer, entries.c.sequence)
                .having(func.count() > 1)
            )
        ).all()

    # One contiguous index range, each record exactly once, each writer's sequence complete.
    assert [r.idx for r in rows] == list(range(total))
    assert duplicates == []
    for writer, tag in writers.items():
        assert sorted(r.sequence for r in rows if r.writer == writer) == list(range(PER_PROCESS))
        mine = sorted(r.request_id for r in rows if r.writer == writer)
        assert mine == [f"{tag}-{i:04d}" for i in range(PER_PROCESS)]
    # The two really wrote at the same time: their records interleave in index order.
    runs = 1 + sum(a.writer != b.writer for a, b in itertools.pairwise(rows))
    assert runs >= 3, f"the writers did not overlap ({runs} runs)"

    # Every commit left exactly one checkpoint, and the whole ledger verifies.
    assert len(heads) == sum(r["batches"] for r in reports)
    report = await ledger_factory.verify(postgres_url)
    assert (report.size, report.checkpoints) == (total, len(heads))

    # Every checkpoint is signed, matches its columns and the records, and is consistent with
    # the next one; a third ledger on the same database reads either process's records.
    reader = await ledger_factory.open(postgres_url)
    verifier = ledger_factory.verifier()
    leaves = await leaf_hashes(reader, total)
    assert heads[-1].size == total
    for head in heads:
        parsed = parse_checkpoint(verifier.open(head.note))
        assert (parsed.origin, parsed.size, parsed.root) == (ORIGIN, head.size, bytes(head.root))
        assert parsed.root == root_of(leaves[: head.size])
    for first, second in itertools.pairwise(heads):
        proof = await reader.consistency(first.size, second.size)
        verify_consistency(first.size, second.size, proof, bytes(first.root), bytes(second.root))
    for row in (rows[0], rows[total // 2], rows[-1]):
        opened = await reader.read(row.idx)
        assert opened is not None
        # the i-th append's request id ends in i; its sequence is the order it was sealed in,
        # which gather() need not keep, so the body is matched by request id
        index = int(row.request_id.rsplit("-", 1)[1])
        assert opened.body == body(index, writers[row.writer])
