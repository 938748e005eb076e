"""Batches through the real ``openai`` and ``anthropic`` SDKs against the simulator: upload,
create, poll, download, results matched by ``custom_id``; a bad line's error, a refused input
file, cancel; a hidden key's results without reasoning; every line an ordinary exchange with
its record naming the batch and the line."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import RecordingSink, Stack
from tests.e2e.test_rate_limits import database, limited_key
from tests.e2e.test_responses import expected
from tests.openai_errors import assert_openai_error
from tests.scrape import sample
from tests.waiting import eventually


@pytest.fixture
async def gateway(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    return stack, sink


def sdk(stack: Stack, key: str = "visible") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys[key], max_retries=0)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def chat_line(custom_id: str, question: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "deepseek-r1", "messages": [{"role": "user", "content": question}],
                     **body}}  # fmt: skip


async def ended(client: openai.AsyncOpenAI, batch_id: str, within_s: float = 20) -> Any:
    seen: list[Any] = []

    async def done() -> bool:
        seen.append(await client.batches.retrieve(batch_id))
        return seen[-1].status in ("completed", "failed", "expired", "cancelled")

    await eventually(done, within_s=within_s, every=0.05)
    return seen[-1]


def by_custom_id(raw: bytes) -> dict[str, dict[str, Any]]:
    found = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
    out = {line["custom_id"]: line for line in found}
    assert len(out) == len(found)  # each line answered once
    return out


async def test_a_chat_batch_uploaded_run_and_downloaded(
    gateway: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = gateway
    questions = {f"q{i}": f"Question {i}?" for i in range(6)}
    lines = [chat_line(cid, q) for cid, q in questions.items()]
    lines.append(chat_line("bad", "x", model="no-such-model"))
    async with sdk(stack) as client:
        uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))),
                                             purpose="batch")  # fmt: skip
        assert (uploaded.purpose, uploaded.filename, uploaded.status) == (
            "batch", "in.jsonl", "processed")  # fmt: skip
        batch = await client.batches.create(input_file_id=uploaded.id,
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h",
                                            metadata={"run": "1"})  # fmt: skip
        assert (batch.status, batch.request_counts.total) == ("in_progress", 7)  # type: ignore[union-attr]
        done = await ended(client, batch.id)
        assert done.status == "completed" and done.metadata == {"run": "1"}
        assert (done.request_counts.completed, done.request_counts.failed) == (6, 1)  # type: ignore[union-attr]
        assert done.completed_at is not None and done.output_file_id and done.error_file_id
        output = by_custom_id((await client.files.content(done.output_file_id)).content)
        errors = by_custom_id((await client.files.content(done.error_file_id)).content)
        listed = await client.batches.list(limit=10)
    assert set(output) == set(questions) and set(errors) == {"bad"}
    for custom_id, question in questions.items():
        response = output[custom_id]["response"]
        assert response["status_code"] == 200 and output[custom_id]["error"] is None
        message = response["body"]["choices"][0]["message"]
        assert message["content"] == "\n\n" + expected(question).answer
        assert message["reasoning_content"].rstrip() == expected(question).reasoning  # visible
    assert errors["bad"]["response"]["status_code"] == 404
    assert errors["bad"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert [b.id for b in listed.data] == [batch.id]
    records = await sink.wait_for(6)
    batch_records = [r for r in records if r.batch is not None]
    assert sorted(r.batch[1] for r in batch_records) == sorted(questions)  # type: ignore[index]
    assert {r.batch[0] for r in batch_records} == {batch.id}  # type: ignore[index]
    assert all(r.status == "ok" and r.endpoint == "chat.completions" for r in batch_records)


async def test_a_hidden_keys_batch_results_hold_no_reasoning(
    gateway: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = gateway
    lines = [chat_line("a", "Why?"),
             {"custom_id": "r", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "deepseek-r1", "messages": [{"role": "user", "content": "How?"}],
                       "reasoning_effort": "high"}}]  # fmt: skip
    async with sdk(stack, "hidden") as client:
        uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id,
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h")  # fmt: skip
        done = await ended(client, batch.id)
        raw = (await client.files.content(done.output_file_id)).content  # type: ignore[arg-type]
    assert done.request_counts.completed == 2  # type: ignore[union-attr]
    for question in ("Why?", "How?"):
        trace = expected(question).reasoning
        assert trace[:40].encode() not in raw and b"reasoning_content" not in raw


async def test_responses_embeddings_and_completions_lines(
    gateway: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = gateway
    cases = {
        "/v1/responses": {"model": "deepseek-r1", "input": "Why?"},
        "/v1/completions": {"model": "deepseek-r1", "prompt": "Why?", "max_tokens": 8},
    }
    async with sdk(stack) as client:
        for endpoint, body in cases.items():
            line = {"custom_id": "one", "method": "POST", "url": endpoint, "body": body}
            uploaded = await client.files.create(file=("in.jsonl", jsonl([line])),
                                                 purpose="batch")  # fmt: skip
            batch = await client.batches.create(input_file_id=uploaded.id,
                                                endpoint=endpoint,  # type: ignore[arg-type]
                                                completion_window="24h")  # fmt: skip
            done = await ended(client, batch.id)
            assert done.request_counts.completed == 1, (endpoint, done)  # type: ignore[union-attr]
            out = by_custom_id((await client.files.content(done.output_file_id)).content)  # type: ignore[arg-type]
            body_out = out["one"]["response"]["body"]
            assert body_out["object"] == ("response" if endpoint == "/v1/responses"
                                          else "text_completion")  # fmt: skip


async def test_bad_files_and_bad_batches_are_refused_naming_what(
    gateway: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = gateway
    good = chat_line("a", "Why?")
    async with sdk(stack) as client:
        with pytest.raises(openai.BadRequestError) as bad_line:
            await client.files.create(file=("in.jsonl", jsonl([good]) + b"{not json\n"),
                                      purpose="batch")  # fmt: skip
        assert "Line 2" in bad_line.value.message
        assert_openai_error(bad_line.value.response, 400, "invalid_file")
        with pytest.raises(openai.BadRequestError) as purpose:
            await client.files.create(file=("in.jsonl", jsonl([good])), purpose="fine-tune")
        assert purpose.value.body["param"] == "purpose"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            await client.batches.create(input_file_id="file-nope",
                                        endpoint="/v1/chat/completions",
                                        completion_window="24h")  # fmt: skip
        twice = await client.files.create(file=("in.jsonl", jsonl([good, good])),
                                          purpose="batch")  # fmt: skip
        failed = await client.batches.create(input_file_id=twice.id,
                                             endpoint="/v1/chat/completions",
                                             completion_window="24h")  # fmt: skip
        assert failed.status == "failed" and failed.errors is not None
        [error] = failed.errors.data or []
        assert (error.line, error.param) == (2, "custom_id")
        with pytest.raises(openai.BadRequestError) as window:
            await client.batches.create(
                input_file_id=twice.id, endpoint="/v1/chat/completions", completion_window="1h"
            )  # type: ignore[arg-type]
        assert window.value.body["param"] == "completion_window"  # type: ignore[index]
    async with sdk(stack, "other") as other:  # another tenant sees none of it
        with pytest.raises(openai.NotFoundError):
            await other.files.retrieve(twice.id)
        with pytest.raises(openai.NotFoundError):
            await other.batches.retrieve(failed.id)


async def test_files_listed_read_and_deleted(gateway: tuple[Stack, RecordingSink]) -> None:
    stack, _ = gateway
    content = jsonl([chat_line("a", "Why?")])
    async with sdk(stack) as client:
        made = [await client.files.create(file=(f"f{i}.jsonl", content), purpose="batch")
                for i in range(3)]  # fmt: skip
        page = await client.files.list(limit=2, order="asc")
        assert [f.id for f in page.data] == [m.id for m in made[:2]] and page.has_more
        every = [f.id async for f in await client.files.list(limit=2, order="asc")]
        assert every == [m.id for m in made]
        assert (await client.files.retrieve(made[1].id)).filename == "f1.jsonl"
        assert (await client.files.content(made[1].id)).content == content
        gone = await client.files.delete(made[1].id)
        assert gone.deleted
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(made[1].id)


async def test_cancel_ends_the_batch_with_the_lines_that_finished(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SimConfig(ttft_ms=20, itl_ms=40), batch_max_concurrency=1)
    lines = [chat_line(f"q{i}", f"Question {i}?") for i in range(20)]
    async with sdk(stack) as client:
        uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id,
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h")  # fmt: skip

        async def one_done() -> bool:
            b = await client.batches.retrieve(batch.id)
            return b.request_counts.completed >= 1  # type: ignore[union-attr]

        await eventually(one_done, within_s=20, every=0.05)
        cancelling = await client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        done = await ended(client, batch.id)
        assert done.status == "cancelled" and done.cancelled_at is not None
        output = by_custom_id((await client.files.content(done.output_file_id)).content)  # type: ignore[arg-type]
        errors = by_custom_id((await client.files.content(done.error_file_id)).content)  # type: ignore[arg-type]
    assert len(output) >= 1 and len(output) + len(errors) == 20
    assert {e["error"]["code"] for e in errors.values()} <= {"batch_cancelled"}
    assert done.request_counts.completed == len(output)  # type: ignore[union-attr]


async def test_anthropic_message_batches(gateway: tuple[Stack, RecordingSink]) -> None:
    stack, sink = gateway
    client = anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["visible"],
                                      max_retries=0)  # fmt: skip
    requests: list[Any] = [
        {"custom_id": f"m{i}", "params": {"model": "deepseek-r1", "max_tokens": 2048,
                                          "thinking": {"type": "enabled", "budget_tokens": 1024},
                                          "messages": [{"role": "user", "content": f"Q{i}?"}]}}
        for i in range(4)
    ]  # fmt: skip
    requests.append({"custom_id": "bad", "params": {"model": "deepseek-r1", "messages": []}})
    made = await client.messages.batches.create(requests=requests)
    assert made.processing_status == "in_progress" and made.request_counts.processing == 5

    async def is_ended() -> Any:
        b = await client.messages.batches.retrieve(made.id)
        return b if b.processing_status == "ended" else None

    done = await eventually(is_ended, within_s=20, every=0.05)
    assert (done.request_counts.succeeded, done.request_counts.errored) == (4, 1)
    results = {r.custom_id: r.result async for r in await client.messages.batches.results(made.id)}
    assert set(results) == {"m0", "m1", "m2", "m3", "bad"}
    for i in range(4):
        result = results[f"m{i}"]
        assert result.type == "succeeded"
        kinds = [block.type for block in result.message.content]  # type: ignore[union-attr]
        assert kinds == ["thinking", "text"]
    assert results["bad"].type == "errored"
    listed = [b.id async for b in client.messages.batches.list(limit=10)]
    assert listed == [made.id]
    deleted = await client.messages.batches.delete(made.id)
    assert deleted.id == made.id
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.batches.retrieve(made.id)
    records = await sink.wait_for(4)
    assert sum(1 for r in records if r.batch and r.batch[0] == made.id) == 4
    await client.close()


async def test_anthropic_bad_requests_are_refused_in_anthropics_shape(
    gateway: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = gateway
    client = anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["visible"],
                                      max_retries=0)  # fmt: skip
    with pytest.raises(anthropic.BadRequestError) as twice:
        await client.messages.batches.create(requests=[
            {"custom_id": "a", "params": {"model": "m", "max_tokens": 1, "messages": []}},
            {"custom_id": "a", "params": {"model": "m", "max_tokens": 1, "messages": []}},
        ])  # fmt: skip
    assert twice.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "requests[1]" in twice.value.message
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.batches.create(requests=[
            {"custom_id": "a", "params": {"model": "m", "max_tokens": 1, "messages": [],
                                          "stream": True}}])  # fmt: skip
    await client.close()


async def test_anthropic_cancel_keeps_what_finished(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SimConfig(ttft_ms=20, itl_ms=40), batch_max_concurrency=1)
    client = anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["hidden"],
                                      max_retries=0)  # fmt: skip
    requests: list[Any] = [
        {"custom_id": f"m{i}", "params": {"model": "deepseek-r1", "max_tokens": 2048,
                                          "thinking": {"type": "enabled", "budget_tokens": 1024},
                                          "messages": [{"role": "user", "content": f"Q{i}?"}]}}
        for i in range(10)
    ]  # fmt: skip
    made = await client.messages.batches.create(requests=requests)

    async def one_done() -> bool:
        b = await client.messages.batches.retrieve(made.id)
        return b.request_counts.succeeded >= 1

    await eventually(one_done, within_s=20, every=0.05)
    cancelling = await client.messages.batches.cancel(made.id)
    assert cancelling.processing_status in ("canceling", "ended")
    assert cancelling.cancel_initiated_at is not None

    async def is_ended() -> Any:
        b = await client.messages.batches.retrieve(made.id)
        return b if b.processing_status == "ended" else None

    done = await eventually(is_ended, within_s=20, every=0.05)
    results = {r.custom_id: r.result async for r in await client.messages.batches.results(made.id)}
    kinds = [r.type for r in results.values()]
    assert len(results) == 10 and set(kinds) <= {"succeeded", "canceled"}
    assert kinds.count("succeeded") == done.request_counts.succeeded >= 1
    assert done.request_counts.canceled == kinds.count("canceled") >= 1
    for result in results.values():  # a hidden key: its thinking redacted, never shown
        if result.type == "succeeded":
            assert "thinking" not in [b.type for b in result.message.content]
    await client.close()


async def test_a_batch_counts_against_its_keys_rate_limit(
    stack_factory: Any, tmp_path: Path
) -> None:
    """A key of 120 requests a minute, its bucket full: the batch's lines past it are refused
    for now, go back in the queue, and all end answered, two a second as the limit allows."""
    stack = await stack_factory(sim=SimConfig(ttft_ms=1, itl_ms=0))
    key = await limited_key(stack, database(tmp_path), rpm=120)
    lines = [chat_line(f"q{i}", f"Question {i}?", max_tokens=4) for i in range(130)]
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=key, max_retries=0) as client:
        uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id,
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h")  # fmt: skip
        done = await ended(client, batch.id, within_s=30)
    assert done.status == "completed" and done.request_counts.completed == 130  # type: ignore[union-attr]
    async with httpx.AsyncClient() as http:
        shed = await sample(http, f"{stack.root}/metrics", "thinkgate_batch_lines_shed_total")
    assert shed >= 1


@pytest.mark.parametrize("lines", [40, 1000], ids=["over-the-file-limit", "cut-off-upload"])
async def test_a_file_above_the_limit_is_413(stack_factory: Any, lines: int) -> None:
    """Just above ``FILES_MAX_BYTES``, and far above it (the upload is cut off while it comes,
    past the limit and the form's own room)."""
    stack = await stack_factory(files_max_bytes=2048)
    big = jsonl([chat_line(f"q{i}", "x" * 100) for i in range(lines)])
    async with sdk(stack) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.files.create(file=("in.jsonl", big), purpose="batch")
    assert refused.value.status_code == 413
    assert "exceeds 2048 bytes" in refused.value.message
