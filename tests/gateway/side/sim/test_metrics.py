"""``GET /metrics``: vLLM 0.32's names, KV figures, and request_success without aborts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from gateway.side.sim.state import SimState
from tests.gateway.side.sim.clients import chat, in_process, read_events, served

SUCCESS = 'vllm:request_success_total{{engine="0",finished_reason="{}",model_name="deepseek-r1"}}'


def success(text: str) -> dict[str, float]:
    """The request_success series by finished_reason."""
    found: dict[str, float] = {}
    for reason in ("stop", "length", "abort"):
        line = next(line for line in text.splitlines() if line.startswith(SUCCESS.format(reason)))
        found[reason] = float(line.rsplit(" ", 1)[1])
    return found


@asynccontextmanager
async def stalled_stream(client: httpx.AsyncClient, state: SimState) -> AsyncIterator[None]:
    """A stream that stalls after two pieces, held open inside the block, then abandoned; on
    exit the simulator has seen the client leave."""
    sim = {"fail": "stall", "fail_after": 2}
    async with client.stream("POST", "/v1/chat/completions", json=chat(stream=True, sim=sim)) as r:
        await read_events(r, limit=2)
        yield
    await state.wait_for(lambda s: s.cancelled == 1, timeout=2)


@pytest.mark.asyncio
async def test_metrics_use_vllm_names() -> None:
    async with in_process() as (client, _):
        await client.post("/v1/chat/completions", json=chat(sim={"chunks": ["a", "b"]}))
        text = (await client.get("/metrics")).text
    assert 'vllm:num_requests_running{engine="0",model_name="deepseek-r1"} 0.0' in text
    assert "vllm:num_requests_waiting{" in text
    assert "vllm:kv_cache_usage_perc{" in text
    assert 'num_gpu_blocks="4097"' in text
    assert 'block_size="16"' in text
    assert "vllm:num_preemptions_total{" in text
    assert 'vllm:prompt_tokens_total{engine="0",model_name="deepseek-r1"} 5.0' in text
    assert 'vllm:generation_tokens_total{engine="0",model_name="deepseek-r1"} 2.0' in text


@pytest.mark.asyncio
async def test_metrics_show_a_running_request_holding_kv() -> None:
    async with served() as (client, state), stalled_stream(client, state):
        await state.wait_for(lambda s: s.running == 1, timeout=2)
        text = (await client.get("/metrics")).text
    assert 'vllm:num_requests_running{engine="0",model_name="deepseek-r1"} 1.0' in text
    usage_line = next(line for line in text.splitlines() if line.startswith("vllm:kv_cache"))
    assert float(usage_line.split()[-1]) == 16 / 65536
    assert state.kv_tokens_in_use == 0


@pytest.mark.asyncio
async def test_request_success_counts_each_choice_by_finish_reason() -> None:
    chunks = {"chunks": ["a", "b"]}
    async with in_process() as (client, _):
        before = (await client.get("/metrics")).text
        await client.post("/v1/chat/completions", json=chat(sim=chunks))
        await client.post("/v1/chat/completions", json=chat(max_tokens=1, sim=chunks))
        await client.post("/v1/chat/completions", json=chat(n=2, stream=True, sim=chunks))
        await client.post("/v1/chat/completions", json=chat(stop=["b"], sim=chunks))
        text = (await client.get("/metrics")).text
    assert success(before) == {"stop": 0.0, "length": 0.0, "abort": 0.0}
    assert success(text) == {"stop": 4.0, "length": 1.0, "abort": 0.0}
    assert "# TYPE vllm:request_success counter" in text


@pytest.mark.asyncio
async def test_aborts_and_faults_are_not_counted_as_success() -> None:
    """vLLM 0.32 does not count a client's abort in finished_reason="abort"."""
    async with served() as (client, state):
        async with stalled_stream(client, state):
            pass
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/chat/completions", json=chat(sim={"fail": "drop"}))
        text = (await client.get("/metrics")).text
    assert success(text) == {"stop": 0.0, "length": 0.0, "abort": 0.0}
    assert (state.cancelled, state.failed, state.finished["abort"]) == (1, 1, 0)
