"""``bench.loadgen`` against an in-process simulator on a real socket (functional, not timed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from bench.client import Connection, Recorder
from bench.loadgen import LoadSpec, agent_messages, agent_turns, report, run_load
from gateway.api.messages.request import parse_messages_request
from gateway.edge.servers import BackgroundServer
from gateway.side.sim import SimConfig, create_sim_app


class CountingMeter:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")


@pytest.fixture
async def sim_url() -> AsyncIterator[str]:
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=2, itl_ms=1))) as server:
        yield server.url + "/v1"


async def test_counts_requests_chunks_and_ordered_percentiles(sim_url: str) -> None:
    meter = CountingMeter()
    spec = LoadSpec(url=sim_url, api_key="unused", concurrency=2, duration_s=1.0, max_tokens=16)

    result = await run_load(spec, meter)

    assert meter.calls == ["start", "stop"]
    assert result.errors == 0, result.first_error
    assert result.requests >= 2
    # every completed request streamed at least one chunk (max_tokens caps it at 16)
    assert result.chunks >= result.requests
    assert result.chunks <= 16 * (result.requests + spec.concurrency)
    assert result.ttft.n > 0 and result.gap.n > 0
    assert 0 < result.ttft.p50 <= result.ttft.p99
    assert 0 <= result.gap.p50 <= result.gap.p99
    # e2e: requests both written and ended inside the window, a subset of those counted
    assert 0 < result.e2e.n <= result.requests
    assert 0 < result.e2e.p50 <= result.e2e.p99
    assert result.chunks_per_s > 0 and result.requests_per_s > 0
    assert 0.9 <= result.elapsed_s < 5.0


async def test_a_reasoning_models_answer_comes_after_its_first_token(sim_url: str) -> None:
    """``deepseek-r1-parsed`` streams reasoning (``reasoning_content``), then the answer: TTFT
    is the first reasoning token, the answer's TTFT the first answer token, later."""
    spec = LoadSpec(url=sim_url, api_key="unused", model="deepseek-r1-parsed", concurrency=2,
                    duration_s=2.0, max_tokens=1000)  # fmt: skip
    result = await run_load(spec)
    assert result.errors == 0, result.first_error
    assert result.answer_ttft.n > 0
    assert result.answer_ttft.p50 > result.ttft.p50


@pytest.mark.parametrize(("api", "reasoning", "answer"), [
    ("chat", b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}',
     b'data: {"choices":[{"delta":{"content":"Hi"}}]}'),
    ("responses", b'event: response.reasoning_text.delta\ndata: {"delta":"hm"}',
     b'event: response.output_text.delta\ndata: {"delta":"Hi"}'),
    ("messages", b'event: content_block_delta\ndata: {"delta":{"type":"thinking_delta",'
                 b'"thinking":"hm"}}',
     b'event: content_block_delta\ndata: {"delta":{"type":"text_delta","text":"Hi"}}'),
])  # fmt: skip
def test_each_apis_first_answer_event_is_told_from_its_reasoning(
    api: str, reasoning: bytes, answer: bytes
) -> None:
    rec = Recorder()
    rec.open_window()
    conn = Connection(rec, api=api)  # type: ignore[arg-type]
    body = b"\n\n".join([reasoning, reasoning, answer, answer]) + b"\n\n"
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (len(body) + 1))
    conn.data_received(body)
    assert len(rec.ttfts) == 1 and len(rec.answer_ttfts) == 1 and rec.chunks == 4
    assert rec.answer_ttfts[0] >= rec.ttfts[0]


async def test_report_is_a_compact_table(sim_url: str) -> None:
    spec = LoadSpec(url=sim_url, api_key="", concurrency=2, duration_s=0.5, max_tokens=8)

    text = report(await run_load(spec))

    lines = text.splitlines()
    assert len(lines) == 3
    assert "chunks/s" in lines[1] and "TTFT p50" in lines[1] and "e2e p99" in lines[1]
    assert "answer p50" in lines[1] and "answer p99" in lines[1]
    assert lines[2].split()[0] == "2"


async def test_server_errors_are_counted_not_completed() -> None:
    app = create_sim_app(SimConfig(error_rate=1.0))
    async with BackgroundServer(app) as server:
        spec = LoadSpec(server.url + "/v1", "unused", concurrency=2, duration_s=0.5, max_tokens=8)
        result = await run_load(spec)

    assert result.requests == 0 and result.chunks == 0
    assert result.errors > 0
    assert result.first_error == "HTTP 500"


async def test_rejects_a_spec_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        await run_load(LoadSpec("http://127.0.0.1:9/v1", "", concurrency=0))
    with pytest.raises(ValueError, match="http"):
        await run_load(LoadSpec("ftp://example/v1", ""))


def test_the_agent_context_says_the_same_through_chat_and_messages() -> None:
    """The Messages cell's agent context is the chat cell's, as the gateway translates it."""
    messages, tools = agent_messages(3)
    turns, anthropic_tools = agent_turns(3)
    body = {"model": "m", "max_tokens": 8, **turns, "tools": anthropic_tools}
    call = parse_messages_request(orjson.dumps(body))

    def plain(message: dict[str, Any]) -> dict[str, Any]:  # a tool's text parts, as one text
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": "\n".join(part["text"] for part in content)}
        for tool_call in message.get("tool_calls", ()):
            tool_call["function"]["arguments"] = json.loads(tool_call["function"]["arguments"])
        return message

    assert [plain(m) for m in call.messages] == [plain(m) for m in messages]
    assert call.chat["tools"] == tools
    assert len(orjson.dumps(body)) > 90_000
