"""Tokens streamed before a client disconnect are counted: the engine spent them, so the record,
the access log, the token metrics and the rate limit's settlement all have them, marked as
counted by the gateway, and the finish reason says what happened."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.side.sim.app import SimApp, SimConfig
from tests.e2e.conftest import RecordingSink

READ = 20  # streamed chunks the client reads before it leaves


def total(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)  # fmt: skip


async def test_a_disconnected_stream_counts_what_it_streamed(
    stack_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sim=SimConfig(itl_ms=10), sink=sink)
    assert isinstance(stack.sim, SimApp)
    caplog.set_level(logging.INFO, logger="thinkgate.access")
    body = {"model": "deepseek-r1", "stream": True, "max_tokens": 2000,
            "messages": [{"role": "user", "content": "Explain TCP."}]}  # fmt: skip
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    seen = 0
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream(
            "POST", f"{stack.url}/chat/completions", json=body, headers=headers
        ) as response,  # fmt: skip
    ):
        async for line in response.aiter_lines():
            seen += line.startswith("data: {")
            if seen == READ:
                break
    await stack.sim.sim.wait_for(lambda s: s.cancelled == 1, timeout=5)
    [record] = await sink.wait_for(1)
    assert record.status == "client_disconnected"
    assert record.finish_reasons == ("client_disconnected",)
    usage = record.usage
    assert usage is not None and usage.counted
    assert usage.completion_tokens >= READ - 1  # the role chunk carries no token
    assert 0 < usage.reasoning_tokens <= usage.completion_tokens
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    async with httpx.AsyncClient() as raw:
        metrics = (await raw.get(f"{stack.root}/metrics")).text
    assert total(metrics, "thinkgate_reasoning_tokens_total") == usage.reasoning_tokens
    fields = [r.__dict__.get("fields", {}) for r in caplog.records if r.name == "thinkgate.access"]
    assert [f.get("completion_tokens") for f in fields] == [usage.completion_tokens]
