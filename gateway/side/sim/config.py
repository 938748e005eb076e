"""Settings of one simulated vLLM server.

Rules: times are milliseconds (``0`` means no delay at all); rates are probabilities drawn per
request from a ``random.Random(seed)`` owned by the app's state; ``models`` maps every served
model name to the way its reasoning reaches the client (see ``gateway.side.sim.script``). The first
name is the one vLLM would use as the ``model_name`` label of its metrics; ``formats`` names the
markers a model writes (Qwen3's ``<think>``, Kimi K3's three-token markers, MiniMax M2's close
marker alone), ``deepseek_r1``'s by default. ``guards`` names the models that answer as Llama
Guard does (``gateway.side.sim.guard``): ``llama-guard`` by default, unsafe for S1 on "detonator"
and S2 on "counterfeit".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.side.sim.script import SimMode


def _default_models() -> Mapping[str, SimMode]:
    return MappingProxyType(
        {
            "deepseek-r1": "template",
            "qwq-32b": "tags",
            "deepseek-r1-parsed": "separated",
            "deepseek-v3": "none",
            "qwen3": "tags",
            "kimi-k3": "template",
            "minimax-m2": "template",
            "llama-guard": "none",
        }
    )


def _default_guards() -> Mapping[str, Mapping[str, tuple[str, ...]]]:
    return MappingProxyType(
        {"llama-guard": MappingProxyType({"S1": ("detonator",), "S2": ("counterfeit",)})}
    )


def _default_formats() -> Mapping[str, str]:
    return MappingProxyType({"qwen3": "qwen3", "kimi-k3": "kimi_k3", "minimax-m2": "minimax_m2"})


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulator behaves; validated on construction."""

    ttft_ms: float = 0
    itl_ms: float = 0
    kv_capacity_tokens: int = 65536
    block_size: int = 16
    models: Mapping[str, SimMode] = field(default_factory=_default_models)
    # the markers each model writes (a gateway.relay.formats name); deepseek_r1's when absent
    formats: Mapping[str, str] = field(default_factory=_default_formats)
    # models that play a guard model (gateway.side.sim.guard): category -> the words that violate it
    guards: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=_default_guards)
    seed: int = 0
    error_rate: float = 0.0
    drop_rate: float = 0.0
    stall_ms: float = 0.0
    max_model_len: int = 32768
    prefix_caching: bool = True  # as vLLM's V1 engine, on by default; in cache_config_info
    # the prefix cache simulated block by block (gateway.side.sim.prefix): cached tokens in
    # usage (vLLM's --enable-prompt-tokens-details); on with KV events or a prefill rate
    prompt_cache: bool = False
    kv_events: str | None = None  # where KV events are published (tcp://*:PORT; :0 any port)
    kv_events_replay: str | None = None  # the replay endpoint
    # 0: prefill takes no time; else per uncached token, shared by the requests prefilling
    prefill_tokens_per_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("SimConfig.models must name at least one model")
        if self.block_size < 1 or self.kv_capacity_tokens < self.block_size:
            raise ValueError("SimConfig needs block_size >= 1 and capacity >= one block")
        if min(self.ttft_ms, self.itl_ms, self.stall_ms) < 0:
            raise ValueError("SimConfig delays must be >= 0")
        if min(self.error_rate, self.drop_rate) < 0 or self.error_rate + self.drop_rate > 1:
            raise ValueError("SimConfig rates must be >= 0 and sum to at most 1")
        if self.max_model_len < 1:
            raise ValueError("SimConfig.max_model_len must be >= 1")
        if self.prefill_tokens_per_s < 0:
            raise ValueError("SimConfig.prefill_tokens_per_s must be >= 0")

    @property
    def caching(self) -> bool:
        """Whether the prefix cache is simulated."""
        return self.prompt_cache or self.kv_events is not None or self.prefill_tokens_per_s > 0

    @property
    def metrics_model_name(self) -> str:
        """vLLM labels metrics with the first served model name."""
        return next(iter(self.models))
