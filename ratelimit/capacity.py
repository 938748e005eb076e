"""KV-cache capacity planner: how many tokens and requests a vLLM deployment holds (sans-I/O).

``plan(model, deployment) -> CapacityPlan`` and ``render(plan) -> str``. Data in, figures out:
the caller reads ``config.json`` (``model_from_config``) and prints. Bytes are exact integers;
"GB" is 10^9 bytes, "GiB" 2^30. Rules:

- Bytes per layer and token, by kind (``ModelSpec.layers`` lists one kind per layer, so hybrid
  stacks mix them):

  - ``attention`` (MHA, GQA, MQA): 2 (K and V) × kv_heads × head_dim × KV dtype bytes.
  - ``mla`` (DeepSeek V2/V3/R1): (kv_lora_rank + qk_rope_head_dim) × KV dtype bytes: one
    compressed latent plus the shared RoPE key. No separate K and V, so no factor 2.
  - ``sliding``: as ``attention``, but a request holds at most ``sliding_window`` tokens.
  - ``recurrent`` (Mamba-like, linear attention): nothing per token; a constant
    ``state_bytes_per_request`` per layer and request, whatever the request's length.

- ``kv_bytes_per_token`` sums every layer of one engine before any sharding; per-request
  figures apply the window caps and add the recurrent state.
- Tensor parallel: a GPU holds ``max(1, kv_heads // tp)`` KV heads (replicated when
  kv_heads < tp); the MLA latent is replicated on every rank, so a TP8 MLA engine holds one GPU's
  worth of tokens; recurrent state is split tp ways.
- Pipeline parallel: stages get vLLM's layer split; every stage allocates the same number of
  blocks, so the stage whose share of a request is largest binds the engine.
- Data parallel: each rank is an engine with its own cache. Figures are per engine; totals × dp.
- Memory per GPU: KV = gpu_mem × gpu_memory_utilization − weights − reserve, where weights =
  params × weight bytes / (tp × pp) and the reserve (activations, CUDA graphs, communication
  buffers) is a rough 2 GiB by default. Nothing left: capacity 0 and a warning, never an error.
- Requests at the context length = KV memory // one request's bytes on the binding GPU. The
  gateway admits in tokens, so capacity tokens = KV memory × context // request bytes: exactly
  KV memory // bytes per token for a pure attention stack; windows raise it and recurrent state
  lowers it at the planning context.
- Admission settings: ``KV_CAPACITY_TOKENS`` = capacity tokens per engine and
  ``KV_TARGET_UTILIZATION`` (0.85 suggested), which admits floor(capacity × target) tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, get_args

LayerKind = Literal["attention", "mla", "sliding", "recurrent"]
WeightPrecision = Literal["bf16", "fp16", "fp8", "int4"]
KvDtype = Literal["bf16", "fp16", "fp8"]

GIB = 1 << 30
WEIGHT_BITS: Mapping[WeightPrecision, int] = MappingProxyType(
    {"bf16": 16, "fp16": 16, "fp8": 8, "int4": 4}
)
KV_DTYPE_BYTES: Mapping[KvDtype, int] = MappingProxyType({"bf16": 2, "fp16": 2, "fp8": 1})

# Hugging Face ``layer_types`` values (Gemma 2/3, gpt-oss, Qwen3-Next, LFM2, ...) and ours.
_HF_LAYER_KINDS: Mapping[str, LayerKind] = MappingProxyType({
    "full_attention": "attention", "attention": "attention", "mla": "mla",
    "sliding_attention": "sliding", "sliding": "sliding",
    "linear_attention": "recurrent", "mamba": "recurrent", "mamba2": "recurrent",
    "conv": "recurrent", "recurrent": "recurrent",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the KV cache of one model needs: one kind per layer and that kind's dimensions."""

    name: str
    layers: tuple[LayerKind, ...]
    kv_heads: int = 0
    head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int = 0
    state_bytes_per_request: int = 0  # one recurrent layer's state for one request, before TP
    params: float | None = None  # for weight memory; config.json does not carry it

    def __post_init__(self) -> None:
        kinds = set(self.layers)
        if not kinds <= set(get_args(LayerKind)):
            raise ValueError(f"{self.name}: unknown layer kinds {sorted(kinds)}")
        needs = {
            "attention": ("kv_heads", "head_dim"),
            "sliding": ("kv_heads", "head_dim", "sliding_window"),
            "mla": ("kv_lora_rank",),
            "recurrent": ("state_bytes_per_request",),
        }
        missing = sorted({f for kind in kinds for f in needs[kind] if getattr(self, f) <= 0})
        if not self.layers or missing:
            raise ValueError(f"{self.name}: needs layers and positive {', '.join(missing)}")


def _deepseek_v3(name: str) -> ModelSpec:
    # R1 is a V3 fine-tune: the same 61 layers of MLA (config.json: kv_lora_rank 512,
    # qk_rope_head_dim 64). 671e9 excludes the 14e9 multi-token-prediction module.
    return ModelSpec(name, ("mla",) * 61, kv_lora_rank=512, qk_rope_head_dim=64, params=671e9)


# Sources: each model's config.json on Hugging Face; parameter counts from the model cards.
PRESETS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        "deepseek-r1": _deepseek_v3("deepseek-r1"),
        "deepseek-v3": _deepseek_v3("deepseek-v3"),
        "deepseek-r1-distill-qwen-32b": ModelSpec(
            "deepseek-r1-distill-qwen-32b",
            ("attention",) * 64,
            kv_heads=8,
            head_dim=128,
            params=32.8e9,
        ),
        "qwq-32b": ModelSpec(
            "qwq-32b", ("attention",) * 64, kv_heads=8, head_dim=128, params=32.5e9
        ),
        "llama-3.1-70b": ModelSpec(
            "llama-3.1-70b", ("attention",) * 80, kv_heads=8, head_dim=128, params=70.6e9
        ),
    }
)


@dataclass(frozen=True, slots=True)
class Deployment:
    """How one model is served: GPUs, parallelism, precisions and the context to plan for."""

    gpus: int
    gpu_mem_gib: float
    tp: int = 1
    pp: int = 1
    dp: int = 1
    weights: WeightPrecision = "bf16"
    kv_dtype: KvDtype = "bf16"
    gpu_memory_utilization: float = 0.9
    context: int = 65536
    params: float | None = None  # overrides the model's parameter count
    reserve_gib: float = 2.0  # activations, CUDA graphs, NCCL buffers: a rough figure
    target_utilization: float = 0.85

    def __post_init__(self) -> None:
        for field in ("gpus", "tp", "pp", "dp", "context", "gpu_mem_gib"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive")
        if self.gpus != self.tp * self.pp * self.dp:
            raise ValueError(
                f"gpus ({self.gpus}) must equal tp × pp × dp "
                f"({self.tp} × {self.pp} × {self.dp} = {self.tp * self.pp * self.dp})"
            )
        for field in ("gpu_memory_utilization", "target_utilization"):
            if not 0 < getattr(self, field) <= 1:
                raise ValueError(f"{field} must be in (0, 1]")
        if self.reserve_gib < 0:
            raise ValueError("reserve_gib must be >= 0")
        if self.params is not None and self.params <= 0:
            raise ValueError("params must be positive")


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """The planner's figures. Per GPU figures are those of the binding pipeline stage."""

    model: str
    deployment: Deployment
    kv_bytes_per_token: int  # one engine, all layers, before sharding
    kv_bytes_per_request: int  # one engine, one request at the context length, before sharding
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_request_per_gpu: int
    weight_bytes_per_gpu: int
    kv_bytes_per_gpu: int  # memory left for the KV cache; 0 when there is none
    kv_tokens_per_engine: int
    max_requests_per_engine: int
    admitted_tokens_per_engine: int
    warnings: tuple[str, ...]

    @property
    def engines(self) -> int:
        return self.deployment.dp

    @property
    def kv_tokens_total(self) -> int:
        return self.kv_tokens_per_engine * self.engines

    @property
    def max_requests_total(self) -> int:
        return self.max_requests_per_engine * self.engines


def model_from_config(
    config: Mapping[str, object],
    name: str = "config.json",
    state_bytes_per_request: int | None = None,
) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` (``text_config`` for multimodal ones).

    Recurrent layers take ``state_bytes_per_request`` (one layer's state for one request) from
    the argument, else from a config key of that name (Hugging Face configs carry none).

    Without ``layer_types``, a ``sliding_window`` applies to every layer (Mistral) unless
    ``use_sliding_window`` is false (Qwen2 ships a window it does not use); models that
    alternate windowed and full layers must list ``layer_types``.
    """
    if not isinstance(config, Mapping):
        raise ValueError("config.json: not a JSON object")
    text = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text, Mapping):
        config = text
    layers = _int(config, "num_hidden_layers")
    mla = _int(config, "kv_lora_rank", 0) > 0
    window = _int(config, "sliding_window", 0)
    if config.get("use_sliding_window") is False:
        window = 0
    heads = _int(config, "num_attention_heads", 0)
    default_dim = _int(config, "hidden_size", 0) // heads if heads else 0
    return ModelSpec(
        name=name,
        layers=_layer_kinds(config, layers, mla, window > 0),
        kv_heads=_int(config, "num_key_value_heads", heads),
        head_dim=_int(config, "head_dim", default_dim),
        kv_lora_rank=_int(config, "kv_lora_rank", 0),
        qk_rope_head_dim=_int(config, "qk_rope_head_dim") if mla else 0,
        sliding_window=window,
        state_bytes_per_request=state_bytes_per_request
        or _int(config, "state_bytes_per_request", 0),
    )


def _int(config: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = config.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"config.json: {key} must be an integer, not {value!r}")
    return value


def _layer_kinds(
    config: Mapping[str, object], count: int, mla: bool, sliding: bool
) -> tuple[LayerKind, ...]:
    full: LayerKind = "mla" if mla else "attention"
    listed = config.get("layer_types")
    if listed is None:
        return ("sliding" if sliding else full,) * count
    if not isinstance(listed, list) or len(listed) != count:
        raise ValueError(f"config.json: layer_types must list {count} layers")
    unknown = sorted({str(t) for t in listed} - set(_HF_LAYER_KINDS))
    if unknown:
        raise ValueError(f"config.json: unknown layer_types {unknown}")
    kinds = (_HF_LAYER_KINDS[str(t)] for t in listed)
    return tuple(full if k in ("attention", "mla") else k for k in kinds)


def layer_token_bytes(model: ModelSpec, kind: LayerKind, tp: int, kv_bytes: int) -> int:
    """One token's KV bytes in one layer on one GPU of a ``tp``-way tensor parallel group."""
    if kind == "recurrent":
        return 0
    if kind == "mla":
        # DeepSeek-V2 paper (arXiv:2405.04434) §2.1.2 and Table 1: (d_c + d_h^R) elements per
        # layer and token. vLLM treats MLA as one KV head replicated on every TP rank
        # (ModelConfig.get_num_kv_heads returns 1 when use_mla).
        return (model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes
    # vLLM ModelConfig.get_num_kv_heads: max(1, total_num_kv_heads // tensor_parallel_size).
    return 2 * max(1, model.kv_heads // tp) * model.head_dim * kv_bytes


def layer_request_bytes(
    model: ModelSpec, kind: LayerKind, tp: int, kv_bytes: int, context: int
) -> int:
    """One request's bytes in one layer on one GPU, at ``context`` tokens."""
    if kind == "recurrent":
        return -(-model.state_bytes_per_request // tp)  # heads split across TP ranks
    tokens = min(context, model.sliding_window) if kind == "sliding" else context
    return tokens * layer_token_bytes(model, kind, tp, kv_bytes)


def pipeline_stages(layers: int, pp: int) -> list[int]:
    """Layers per stage as vLLM's ``get_pp_indices`` (vllm/distributed/utils.py) splits them:
    the remainder goes one layer each to the stages before the last (which holds the LM head)."""
    if pp > layers:
        raise ValueError(f"pp ({pp}) exceeds the model's {layers} layers")
    stages = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        stages[-i] += 1
    return stages


def plan(model: ModelSpec, deployment: Deployment) -> CapacityPlan:
    """Apply the module's rules. Raises ``ValueError`` only for a missing parameter count or
    more pipeline stages than layers; a deployment that does not fit is a plan with warnings."""
    d = deployment
    kv_bytes = KV_DTYPE_BYTES[d.kv_dtype]
    stage = _binding_stage(model, d)
    per_token = sum(layer_token_bytes(model, k, d.tp, kv_bytes) for k in stage)
    per_request = sum(layer_request_bytes(model, k, d.tp, kv_bytes, d.context) for k in stage)
    weights = _weight_bytes_per_gpu(model, d)
    free = round(d.gpu_mem_gib * GIB * d.gpu_memory_utilization) - weights
    free -= round(d.reserve_gib * GIB)
    kv_memory = max(0, free)
    tokens = kv_memory * d.context // per_request
    requests = kv_memory // per_request
    return CapacityPlan(
        model=model.name,
        deployment=d,
        kv_bytes_per_token=sum(layer_token_bytes(model, k, 1, kv_bytes) for k in model.layers),
        kv_bytes_per_request=sum(
            layer_request_bytes(model, k, 1, kv_bytes, d.context) for k in model.layers
        ),
        kv_bytes_per_token_per_gpu=per_token,
        kv_bytes_per_request_per_gpu=per_request,
        weight_bytes_per_gpu=weights,
        kv_bytes_per_gpu=kv_memory,
        kv_tokens_per_engine=tokens,
        max_requests_per_engine=requests,
        admitted_tokens_per_engine=int(tokens * d.target_utilization),
        warnings=_warnings(free, requests, d),
    )


def _binding_stage(model: ModelSpec, d: Deployment) -> tuple[LayerKind, ...]:
    """The pipeline stage whose share of one request at the context length is largest."""
    kv_bytes = KV_DTYPE_BYTES[d.kv_dtype]
    slices, start = [], 0
    for count in pipeline_stages(len(model.layers), d.pp):
        slices.append(model.layers[start : start + count])
        start += count
    return max(
        slices,
        key=lambda s: sum(layer_request_bytes(model, k, d.tp, kv_bytes, d.context) for k in s),
    )


def _weight_bytes_per_gpu(model: ModelSpec, d: Deployment) -> int:
    params = d.params if d.params is not None else model.params
    if params is None:
        raise ValueError(f"{model.name}: no parameter count for the weights; pass params")
    bits = round(params) * WEIGHT_BITS[d.weights]
    return -(-bits // (8 * d.tp * d.pp))


def _warnings(free: int, requests: int, d: Deployment) -> tuple[str, ...]:
    if free <= 0:
        # Would the whole GPU do? If not, only more GPUs or smaller weights help.
        whole = free + round(d.gpu_mem_gib * GIB * (1 - d.gpu_memory_utilization)) > 0
        remedy = "a higher gpu_memory_utilization, " if whole else ""
        return (
            f"no memory left for the KV cache: weights and the {d.reserve_gib:g} GiB reserve "
            f"exceed {d.gpu_memory_utilization:g} of {d.gpu_mem_gib:g} GiB per GPU by "
            f"{_size(-free)}; needs {remedy}more GPUs (tp/pp) or smaller weights",
        )
    if requests == 0:
        return (f"not one request of {d.context:,} tokens fits; lower the context",)
    return ()


def settings_lines(result: CapacityPlan) -> tuple[str, ...]:
    """The gateway's admission settings for one engine, as ``KEY=value`` lines (or a comment)."""
    if result.kv_tokens_per_engine == 0:
        return ("# no KV capacity: THINKGATE_KV_CAPACITY_TOKENS cannot be set",)
    target = result.deployment.target_utilization
    return (
        f"# admits {target:g} × {result.kv_tokens_per_engine:,} = "
        f"{result.admitted_tokens_per_engine:,} tokens per engine",
        f"THINKGATE_KV_CAPACITY_TOKENS={result.kv_tokens_per_engine}",
        f"THINKGATE_KV_TARGET_UTILIZATION={target:g}",
    )


def render(result: CapacityPlan) -> str:
    """A plain-text table of the plan, its warnings and its settings lines."""
    d = result.deployment
    rows = [
        ("KV bytes per token (engine, before sharding)", f"{result.kv_bytes_per_token:,} B"),
        (f"KV per {d.context:,}-token request (engine)", _size(result.kv_bytes_per_request)),
        ("KV bytes per token per GPU", f"{result.kv_bytes_per_token_per_gpu:,} B"),
        (f"KV per {d.context:,}-token request per GPU", _size(result.kv_bytes_per_request_per_gpu)),
        ("weights per GPU", _size(result.weight_bytes_per_gpu)),
        ("KV memory per GPU", _size(result.kv_bytes_per_gpu)),
        ("KV capacity per engine", f"{result.kv_tokens_per_engine:,} tokens"),
        (f"max requests per engine at {d.context:,}", f"{result.max_requests_per_engine:,}"),
        ("engines (data parallel)", f"{result.engines}"),
        ("KV capacity total", f"{result.kv_tokens_total:,} tokens"),
        (f"max requests total at {d.context:,}", f"{result.max_requests_total:,}"),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [_title(result), *(f"{label:<{width}}  {value}" for label, value in rows)]
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join([*lines, *settings_lines(result)])


def _title(result: CapacityPlan) -> str:
    d = result.deployment
    return (
        f"{result.model} on {d.gpus} × {d.gpu_mem_gib:g} GiB GPUs: TP{d.tp} × PP{d.pp} × "
        f"DP{d.dp}, context {d.context:,}\n{d.weights} weights, {d.kv_dtype} KV cache, "
        f"gpu_memory_utilization {d.gpu_memory_utilization:g}, reserve {d.reserve_gib:g} GiB"
    )


def _size(count: int) -> str:
    return f"{count:,} B ({count / 1e9:.2f} GB, {count / GIB:.2f} GiB)"
