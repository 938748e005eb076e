"""Parsing a model server's metrics: vLLM's names (current and older), SGLang's, and the
simulator's live exposition, which mirrors vLLM's."""

from __future__ import annotations

import httpx
import pytest

from gateway.edge.servers import BackgroundServer
from gateway.side.sim.app import SimConfig, create_sim_app
from ratelimit.engine_metrics import parse_engine_metrics

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="r1"} 3.0
vllm:num_requests_running{engine="1",model_name="r1"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="r1"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="r1"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="r1"} 0.5
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="r1"} 4.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="4097"} 1.0
"""


def test_vllm_exposition() -> None:
    snap = parse_engine_metrics(VLLM)
    assert snap.kv_capacity_tokens == 4096 * 16
    assert snap.block_size == 16
    assert snap.kv_usage == 0.5  # the fullest engine
    assert snap.requests_running == 5
    assert snap.requests_waiting == 7
    assert snap.preemptions_total == 4


def test_older_vllm_and_sglang_names() -> None:
    old = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.75\n"
    assert parse_engine_metrics(old).kv_usage == 0.75
    sglang = (
        "# TYPE sglang:token_usage gauge\nsglang:token_usage 0.4\n"
        "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 9\n"
    )
    snap = parse_engine_metrics(sglang)
    assert (snap.kv_usage, snap.requests_waiting) == (0.4, 9)
    assert snap.kv_capacity_tokens is None and snap.requests_running is None


def test_missing_figures_are_none() -> None:
    snap = parse_engine_metrics("# TYPE other gauge\nother 1\n")
    assert snap == type(snap)(None, None, None, None, None, None)


def test_malformed_text_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_engine_metrics("vllm:num_requests_running{oops 1\n")


async def test_the_simulator_exposition_parses_and_reflects_its_configuration() -> None:
    app = create_sim_app(SimConfig(kv_capacity_tokens=8192))
    async with BackgroundServer(app) as sim, httpx.AsyncClient() as client:
        text = (await client.get(f"{sim.url}/metrics")).text
    snap = parse_engine_metrics(text)
    assert snap.kv_capacity_tokens == 8192
    assert snap.kv_usage == 0 and snap.requests_running == 0 and snap.requests_waiting == 0
