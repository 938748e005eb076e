"""``GET /metrics``: the simulator's counters under vLLM's Prometheus names (sans-I/O).

Written by hand in the Prometheus text format 0.0.4, as ``prometheus_client`` would render
vLLM's metrics (counter families are typed under their name without ``_total``); no global
registry is involved, so two apps in one process never share a metric.

``vllm:request_success_total{engine,finished_reason,model_name}`` counts finished sequences by
reason (``stop``, ``length``, ``abort``) as vLLM 0.32 does: the ``abort`` series is exported but
stays 0, because vLLM 0.32 does not count client aborts there (the simulator counts them in
``SimState.cancelled`` only).

``vllm:cache_config_info`` carries ``num_gpu_blocks = capacity // block_size + 1``: vLLM
reserves one null block, so ``(num_gpu_blocks - 1) * block_size`` is the usable capacity.
"""

from __future__ import annotations

from gateway.side.sim.config import SimConfig
from gateway.side.sim.state import SimState

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def render_metrics(config: SimConfig, state: SimState) -> bytes:
    """The exposition text for the current counters."""
    labels = f'engine="0",model_name="{_escape(config.metrics_model_name)}"'
    lines = [
        *_family("num_requests_running", "gauge", "Number of requests in model execution batches."),
        f"vllm:num_requests_running{{{labels}}} {float(state.running)!r}",
        *_family("num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
        f"vllm:num_requests_waiting{{{labels}}} {float(state.waiting)!r}",
        *_family("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
        f"vllm:kv_cache_usage_perc{{{labels}}} {state.kv.usage!r}",
        *_family("cache_config_info", "gauge", "Information of the LLMEngine CacheConfig"),
        f"vllm:cache_config_info{{{_cache_labels(config)}}} 1.0",
        *_counter("num_preemptions", labels, state.preemptions_total, "Cumulative preemptions."),
        *_counter("prompt_tokens", labels, state.prompt_tokens_total, "Prefill tokens processed."),
        *_counter("generation_tokens", labels, state.generation_tokens_total, "Generation tokens."),
        *_family("request_success", "counter", "Count of successfully processed requests."),
        *_success_samples(config, state),
    ]
    prefix = state.prefix
    if prefix is not None:  # vLLM's V1 names: prompt tokens looked up, and found cached
        lines += [
            *_counter("prefix_cache_queries", labels, prefix.queries, "Prefix cache queries."),
            *_counter("prefix_cache_hits", labels, prefix.hit_tokens, "Prefix cache hits."),
        ]
    return ("\n".join(lines) + "\n").encode()


def _family(name: str, kind: str, help_text: str) -> tuple[str, str]:
    return f"# HELP vllm:{name} {help_text}", f"# TYPE vllm:{name} {kind}"


def _counter(name: str, labels: str, value: int, help_text: str) -> tuple[str, str, str]:
    return (*_family(name, "counter", help_text), f"vllm:{name}_total{{{labels}}} {float(value)!r}")


def _success_samples(config: SimConfig, state: SimState) -> list[str]:
    model = _escape(config.metrics_model_name)
    return [
        f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="{model}"}}'
        f" {float(count)!r}"
        for reason, count in state.finished.items()
    ]


def _cache_labels(config: SimConfig) -> str:
    blocks = config.kv_capacity_tokens // config.block_size + 1
    return (
        f'block_size="{config.block_size}",cache_dtype="auto",'
        f'enable_prefix_caching="{config.prefix_caching}",'
        f'engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="0",num_gpu_blocks="{blocks}"'
    )


def _escape(value: str) -> str:
    """Label values escape backslash, double quote and newline (text format 0.0.4)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
