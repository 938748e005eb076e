"""A batch across two gateway replicas (processes) on PostgreSQL + Redis, through the
``openai`` SDK: both replicas run its lines; ``kill -9`` of the one it was created on while
each replica runs lines whose write-ahead intent is durable; the survivor takes over the dead
replica's lines once their lease runs out and finishes the batch. Every line is answered
exactly once in the output file, each line the dead replica had begun is on the ledger as
``replica_lost`` (naming the batch and the line) besides its answer, and ``ledger verify``
passes."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import openai
import orjson
import pytest
from sqlalchemy import func, select

from audit.schema import entries, intents
from gateway.batch.rows import lines
from gateway.side.sim.app import SimConfig
from tests.e2e.processes import run_cli
from tests.e2e.test_batches import by_custom_id, chat_line, jsonl
from tests.e2e.test_replica_faults import (  # noqa: F401
    Cluster,
    ClusterFactory,
    cluster_factory,
    metric,
)
from tests.waiting import eventually

pytestmark = [pytest.mark.xdist_group("private_postgres"), pytest.mark.timeout(240)]

LINES = 32  # two full rounds of both replicas' 8 lines: both run lines once 2 are done


async def made_batch(client: openai.AsyncOpenAI, count: int) -> Any:
    """A chat batch of ``count`` lines (custom ids ``q0``, ``q1`` ...), uploaded and made."""
    questions = [chat_line(f"q{i}", f"Question {i}?") for i in range(count)]
    uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(questions))),
                                         purpose="batch")  # fmt: skip
    return await client.batches.create(input_file_id=uploaded.id,
                                       endpoint="/v1/chat/completions",
                                       completion_window="24h")  # fmt: skip


async def line_rows(cluster: Cluster) -> list[Any]:
    return await cluster.rows(select(lines.c.line, lines.c.state, lines.c.owner, lines.c.attempts))


async def intent_lines(cluster: Cluster, batch_id: str) -> set[str]:
    """The custom_ids of the batch's lines whose write-ahead intent is in the database."""
    found = set()
    for (raw,) in await cluster.rows(select(intents.c.header)):
        batch = orjson.loads(raw).get("batch") or {}
        if batch.get("id") == batch_id:
            found.add(batch["custom_id"])
    return found


async def ledger_batch_lines(cluster: Cluster, batch_id: str) -> Counter[tuple[str, str]]:
    """(custom_id, status) of the ledger's records of the batch's lines."""
    found: Counter[tuple[str, str]] = Counter()
    completions = select(entries.c.header).where(entries.c.kind == "completion")
    for (raw,) in await cluster.rows(completions):
        header = orjson.loads(raw)
        if (header.get("batch") or {}).get("id") == batch_id:
            found[(header["batch"]["custom_id"], header["status"])] += 1
    return found


async def test_a_killed_replicas_lines_are_taken_over_and_answered_once(
    cluster_factory: ClusterFactory,  # noqa: F811
) -> None:
    # Each line streams for about 1.6 s, so both replicas run lines for several seconds: the
    # state the kill needs lasts far longer than a poll, even on a loaded machine. There the
    # survivor's window falls to one line at a time (the runner yields a busy CPU: LAG_S), so
    # the rest of the batch may take it a minute: a full run on a loaded machine saw 3 s lines
    # not done in 60 s.
    cluster = await cluster_factory(
        sim=SimConfig(ttft_ms=30, itl_ms=8), THINKGATE_BATCH_LEASE_S="3",
        THINKGATE_BACKGROUND_STALE_S="4", THINKGATE_BATCH_MAX_CONCURRENCY="8",
    )  # fmt: skip
    doomed, survivor = cluster.gateways
    key = cluster.keys["visible"]
    async with openai.AsyncOpenAI(base_url=f"{doomed.url}/v1", api_key=key,
                                  max_retries=0) as client:  # fmt: skip
        batch = await made_batch(client, LINES)

    async def both_running_with_intents() -> set[str] | None:
        """The lines whose exchange has its durable intent, once every replica runs one."""
        rows, started = await line_rows(cluster), await intent_lines(cluster, batch.id)
        running = {r.owner for r in rows if r.state == "running"}
        with_intent = {r.owner for r in rows if r.state == "running" and f"q{r.line}" in started}
        done = sum(r.state == "done" for r in rows)
        return started if len(running) == 2 and with_intent == running and done >= 2 else None

    try:
        started = await eventually(both_running_with_intents, within_s=60, every=0.05)
    except TimeoutError:
        rows = await line_rows(cluster)
        raise AssertionError((Counter((r.state, r.owner) for r in rows),
                              sorted(await intent_lines(cluster, batch.id)))) from None  # fmt: skip
    await doomed.kill_9()
    async with openai.AsyncOpenAI(base_url=f"{survivor.url}/v1", api_key=key,
                                  max_retries=0) as client:  # fmt: skip

        async def ended() -> Any:
            found = await client.batches.retrieve(batch.id)
            return found if found.status in ("completed", "failed", "expired") else None

        try:
            done = await eventually(ended, within_s=120, every=0.1)
        except TimeoutError:
            rows = await line_rows(cluster)
            raise AssertionError(Counter((r.state, r.owner, r.attempts) for r in rows)) from None
        assert done.status == "completed", done
        assert done.request_counts.completed == LINES  # type: ignore[union-attr]
        raw = (await client.files.content(done.output_file_id)).content  # type: ignore[arg-type]
    output = by_custom_id(raw)  # asserts each custom_id once
    assert sorted(output) == sorted(f"q{i}" for i in range(LINES))
    assert {line["response"]["status_code"] for line in output.values()} == {200}
    after = await line_rows(cluster)
    taken_over = {f"q{r.line}" for r in after if r.attempts >= 2}
    lost = taken_over & started  # begun on the dead replica: the engine had them
    assert lost, (taken_over, started)

    async def first_attempts_recorded() -> Counter[tuple[str, str]] | None:
        """Each lost line's first attempt on the ledger: ``replica_lost``, or ``ok`` when it
        ended in the moment between its record's commit and its result's (``WRITE_EVERY_S``:
        the engine then answered it twice, the output file has it once)."""
        found = await ledger_batch_lines(cluster, batch.id)
        first = all((c, "replica_lost") in found or found[(c, "ok")] == 2 for c in lost)
        return found if first else None

    try:
        records = await eventually(first_attempts_recorded, within_s=40, every=0.2)
    except TimeoutError:
        raise AssertionError((taken_over, await ledger_batch_lines(cluster, batch.id))) from None
    answered = {custom_id for (custom_id, status) in records if status == "ok"}
    assert answered == set(output)
    statuses = {status for (_, status) in records}
    assert statuses <= {"ok", "replica_lost"}, records
    [(total,)] = await cluster.rows(select(func.count()).select_from(entries))
    assert total >= LINES
    code, out = await run_cli(cluster.env, "ledger", "verify", cwd=str(cluster.tmp))
    assert code == 0, out


async def test_a_replica_with_no_batch_concurrency_takes_batches_and_runs_none_of_their_lines(
    cluster_factory: ClusterFactory,  # noqa: F811
) -> None:
    """``BATCH_MAX_CONCURRENCY=0`` on the interactive replica: the batch made there is run by
    the other (from the shared queue), every line once, none on the replica that took it."""
    cluster = await cluster_factory(
        sim=SimConfig(ttft_ms=5, itl_ms=1),
        replicas=({"THINKGATE_BATCH_MAX_CONCURRENCY": "0"}, {}),
    )  # fmt: skip
    interactive, runner = cluster.gateways
    key = cluster.keys["visible"]
    async with openai.AsyncOpenAI(base_url=f"{interactive.url}/v1", api_key=key,
                                  max_retries=0) as client:  # fmt: skip
        batch = await made_batch(client, 12)

        async def ended() -> Any:
            found = await client.batches.retrieve(batch.id)
            return found if found.status in ("completed", "failed", "expired") else None

        done = await eventually(ended, within_s=30, every=0.1)
        assert done.status == "completed" and done.request_counts.completed == 12, done
        raw = (await client.files.content(done.output_file_id)).content  # type: ignore[arg-type]
    assert sorted(by_custom_id(raw)) == sorted(f"q{i}" for i in range(12))
    assert await metric(interactive.url, "thinkgate_batch_lines_done_total") == 0
    assert await metric(runner.url, "thinkgate_batch_lines_done_total") == 12
    assert len({row.owner for row in await line_rows(cluster)}) == 1
