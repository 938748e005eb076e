"""What admission control needs from a model server's ``/metrics`` (sans-I/O).

``parse_engine_metrics(text) -> EngineSnapshot`` reads the Prometheus text exposition of vLLM
(and SGLang) and keeps only the figures the KV budget uses. Rules:

- KV capacity in tokens is ``(num_gpu_blocks - 1) * block_size`` from the labels of
  ``vllm:cache_config_info`` (vLLM reserves one block, the null block).
- KV usage is ``vllm:kv_cache_usage_perc`` (a 0..1 ratio despite its name), or the older
  ``vllm:gpu_cache_usage_perc``, or SGLang's ``sglang:token_usage``.
- Queue figures: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (SGLang:
  ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs``); preemptions from the counter
  ``vllm:num_preemptions_total``.
- A server that serves several model names or engines labels each series: figures are summed
  across label sets, except usage, which is the largest (the fullest engine limits admission).
- A figure the server does not export is ``None``, never a guess. Malformed text raises
  ``ValueError`` (prometheus_client's parser); the caller decides what that means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_PREEMPTIONS = ("vllm:num_preemptions_total",)
_CACHE_INFO = "vllm:cache_config_info"


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    kv_capacity_tokens: int | None
    block_size: int | None
    kv_usage: float | None
    requests_running: float | None
    requests_waiting: float | None
    preemptions_total: float | None


def parse_engine_metrics(text: str) -> EngineSnapshot:
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    capacity, block_size = _capacity(samples.get(_CACHE_INFO, []))
    return EngineSnapshot(
        kv_capacity_tokens=capacity,
        block_size=block_size,
        kv_usage=_first(samples, _USAGE, max),
        requests_running=_first(samples, _RUNNING, sum),
        requests_waiting=_first(samples, _WAITING, sum),
        preemptions_total=_first(samples, _PREEMPTIONS, sum),
    )


def _first(
    samples: dict[str, list[Sample]],
    names: Iterable[str],
    combine: Callable[[list[float]], float],
) -> float | None:
    """The first of ``names`` the server exports, its label sets combined."""
    for name in names:
        found = samples.get(name)
        if found:
            return float(combine([float(s.value) for s in found]))
    return None


def _capacity(info: list[Sample]) -> tuple[int | None, int | None]:
    total, block_size = 0, None
    for sample in info:
        try:
            size = int(sample.labels["block_size"])
            blocks = int(sample.labels["num_gpu_blocks"])
        except (KeyError, ValueError):
            continue
        block_size = size
        total += max(0, blocks - 1) * size
    return (total or None, block_size)
