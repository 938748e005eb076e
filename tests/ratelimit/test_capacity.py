"""The KV-cache capacity planner against figures worked out by hand, not by the code.

Known figures: DeepSeek-R1 caches 61 layers × (512 + 64) latent elements × 2 bytes = 70,272 B per
token, so a 65,536-token request is 4,605,345,792 B (4.61 GB) in BF16 and half that in FP8;
Llama-3.1-70B caches 2 × 80 layers × 8 KV heads × 128 × 2 bytes = 327,680 B per token.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cli.main import main
from ratelimit.capacity import (
    PRESETS,
    CapacityPlan,
    Deployment,
    LayerKind,
    ModelSpec,
    model_from_config,
    pipeline_stages,
    plan,
    render,
    settings_lines,
)

GIB = 2**30
R1 = PRESETS["deepseek-r1"]
LLAMA = PRESETS["llama-3.1-70b"]
R1_TOKEN = 70_272  # 61 × 576 × 2
LLAMA_TOKEN = 327_680  # 2 × 80 × 8 × 128 × 2
CTX = 65_536


def on(
    model: ModelSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    gpu_mem_gib: float = 141,
    params: float = 1e9,
    **rest: Any,
) -> CapacityPlan:
    """Plan ``model`` on roomy GPUs (141 GiB each) with light weights (1e9 parameters)."""
    gpus = tp * pp * dp
    return plan(model, Deployment(gpus, gpu_mem_gib, tp, pp, dp, params=params, **rest))


# Known figures


def test_r1_bytes_per_token_and_per_64k_request() -> None:
    bf16 = on(R1)
    assert bf16.kv_bytes_per_token == 61 * 576 * 2 == R1_TOKEN
    assert bf16.kv_bytes_per_request == R1_TOKEN * CTX == 4_605_345_792
    assert f"{bf16.kv_bytes_per_request / 1e9:.2f}" == "4.61"
    fp8 = on(R1, kv_dtype="fp8")
    assert fp8.kv_bytes_per_token == 35_136
    assert fp8.kv_bytes_per_request == 2_302_672_896
    assert f"{fp8.kv_bytes_per_request / 1e9:.2f}" == "2.30"


def test_deepseek_v3_is_r1s_architecture() -> None:
    assert on(PRESETS["deepseek-v3"]).kv_bytes_per_token == R1_TOKEN


def test_llama_70b_and_distill_qwen_bytes_per_token() -> None:
    assert on(LLAMA).kv_bytes_per_token == LLAMA_TOKEN
    qwen = on(PRESETS["deepseek-r1-distill-qwen-32b"])
    assert qwen.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 == 262_144


@pytest.mark.parametrize(
    ("name", "layers", "params"),
    [
        ("deepseek-r1", 61, 671e9),
        ("deepseek-v3", 61, 671e9),
        ("deepseek-r1-distill-qwen-32b", 64, 32.8e9),
        ("llama-3.1-70b", 80, 70.6e9),
    ],
)
def test_presets(name: str, layers: int, params: float) -> None:
    assert len(PRESETS[name].layers) == layers
    assert PRESETS[name].params == params


# Memory


def test_kv_memory_is_utilization_minus_weights_minus_reserve() -> None:
    result = plan(LLAMA, Deployment(gpus=4, gpu_mem_gib=80, tp=4, weights="fp8"))
    weights = 70_600_000_000 // 4  # 1 byte per parameter, split four ways
    assert result.weight_bytes_per_gpu == weights
    assert result.kv_bytes_per_gpu == 72 * GIB - weights - 2 * GIB
    per_gpu = LLAMA_TOKEN // 4
    assert result.kv_bytes_per_token_per_gpu == per_gpu
    assert result.kv_tokens_per_engine == result.kv_bytes_per_gpu // per_gpu
    assert result.max_requests_per_engine == result.kv_bytes_per_gpu // (per_gpu * CTX)


def test_weight_precisions() -> None:
    per_gpu = {w: on(LLAMA, weights=w, params=70.6e9).weight_bytes_per_gpu for w in ("bf16", "fp8")}
    assert per_gpu == {"bf16": 141_200_000_000, "fp8": 70_600_000_000}
    assert on(LLAMA, weights="int4", params=70.6e9).weight_bytes_per_gpu == 35_300_000_000
    assert (
        on(LLAMA, weights="int4", params=70.6e9, tp=2, pp=2).weight_bytes_per_gpu == 8_825_000_000
    )


def test_no_memory_left_gives_zero_capacity_and_a_warning() -> None:
    # R1 in FP8 on 8 × 80 GiB: 83.875 GB of weights per GPU against 72 GiB (77.3 GB) usable.
    result = plan(R1, Deployment(gpus=8, gpu_mem_gib=80, tp=8, weights="fp8"))
    assert result.weight_bytes_per_gpu == 83_875_000_000
    assert result.kv_bytes_per_gpu == 0
    assert result.kv_tokens_per_engine == result.max_requests_per_engine == 0
    assert result.admitted_tokens_per_engine == 0
    (warning,) = result.warnings
    short = 83_875_000_000 + 2 * GIB - 72 * GIB
    assert "no memory left for the KV cache" in warning
    assert f"{short:,} B" in warning
    assert warning.endswith("; needs more GPUs (tp/pp) or smaller weights")  # 78.1 GiB > 80 - 2
    assert settings_lines(result) == (
        "# no KV capacity: THINKGATE_KV_CAPACITY_TOKENS cannot be set",
    )


def test_a_higher_utilization_is_suggested_only_when_it_would_help() -> None:
    # 70.6 GB of FP8 weights + 2 GiB exceed 0.8 × 80 GiB but not the whole 80 GiB.
    result = plan(
        LLAMA, Deployment(gpus=1, gpu_mem_gib=80, weights="fp8", gpu_memory_utilization=0.8)
    )
    assert result.kv_tokens_per_engine == 0
    assert result.warnings[0].endswith(
        "; needs a higher gpu_memory_utilization, more GPUs (tp/pp) or smaller weights"
    )


def test_memory_for_tokens_but_not_one_request_warns() -> None:
    result = on(LLAMA, gpu_mem_gib=6, context=131_072)  # 1.65 GB of KV < one 43 GB request
    assert result.kv_tokens_per_engine > 0
    assert result.max_requests_per_engine == 0
    assert result.warnings == ("not one request of 131,072 tokens fits; lower the context",)


# Parallelism


def test_mla_is_replicated_across_tensor_parallel_ranks() -> None:
    tp8 = plan(R1, Deployment(gpus=8, gpu_mem_gib=141, tp=8, weights="fp8"))
    assert tp8.kv_bytes_per_token_per_gpu == R1_TOKEN  # every GPU holds the whole latent
    assert tp8.kv_bytes_per_gpu == round(141 * GIB * 0.9) - 671_000_000_000 // 8 - 2 * GIB
    assert tp8.kv_tokens_per_engine == tp8.kv_bytes_per_gpu // R1_TOKEN
    # The engine holds exactly what one GPU with the same free memory would hold alone.
    alone = plan(R1, Deployment(gpus=1, gpu_mem_gib=141, weights="fp8", params=671e9 / 8))
    assert alone.kv_bytes_per_gpu == tp8.kv_bytes_per_gpu
    assert alone.kv_tokens_per_engine == tp8.kv_tokens_per_engine


def test_gqa_heads_are_split_across_tensor_parallel_ranks() -> None:
    assert on(LLAMA, tp=8).kv_bytes_per_token_per_gpu == LLAMA_TOKEN // 8 == 40_960
    assert on(LLAMA, tp=2).kv_bytes_per_token_per_gpu == LLAMA_TOKEN // 2
    assert on(LLAMA, tp=8).kv_bytes_per_token == LLAMA_TOKEN  # the engine figure is unsharded


def test_fewer_kv_heads_than_ranks_are_replicated() -> None:
    # 8 KV heads on 16 ranks: each rank still holds one whole head (2 × 80 × 1 × 128 × 2 B).
    assert on(LLAMA, tp=16).kv_bytes_per_token_per_gpu == 40_960
    mqa = ModelSpec("mqa", ("attention",) * 10, kv_heads=1, head_dim=64)
    assert on(mqa, tp=4).kv_bytes_per_token_per_gpu == 2 * 10 * 1 * 64 * 2


def test_data_parallel_doubles_the_total_not_the_engine() -> None:
    one, two = on(LLAMA, tp=2), on(LLAMA, tp=2, dp=2)
    assert two.kv_tokens_per_engine == one.kv_tokens_per_engine > 0
    assert two.max_requests_per_engine == one.max_requests_per_engine
    assert two.engines == 2
    assert two.kv_tokens_total == 2 * one.kv_tokens_total
    assert two.max_requests_total == 2 * one.max_requests_total


def test_pipeline_parallel_halves_the_layers_per_gpu() -> None:
    assert on(LLAMA, pp=2).kv_bytes_per_token_per_gpu == LLAMA_TOKEN // 2  # 40 layers each
    # 61 layers in two stages: vLLM gives the first 31 (the last holds the LM head).
    assert on(R1, pp=2).kv_bytes_per_token_per_gpu == 31 * 576 * 2 == 35_712
    assert on(R1, pp=2).kv_bytes_per_token == R1_TOKEN


def test_pipeline_stages_follow_vllm() -> None:
    assert pipeline_stages(61, 2) == [31, 30]
    assert pipeline_stages(61, 4) == [15, 15, 16, 15]
    assert pipeline_stages(22, 4) == [5, 6, 6, 5]
    assert pipeline_stages(80, 2) == [40, 40]
    with pytest.raises(ValueError, match="exceeds"):
        pipeline_stages(4, 5)


def test_pipeline_binds_on_the_heavier_stage_of_a_hybrid() -> None:
    # Stage 0 holds the four attention layers, stage 1 only recurrent ones.
    layers: tuple[LayerKind, ...] = ("attention",) * 4 + ("recurrent",) * 4
    model = ModelSpec("h", layers, kv_heads=2, head_dim=64, state_bytes_per_request=1000)
    result = on(model, pp=2, context=1000)
    assert result.kv_bytes_per_token_per_gpu == 4 * 2 * 2 * 64 * 2
    assert result.kv_bytes_per_request_per_gpu == 1000 * 4 * 2 * 2 * 64 * 2


# Sliding windows and recurrent state


def test_sliding_window_caps_the_bytes_of_a_request() -> None:
    model = ModelSpec("swa", ("sliding",) * 32, kv_heads=8, head_dim=128, sliding_window=4096)
    per_token = 2 * 32 * 8 * 128 * 2
    result = on(model, context=CTX)
    assert result.kv_bytes_per_token == per_token
    assert result.kv_bytes_per_request == 4096 * per_token  # not 65,536 tokens' worth
    assert result.max_requests_per_engine == result.kv_bytes_per_gpu // (4096 * per_token)
    assert result.kv_tokens_per_engine == result.kv_bytes_per_gpu * CTX // (4096 * per_token)
    short = on(model, context=2048)  # inside the window the cost is linear
    assert short.kv_bytes_per_request == 2048 * per_token
    assert short.kv_tokens_per_engine == short.kv_bytes_per_gpu // per_token


def test_hybrid_of_full_and_sliding_layers() -> None:
    layers: tuple[LayerKind, ...] = ("sliding", "attention") * 4
    model = ModelSpec("gemma-like", layers, kv_heads=4, head_dim=256, sliding_window=1024)
    layer = 2 * 4 * 256 * 2
    assert on(model, context=8192).kv_bytes_per_request == 4 * layer * (1024 + 8192)


def test_recurrent_layers_add_constant_state_per_request() -> None:
    layers: tuple[LayerKind, ...] = ("recurrent", "recurrent", "recurrent", "attention")
    model = ModelSpec("hybrid", layers, kv_heads=2, head_dim=128, state_bytes_per_request=10**6)
    per_token = 2 * 2 * 128 * 2
    for context in (1, 4096, CTX):
        result = on(model, context=context)
        assert result.kv_bytes_per_token == per_token
        assert result.kv_bytes_per_request == context * per_token + 3 * 10**6
        assert result.max_requests_per_engine == result.kv_bytes_per_gpu // (
            context * per_token + 3 * 10**6
        )
    assert on(model, tp=2).kv_bytes_per_request_per_gpu == CTX * per_token // 2 + 3 * 10**6 // 2


def test_a_pure_recurrent_model_has_no_bytes_per_token() -> None:
    model = ModelSpec("mamba", ("recurrent",) * 48, state_bytes_per_request=2**20)
    result = on(model)
    assert result.kv_bytes_per_token == 0
    assert result.max_requests_per_engine == result.kv_bytes_per_gpu // (48 * 2**20)


def test_model_spec_checks_what_its_layers_need() -> None:
    with pytest.raises(ValueError, match="state_bytes_per_request"):
        ModelSpec("m", ("recurrent",))
    with pytest.raises(ValueError, match="sliding_window"):
        ModelSpec("m", ("sliding",), kv_heads=1, head_dim=64)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ModelSpec("m", ("mla",))
    with pytest.raises(ValueError, match="unknown layer kinds"):
        ModelSpec("m", ("ssm",), state_bytes_per_request=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs layers"):
        ModelSpec("m", ())


# Admission settings


def test_settings_follow_the_capacity() -> None:
    result = on(LLAMA, tp=2)
    tokens = result.kv_tokens_per_engine
    assert result.admitted_tokens_per_engine == int(tokens * 0.85)
    assert settings_lines(result) == (
        f"# admits 0.85 × {tokens:,} = {int(tokens * 0.85):,} tokens per engine",
        f"THINKGATE_KV_CAPACITY_TOKENS={tokens}",
        "THINKGATE_KV_TARGET_UTILIZATION=0.85",
    )
    other = on(LLAMA, tp=2, target_utilization=0.5)
    assert other.admitted_tokens_per_engine == tokens // 2


def test_render_is_a_table_with_the_settings() -> None:
    text = render(plan(R1, Deployment(gpus=8, gpu_mem_gib=141, tp=8, weights="fp8")))
    assert text.startswith("deepseek-r1 on 8 × 141 GiB GPUs: TP8 × PP1 × DP1, context 65,536\n")
    assert "KV bytes per token (engine, before sharding)  70,272 B\n" in text
    assert "4,605,345,792 B (4.61 GB, 4.29 GiB)" in text
    assert "THINKGATE_KV_CAPACITY_TOKENS=" in text
    assert text.endswith("THINKGATE_KV_TARGET_UTILIZATION=0.85")


@given(
    kv_heads=st.sampled_from([1, 2, 4, 8, 16, 32]),
    tp=st.sampled_from([1, 2, 4, 8]),
    layers=st.integers(1, 100),
    gib=st.floats(10, 200),
    context=st.integers(1, 1 << 20),
)
def test_capacity_fills_but_never_exceeds_kv_memory(
    kv_heads: int, tp: int, layers: int, gib: float, context: int
) -> None:
    kind: LayerKind = "attention"
    model = ModelSpec("m", (kind,) * layers, kv_heads=kv_heads, head_dim=128)
    result = on(model, tp=tp, gpu_mem_gib=gib, context=context)
    per_token = result.kv_bytes_per_token_per_gpu
    assert per_token == 2 * layers * max(1, kv_heads // tp) * 128 * 2
    assert result.kv_tokens_per_engine * per_token <= result.kv_bytes_per_gpu
    assert (result.kv_tokens_per_engine + 1) * per_token > result.kv_bytes_per_gpu
    assert result.max_requests_per_engine == result.kv_tokens_per_engine // context


# Deployments


def test_gpus_must_equal_tp_times_pp_times_dp() -> None:
    with pytest.raises(ValueError, match=r"gpus \(8\) must equal tp × pp × dp \(2 × 1 × 2 = 4\)"):
        Deployment(gpus=8, gpu_mem_gib=80, tp=2, dp=2)


@pytest.mark.parametrize(
    "bad",
    [
        {"tp": 0},
        {"gpu_mem_gib": 0},
        {"context": 0},
        {"gpu_memory_utilization": 1.5},
        {"target_utilization": 0},
        {"reserve_gib": -1},
        {"params": 0},
    ],
)
def test_deployment_rejects_nonsense(bad: dict[str, object]) -> None:
    fields: dict[str, object] = {"gpus": 1, "gpu_mem_gib": 80, **bad}
    if "tp" in bad:
        fields["gpus"] = 0
    with pytest.raises(ValueError, match="must"):
        Deployment(**fields)  # type: ignore[arg-type]


def test_weights_need_a_parameter_count() -> None:
    model = dataclasses.replace(LLAMA, params=None)
    with pytest.raises(ValueError, match="no parameter count"):
        plan(model, Deployment(gpus=1, gpu_mem_gib=80))
    assert plan(model, Deployment(gpus=1, gpu_mem_gib=80, params=8e9)).weight_bytes_per_gpu == 16e9


# config.json

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
}
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
QWEN2_CONFIG = {  # DeepSeek-R1-Distill-Qwen-32B: a window it does not use
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "sliding_window": 131072,
    "use_sliding_window": False,
}


def test_config_llama_defaults_head_dim_from_hidden_size() -> None:
    model = model_from_config(LLAMA_CONFIG)
    assert (model.kv_heads, model.head_dim, len(model.layers)) == (8, 128, 80)
    assert on(model).kv_bytes_per_token == LLAMA_TOKEN


def test_config_deepseek_v3_is_mla() -> None:
    model = model_from_config(DEEPSEEK_V3_CONFIG)
    assert set(model.layers) == {"mla"}
    assert on(model).kv_bytes_per_token == R1_TOKEN  # not 2 × 61 × 128 heads × 192 × 2


def test_config_unused_window_is_ignored_and_kv_heads_default_to_heads() -> None:
    assert set(model_from_config(QWEN2_CONFIG).layers) == {"attention"}
    mha = model_from_config({k: v for k, v in LLAMA_CONFIG.items() if k != "num_key_value_heads"})
    assert mha.kv_heads == 64
    explicit = model_from_config({**LLAMA_CONFIG, "head_dim": 64})
    assert explicit.head_dim == 64


def test_config_window_without_layer_types_applies_to_every_layer() -> None:
    mistral = {**LLAMA_CONFIG, "sliding_window": 4096}
    assert set(model_from_config(mistral).layers) == {"sliding"}


def test_config_layer_types_make_a_hybrid() -> None:
    config = {
        **LLAMA_CONFIG,
        "num_hidden_layers": 4,
        "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention", "linear_attention", "mamba"],
        "state_bytes_per_request": 4096,
    }
    model = model_from_config(config)
    assert model.layers == ("sliding", "attention", "recurrent", "recurrent")
    per_layer = 2 * 8 * 128 * 2
    assert on(model, context=1024).kv_bytes_per_request == per_layer * (512 + 1024) + 2 * 4096


def test_config_nested_text_config() -> None:
    model = model_from_config({"architectures": ["X"], "text_config": LLAMA_CONFIG})
    assert len(model.layers) == 80


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"num_attention_heads": 8}, "num_hidden_layers must be an integer"),
        ({**LLAMA_CONFIG, "num_hidden_layers": "80"}, "num_hidden_layers must be an integer"),
        ({**LLAMA_CONFIG, "layer_types": ["full_attention"]}, "must list 80 layers"),
        ({**LLAMA_CONFIG, "num_hidden_layers": 1, "layer_types": ["moe"]}, "unknown layer_types"),
        ({**LLAMA_CONFIG, "num_hidden_layers": 1, "layer_types": ["mamba"]}, "state_bytes"),
        ({**DEEPSEEK_V3_CONFIG, "qk_rope_head_dim": None}, "qk_rope_head_dim"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_config_errors(config: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        model_from_config(config)  # type: ignore[arg-type]


# The command line


def test_cli_preset(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capacity", "--model", "deepseek-r1", "--gpus", "8", "--gpu-mem-gib", "141"]
    assert main([*argv, "--tp", "8", "--weights", "fp8", "--kv-dtype", "fp8"]) == 0
    out = capsys.readouterr().out
    expected = plan(
        R1, Deployment(gpus=8, gpu_mem_gib=141, tp=8, weights="fp8", kv_dtype="fp8")
    ).kv_tokens_per_engine
    assert expected == (round(141 * GIB * 0.9) - 83_875_000_000 - 2 * GIB) // 35_136
    assert f"THINKGATE_KV_CAPACITY_TOKENS={expected}\n" in out
    assert "KV bytes per token (engine, before sharding)  35,136 B" in out


def test_cli_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    argv = ["capacity", "--model", str(tmp_path), "--gpus", "4", "--gpu-mem-gib", "80"]
    assert main([*argv, "--tp", "2", "--dp", "2", "--params", "70.6e9", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "327,680 B" in out
    assert "engines (data parallel)" in out
    file_argv = [*argv[:2], str(tmp_path / "config.json"), *argv[3:]]
    assert main([*file_argv, "--tp", "4", "--params", "70.6e9"]) == 0
    assert "81,920 B" in capsys.readouterr().out  # 327,680 / 4


def test_cli_state_bytes_for_a_hybrid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {**LLAMA_CONFIG, "num_hidden_layers": 2, "layer_types": ["mamba", "full_attention"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["capacity", "--model", str(tmp_path), "--gpus", "1", "--gpu-mem-gib", "24"]
    assert main([*argv, "--params", "1e9", "--context", "1000"]) == 2
    assert "state_bytes_per_request" in capsys.readouterr().err
    argv += ["--params", "1e9", "--context", "1000", "--state-bytes-per-request", "1000000"]
    assert main(argv) == 0
    assert "5,096,000 B" in capsys.readouterr().out  # 1000 × 4,096 + 1,000,000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--model", "deepseek-r1", "--gpus", "8", "--tp", "4"],
            "gpus (8) must equal tp × pp × dp",
        ),
        (["--model", "no-such-model", "--gpus", "1"], "not a preset (deepseek-r1, "),
        (["--model", "CONFIG", "--gpus", "1"], "no parameter count"),
        (["--model", "BROKEN", "--gpus", "1"], "thinkgate capacity: "),
    ],
)
def test_cli_errors_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (tmp_path / "broken.json").write_text("{")
    paths = {"CONFIG": str(tmp_path / "config.json"), "BROKEN": str(tmp_path / "broken.json")}
    argv = [paths.get(a, a) for a in argv]
    assert main(["capacity", *argv, "--gpu-mem-gib", "80"]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""


def test_cli_zero_capacity_still_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    """A deployment that does not fit prints why, and exits 1 (a script can tell)."""
    argv = ["capacity", "--model", "deepseek-r1", "--gpus", "8", "--gpu-mem-gib", "80"]
    assert main([*argv, "--tp", "8", "--weights", "fp8", "--gpu-memory-utilization", "0.94"]) == 1
    out = capsys.readouterr().out
    assert "warning: no memory left for the KV cache" in out
    assert "THINKGATE_KV_CAPACITY_TOKENS=" not in out
