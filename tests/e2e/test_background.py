"""Background responses through the real ``openai`` SDK against the simulator: create → poll →
retrieve, a stream cut and resumed with ``starting_after`` (the same bytes as the whole
replay), cancel mid-reasoning (the engine's request gone, the lease and the limits given
back, the record ``cancelled``), a hidden key's replay, the limits, and bad requests."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import RecordingSink, Stack
from tests.e2e.test_responses import expected, sdk
from tests.openai_errors import assert_openai_error
from tests.waiting import eventually

SLOW = SimConfig(ttft_ms=50, itl_ms=40)  # a reasoning that takes seconds: time to cancel it


@pytest.fixture
async def background(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    return stack, sink


async def polled(client: openai.AsyncOpenAI, response_id: str, within_s: float = 10) -> Any:
    """The response once it left ``queued`` / ``in_progress``."""
    seen: list[Any] = []

    async def ended() -> bool:
        seen.append(await client.responses.retrieve(response_id))
        return seen[-1].status not in ("queued", "in_progress")

    await eventually(ended, within_s=within_s)
    return seen[-1]


async def test_created_queued_then_polled_to_the_same_answer_as_in_the_foreground(
    background: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = background
    text = expected("Why?")
    async with sdk(stack, "visible") as client:
        queued = await client.responses.create(model="deepseek-r1", input="Why?", background=True)
        assert (queued.status, queued.background, queued.output) == ("queued", True, [])
        done = await polled(client, queued.id)
        again = await client.responses.retrieve(queued.id)
        items = await client.responses.input_items.list(queued.id)
    assert done.status == "completed" and done.output_text == "\n\n" + text.answer
    assert [i.type for i in done.output] == ["reasoning", "message"]
    assert again.model_dump() == done.model_dump()
    assert [i.content[0].text for i in items.data] == ["Why?"]  # type: ignore[union-attr]
    [record] = await sink.wait_for(1)
    assert (record.endpoint, record.status, record.stream) == ("responses", "ok", False)


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"event: "):
            head, _, data = block.partition(b"\ndata: ")
            out.append((head[7:].decode(), orjson.loads(data)))
    return out


async def test_a_stream_cut_after_n_events_resumes_with_the_same_bytes(
    stack_factory: Any,
) -> None:
    """Cut after 5 events, resumed from the 5th's sequence number: together, byte for byte
    the whole replay; and, ids and times aside, the events of a foreground stream."""
    stack = await stack_factory(sim=SimConfig(itl_ms=5))
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    body = {"model": "deepseek-r1", "input": "Why?", "stream": True, "background": True}
    async with httpx.AsyncClient(base_url=stack.url, headers=headers, timeout=10) as http:
        first = b""
        async with http.stream("POST", "/responses", json=body) as live:
            assert live.status_code == 200
            async for chunk in live.aiter_raw():
                first += chunk
                if first.count(b"\n\n") >= 5:
                    break  # the connection goes; the response runs on
        cut = b"\n\n".join(first.split(b"\n\n")[:5]) + b"\n\n"
        events = events_of(cut)
        response_id, last = events[0][1]["response"]["id"], events[-1][1]["sequence_number"]
        assert [e[1]["sequence_number"] for e in events] == list(range(5))
        resumed = (
            await http.get(
                f"/responses/{response_id}", params={"stream": "true", "starting_after": last}
            )
        ).content
        whole = (await http.get(f"/responses/{response_id}", params={"stream": "true"})).content
        foreground = (await http.post("/responses", json={**body, "background": False})).content
    assert cut + resumed == whole
    names = [name for name, _ in events_of(whole)]
    assert names[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert names[-1] == "response.completed"

    def shape(raw: bytes) -> list[Any]:
        kept = []
        for name, event in events_of(raw):
            if name in ("response.queued",):
                continue
            event.pop("sequence_number")
            kept.append(_without_ids(event))
        return kept

    assert shape(whole) == shape(foreground)


def _without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items()
                if k not in ("id", "item_id", "created_at", "background", "status")}  # fmt: skip
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


async def test_the_sdk_resumes_a_background_stream(
    background: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = background
    async with sdk(stack, "visible") as client:
        stream = await client.responses.create(model="deepseek-r1", input="Why?", stream=True,
                                               background=True)  # fmt: skip
        seen = []
        async for event in stream:
            seen.append(event)
            if len(seen) == 4:
                break
        await stream.close()
        rest = await client.responses.retrieve(seen[0].response.id, stream=True,  # type: ignore[union-attr]
                                               starting_after=seen[-1].sequence_number)  # fmt: skip
        tail = [event async for event in rest]
    numbers = [e.sequence_number for e in [*seen, *tail]]
    assert numbers == list(range(len(numbers)))
    assert tail[-1].type == "response.completed"
    assert tail[-1].response.output_text == "\n\n" + expected("Why?").answer  # type: ignore[union-attr]


async def test_cancel_mid_reasoning_aborts_the_engine_request_and_gives_everything_back(
    stack_factory: Any,
) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sim=SLOW, sink=sink, kv_capacity_tokens=60_000)
    assert stack.sim is not None
    async with sdk(stack, "visible") as client:
        queued = await client.responses.create(model="deepseek-r1", input="Why?",
                                               background=True, max_output_tokens=4000)  # fmt: skip
        await stack.sim.sim.wait_for(lambda s: s.running == 1, timeout=5)
        cancelled = await client.responses.cancel(queued.id)
        assert cancelled.status == "cancelled"
        await stack.sim.sim.wait_for(lambda s: s.cancelled == 1, timeout=5)
        again = await client.responses.cancel(queued.id)  # idempotent: as it ended
        polled_now = await client.responses.retrieve(queued.id)
    assert again.status == polled_now.status == "cancelled"
    [record] = await sink.wait_for(1)
    assert (record.status, record.error_code) == ("cancelled", "cancelled")
    assert record.usage is not None and record.usage.completion_tokens >= 0

    async def released() -> bool:
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"{stack.root}/metrics")).text
        reserved = [
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "thinkgate_kv_budget_tokens" and s.labels["state"] == "reserved"
        ]
        return reserved == [0.0]

    await eventually(released, within_s=5)


async def test_a_hidden_key_replays_no_reasoning_byte(
    background: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = background
    reasoning, answer = expected("Why?").reasoning, expected("Why?").answer
    async with sdk(stack, "visible") as client:
        queued = await client.responses.create(model="deepseek-r1", input="Why?", background=True)
        await polled(client, queued.id)
    url = f"{stack.url}/responses/{queued.id}"
    async with httpx.AsyncClient(timeout=10) as http:
        shown = await http.get(
            url,
            params={"stream": "true"},
            headers={"authorization": f"Bearer {stack.keys['visible']}"},
        )
        hidden = await http.get(
            url,
            params={"stream": "true"},
            headers={"authorization": f"Bearer {stack.keys['hidden']}"},
        )
        polled_hidden = await http.get(url, headers={
            "authorization": f"Bearer {stack.keys['hidden']}"})  # fmt: skip
    split = reasoning.split()
    phrases = [" ".join(split[i : i + 3]) for i in range(0, len(split) - 3, 3)]
    words = [p for p in phrases if p not in answer][:8]  # three words of the trace each
    assert words and all(w.encode() in shown.content for w in words)
    assert hidden.status_code == 200 and b"response.completed" in hidden.content
    for body in (hidden.content, polled_hidden.content):
        leaked = [
            body[max(0, body.find(w.encode()) - 300) : body.find(w.encode()) + 50]
            for w in words
            if w.encode() in body
        ]
        assert not leaked, leaked
        assert b"reasoning_text" not in body
    assert [n for n, _ in events_of(hidden.content)].count("response.output_text.delta") > 0


async def test_background_limits_and_bad_requests(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SLOW, background_max_per_key=1)
    async with sdk(stack, "visible") as client:
        first = await client.responses.create(model="deepseek-r1", input="Why?", background=True)
        with pytest.raises(openai.RateLimitError) as limited:
            await client.responses.create(model="deepseek-r1", input="Why?", background=True)
        assert_openai_error(limited.value.response, 429, code="background_limit")
        with pytest.raises(openai.BadRequestError) as unstored:
            await client.responses.create(model="deepseek-r1", input="Why?", background=True,
                                          store=False)  # fmt: skip
        assert orjson.loads(unstored.value.response.content)["error"]["param"] == "background"
        foreground = await client.responses.create(model="deepseek-r1", input="Hi")
        with pytest.raises(openai.BadRequestError):
            await client.responses.cancel(foreground.id)
        with pytest.raises(openai.BadRequestError):
            await client.responses.retrieve(foreground.id, stream=True)
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel("resp_unknown")
        await client.responses.cancel(first.id)
        second = await client.responses.create(model="deepseek-r1", input="Why?", background=True)
        await client.responses.cancel(second.id)
    async with sdk(stack, "other") as other:  # another tenant's key: as unknown
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.cancel(first.id)
