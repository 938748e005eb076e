"""``thinkgate doctor`` (``gateway/cli/doctor.py``): the pure judges on hand-made answers, then the
fetchers against the real simulator, Redis, an unreachable database and a ledger written by a
real gateway, then the command's table and exit codes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.merkle import NodeID, frontier
from audit.note import create_signing_key
from audit.schema import checkpoints, drop_triggers, entries, nodes
from gateway.cli import doctor
from gateway.cli.doctor import (
    Check,
    Verdict,
    judge_health,
    judge_metrics,
    judge_models,
    judge_probe,
)
from gateway.cli.main import main
from gateway.db import create_engine
from gateway.edge.servers import BackgroundServer
from gateway.relay.formats import BUILTIN, ReasoningFormat, ReasoningSource, lookup
from gateway.relay.thinksplit import Content, Reasoning, ThinkSplitter
from gateway.settings import ModelOverride, ModelReasoning, Settings
from gateway.side.sim import SimConfig, create_sim_app
from tests.e2e import conftest as e2e
from tests.e2e.conftest import StackFactory, ledger_files
from tests.waiting import eventually

stack_factory = e2e.stack_factory  # the e2e fixture: a real gateway, for the ledger tests


def by_name(checks: Sequence[Check]) -> dict[str, Check]:
    named = {check.name: check for check in checks}
    assert len(named) == len(checks), checks  # names are unique within one section
    return named


def split(parser: str, text: str) -> tuple[str, str]:
    """``(reasoning, content)`` as thinkgate would split ``text`` with ``parser``."""
    splitter = ThinkSplitter(parser)
    events = splitter.feed(text) + splitter.close()
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
    return reasoning, "".join(e.text for e in events if isinstance(e, Content))


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound but not listening while the test runs: every connection is refused."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


# -- judge_health, judge_models ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "verdict", "detail"),
    [(200, "pass", "200"), (500, "fail", "500"), (None, "fail", "unreachable")],
)
def test_health_passes_only_on_200(status: int | None, verdict: Verdict, detail: str) -> None:
    assert judge_health(status) == Check("upstream /health", verdict, detail)


def test_models_lists_every_id_and_each_max_model_len() -> None:
    body = {"data": [{"id": "r1", "max_model_len": 131072}, {"id": "proxy-model"}]}
    checks = by_name(judge_models(200, body))
    assert checks["upstream /v1/models"] == Check("upstream /v1/models", "pass", "r1, proxy-model")
    assert checks["max_model_len of r1"].verdict == "info"
    assert checks["max_model_len of r1"].detail == "131,072"
    assert checks["max_model_len of proxy-model"].verdict == "warn"
    assert "not reported" in checks["max_model_len of proxy-model"].detail


@pytest.mark.parametrize(
    ("status", "body", "detail"),
    [
        (200, {"object": "list", "data": []}, "200, no model list"),
        (200, {"object": "list"}, "200, no model list"),
        (404, {"detail": "Not Found"}, "404, no model list"),
        (200, None, "200, no model list"),  # not JSON
        (None, None, "unreachable"),
    ],
    ids=["empty", "no-data", "404", "not-json", "unreachable"],
)
def test_models_fail_without_a_model_list(status: int | None, body: Any, detail: str) -> None:
    assert judge_models(status, body) == [Check("upstream /v1/models", "fail", detail)]


# -- judge_metrics -------------------------------------------------------------------------

NEW_USAGE = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n'
OLD_USAGE = '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{engine="0"} 0.25\n'
RUNNING = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 1.0\n'


def cache_info(*, blocks: int = 2049, block_size: int = 16, prefix: str = "True") -> str:
    labels = (
        f'block_size="{block_size}",cache_dtype="fp8",enable_prefix_caching="{prefix}",'
        f'engine="0",num_gpu_blocks="{blocks}"'
    )
    return f"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{labels}}} 1.0\n"


@pytest.mark.parametrize(
    ("usage", "verdict", "mentions"),
    [
        (NEW_USAGE, "pass", "vllm:kv_cache_usage_perc"),
        (OLD_USAGE, "warn", "only the old vllm:gpu_cache_usage_perc"),
        (RUNNING, "fail", "cannot adapt"),
    ],
    ids=["new-name", "old-name-only", "neither"],
)
def test_the_kv_usage_metric_under_its_new_name_passes(
    usage: str, verdict: str, mentions: str
) -> None:
    checks = by_name(judge_metrics(usage + cache_info()))
    assert checks["upstream /metrics"].verdict == "pass"
    assert checks["KV usage metric"].verdict == verdict
    assert mentions in checks["KV usage metric"].detail


def test_without_cache_config_info_it_asks_for_kv_capacity_tokens() -> None:
    checks = by_name(judge_metrics(NEW_USAGE))
    assert checks["vllm:cache_config_info"].verdict == "warn"
    assert "KV_CAPACITY_TOKENS" in checks["vllm:cache_config_info"].detail
    assert not {"prefix caching", "KV capacity"} & set(checks)  # nothing to judge them by


def test_it_does_not_ask_for_kv_capacity_tokens_already_set() -> None:
    checks = by_name(judge_metrics(NEW_USAGE, configured=120_000))
    assert checks["vllm:cache_config_info"].verdict == "pass"
    assert "KV_CAPACITY_TOKENS=120,000 is set" in checks["vllm:cache_config_info"].detail


@pytest.mark.parametrize(("prefix", "verdict"), [("True", "pass"), ("False", "warn")])
def test_prefix_caching_off_is_a_warning(prefix: str, verdict: str) -> None:
    checks = by_name(judge_metrics(NEW_USAGE + cache_info(prefix=prefix)))
    assert checks["prefix caching"].verdict == verdict
    if verdict == "warn":
        assert "--enable-prefix-caching" in checks["prefix caching"].detail


def test_kv_capacity_is_all_blocks_but_the_null_block() -> None:
    checks = by_name(judge_metrics(NEW_USAGE + cache_info(blocks=1001, block_size=32)))
    assert checks["KV capacity"] == Check("KV capacity", "pass", "32,000 tokens")  # (1001-1)*32
    assert checks["KV cache dtype / block size"] == Check(
        "KV cache dtype / block size", "info", "fp8 / 32"
    )


def test_a_cache_with_only_the_null_block_has_no_capacity() -> None:
    checks = by_name(judge_metrics(NEW_USAGE + cache_info(blocks=1)))
    assert checks["KV capacity"].verdict == "warn"


def test_no_metrics_fails() -> None:
    (check,) = judge_metrics(None)
    assert (check.name, check.verdict) == ("upstream /metrics", "fail")


@pytest.mark.parametrize(
    "text",
    ["<html><body>Welcome to nginx</body></html>\n", 'vllm:kv_cache_usage_perc{engine="0" 0.1\n'],
    ids=["html", "truncated"],
)
def test_metrics_that_are_not_prometheus_text_fail_without_raising(text: str) -> None:
    (check,) = judge_metrics(text)
    assert (check.name, check.verdict) == ("upstream /metrics", "fail")
    assert "not Prometheus text" in check.detail


# -- judge_probe ---------------------------------------------------------------------------

MODEL = "m1"


def configured(parser: str = "deepseek_r1", source: ReasoningSource = "text") -> ModelReasoning:
    return ModelReasoning(lookup(parser), source)


TEXT, UPSTREAM = configured(), configured(source="upstream")


def completion(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}


def reasoning_check(
    message: dict[str, Any], gateway: ModelReasoning, finish_reason: str = "stop"
) -> Check:
    checks = judge_probe(200, completion(message, finish_reason), MODEL, gateway)
    assert checks[0] == Check("probe completion", "pass", "answered")
    (check,) = [c for c in checks if c.name == f"reasoning of {MODEL}"]
    assert len(checks) == 2
    return check


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("reasoning", ["2 plus 2 is 4.", ""], ids=["reasoning", "empty"])
def test_a_reasoning_field_needs_reasoning_source_upstream(field: str, reasoning: str) -> None:
    """Even an empty string: the engine's parser ran (vLLM's deepseek_r1 gives "" when the
    output starts with </think>), and a text-split gateway would take its content for
    reasoning."""
    message = {"role": "assistant", field: reasoning, "content": "Four."}
    check = reasoning_check(message, UPSTREAM)
    assert check.verdict == "pass" and "--reasoning-parser" in check.detail
    check = reasoning_check(message, TEXT)
    assert check.verdict == "fail"
    assert check.detail.startswith("configured text, but the engine separates reasoning")
    assert "a hidden key would get no answer when reasoning is empty" in check.detail
    assert check.detail.endswith(f"set reasoning_source: upstream for model {MODEL}")


def test_a_null_reasoning_field_is_no_reasoning_parser() -> None:
    """vLLM 0.32 writes ``"reasoning": null`` in every message, with a parser or without one
    (docs/development.md, "Against real vLLM"): tags in the content decide."""
    message = {"content": "2 plus 2 is 4.</think>Four.", "reasoning": None}
    assert reasoning_check(message, TEXT).verdict == "pass"
    assert reasoning_check(message, UPSTREAM).verdict == "fail"


@pytest.mark.parametrize(
    ("content", "parser", "reasoning", "answer"),
    [
        ("2 plus 2 is 4.\n</think>\n\nFour.", "deepseek_r1", "2 plus 2 is 4.\n", "\n\nFour."),
        ("<think>\n2 plus 2 is 4.\n</think>\n\nFour.", "deepseek_r1", "\n2 plus 2 is 4.\n",
         "\n\nFour."),
        ("Sure.<think>2 plus 2 is 4.</think>Four.", "think_tags", "2 plus 2 is 4.", "Sure.Four."),
        # A literal <think> in the answer says nothing about how the block was opened.
        ("2 plus 2 is 4.</think>Four. (<think> is a tag)", "deepseek_r1", "2 plus 2 is 4.",
         "Four. (<think> is a tag)"),
        ("2 plus 2 is 4.<|close|>think<|sep|>Four.", "kimi_k3", "2 plus 2 is 4.", "Four."),
        ("<|open|>think<|sep|>2 plus 2 is 4.<|close|>think<|sep|>Four.", "kimi_k3",
         "2 plus 2 is 4.", "Four."),
    ],
    ids=["template", "tags", "text-before-think", "think-in-the-answer", "k3-template", "k3"],
)  # fmt: skip
def test_markers_in_the_text_need_text_and_the_parser_that_splits_them_right(
    content: str, parser: str, reasoning: str, answer: str
) -> None:
    assert split(parser, content) == (reasoning, answer)  # the advice is right
    check = reasoning_check({"content": content}, configured(parser))
    assert check.verdict == "pass"
    assert check.detail.endswith(f"split by REASONING_PARSER={parser} as configured")
    check = reasoning_check({"content": content}, configured(parser, "upstream"))
    assert check.verdict == "fail"
    assert check.detail.startswith("configured upstream, but the engine leaves markers")
    assert "reasoning would reach hidden keys as content" in check.detail
    assert f"reasoning_source: text and REASONING_PARSER={parser} for model {MODEL}," in (
        check.detail
    )


@pytest.mark.parametrize(
    ("content", "ours", "verdict"),
    [
        ("2 plus 2 is 4.</think>Four.", "qwen3", "pass"),  # splits R1's output the same way
        ("2 plus 2 is 4.</think>Four.", "think_tags", "fail"),  # all of it would be the answer
        ("2 plus 2 is 4.</think>Four.", "none", "fail"),
        ("2 plus 2 is 4.</think>Four.", "kimi_k3", "fail"),
        ("2 plus 2 is 4.</think>Four.", "deepseek_v3", "fail"),  # thinking off by default
        ("Sure.<think>2 plus 2 is 4.</think>Four.", "deepseek_r1", "fail"),  # "Sure." hidden
        ("2 plus 2 is 4.<|close|>think<|sep|>Four.", "deepseek_r1", "fail"),
    ],
)
def test_a_configured_text_format_passes_when_it_splits_the_probe_like_the_fitting_one(
    content: str, ours: str, verdict: Verdict
) -> None:
    check = reasoning_check({"content": content}, configured(ours))
    assert check.verdict == verdict
    if verdict == "fail":
        assert check.detail.startswith(f"configured text with REASONING_PARSER={ours}, but")
        assert check.detail.endswith(f": set it for model {MODEL}")


@pytest.mark.parametrize("fmt", [f for f in BUILTIN.values() if f.splits], ids=lambda f: f.name)
def test_the_close_marker_of_every_builtin_text_format_is_seen(fmt: ReasoningFormat) -> None:
    assert fmt.close
    check = reasoning_check({"content": f"2 plus 2 is 4.{fmt.close}Four."}, UPSTREAM)
    assert check.verdict == "fail" and f"leaves markers in the text ({fmt.close})" in check.detail


@pytest.mark.parametrize(
    ("content", "parser"),
    [("<think>\n2 plus 2 is", "think_tags"), ("<|open|>think<|sep|>2 plus 2 is", "kimi_k3")],
    ids=["think", "k3"],
)
def test_an_open_marker_without_a_close_needs_text(content: str, parser: str) -> None:
    message = {"content": content, "reasoning_content": None}
    check = reasoning_check(message, configured(parser), "length")
    assert check.verdict == "pass" and f"REASONING_PARSER={parser} as configured" in check.detail
    check = reasoning_check(message, UPSTREAM, "length")
    assert check.verdict == "fail" and f"REASONING_PARSER={parser} for model" in check.detail


@pytest.mark.parametrize(
    ("gateway", "verdict"),
    [
        (configured("none"), "pass"),
        (configured("deepseek_v3"), "pass"),  # thinking off unless a request asks
        (configured("think_tags"), "pass"),  # no tag, no reasoning
        (UPSTREAM, "pass"),
        (TEXT, "fail"),  # R1's format: the whole answer would be reasoning
    ],
    ids=["none", "deepseek_v3", "think_tags", "upstream", "deepseek_r1"],
)
def test_no_reasoning_in_a_finished_answer_must_leave_the_answer_whole(
    gateway: ModelReasoning, verdict: Verdict
) -> None:
    check = reasoning_check({"content": "Four.", "reasoning": None}, gateway)
    assert check.verdict == verdict
    assert check.detail.startswith("no reasoning in the probe")
    if verdict == "fail":
        assert "REASONING_PARSER=deepseek_r1 takes this answer for reasoning" in check.detail
        assert f"set REASONING_PARSER=none for model {MODEL}" in check.detail


def test_no_tags_in_an_answer_cut_at_max_tokens_is_inconclusive() -> None:
    """An R1 template opened the block: 256 tokens of reasoning with no tag yet is not a model
    that does not reason (``none`` would show its reasoning as the answer)."""
    message = {"content": "Okay, the user asks about 2 + 2. Let me think"}
    check = reasoning_check(message, UPSTREAM, "length")
    assert check.verdict == "warn" and "inconclusive" in check.detail
    assert "REASONING_PARSER=none" not in check.detail
    assert "(configured: upstream, REASONING_PARSER=deepseek_r1)" in check.detail


@pytest.mark.parametrize(
    ("status", "body", "detail"),
    [
        (500, {"error": {"message": "Simulated engine failure", "code": 500}}, "500: Simulated"),
        (404, {"detail": "Not Found"}, "404: no completion in the answer"),
        (200, {"choices": []}, "200: no completion in the answer"),
        (None, None, "unreachable: no completion in the answer"),
    ],
    ids=["error-body", "no-route", "no-choices", "unreachable"],
)
def test_a_probe_without_a_completion_fails(status: int | None, body: Any, detail: str) -> None:
    (check,) = judge_probe(status, body, MODEL, TEXT)
    assert (check.name, check.verdict) == ("probe completion", "fail")
    assert check.detail.startswith(detail)


# -- examine_upstream against the simulator over sockets -----------------------------------


async def probe_text(url: str, model: str) -> str:
    """The content the doctor's probe gets (the same request: the simulator is deterministic)."""
    body = {"model": model, "max_tokens": 256, "temperature": 0,
            "messages": [{"role": "user", "content": doctor.PROBE_PROMPT}]}  # fmt: skip
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{url}/chat/completions", json=body)
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


def right(**overrides: Any) -> Settings:
    """The gateway configured for the simulator's models as their modes need
    (gateway.side.sim.script): template and tags leave </think> in the text, separated is vLLM with
    --reasoning-parser, none does not reason; then ``overrides``."""
    models = {
        "deepseek-r1-parsed": ModelOverride(reasoning_source="upstream"),
        "deepseek-v3": ModelOverride(reasoning_parser="none"),
    }
    fields = {"reasoning_source": "text", "reasoning_parser": "deepseek_r1", "models": models}
    return Settings(**(fields | overrides))


@pytest.mark.parametrize(
    ("model", "detail"),
    [
        ("deepseek-r1", "text: </think> in the content, split by REASONING_PARSER=deepseek_r1 "),
        # <think> first, then </think>: deepseek_r1 drops that first <think> (relay.thinksplit)
        # and splits exactly as think_tags would, and also copes if the model omits it.
        ("qwq-32b", "text: </think> in the content, split by REASONING_PARSER=deepseek_r1 "),
        ("deepseek-r1-parsed", "upstream: the engine separates reasoning"),
        ("deepseek-v3", "no reasoning in the probe; REASONING_PARSER=none leaves the answer"),
    ],
    ids=["template", "tags", "separated", "none"],
)
async def test_the_probe_passes_each_simulated_model_configured_as_it_needs(
    model: str, detail: str
) -> None:
    async with BackgroundServer(create_sim_app(SimConfig())) as sim:
        url = f"{sim.url}/v1"
        checks = by_name(await doctor.examine_upstream(url, right(), model=model))
        tagged = await probe_text(url, model) if detail.startswith("text") else ""
    assert checks["probe completion"].verdict == "pass"
    assert checks[f"reasoning of {model}"].verdict == "pass"
    assert checks[f"reasoning of {model}"].detail.startswith(detail)
    if tagged:  # the configured parser leaves no tag in either channel
        reasoning, answer = split("deepseek_r1", tagged)
        assert reasoning and answer and "think>" not in reasoning + answer
        assert answer == tagged.split("</think>", 1)[1]


@pytest.mark.parametrize(
    ("model", "overrides", "detail"),
    [
        ("deepseek-r1", {"reasoning_source": "upstream"},
         "configured upstream, but the engine leaves markers in the text (</think>)"),
        ("qwq-32b", {"models": {"qwq-32b": ModelOverride(reasoning_source="upstream")}},
         "configured upstream, but the engine leaves markers in the text (</think>)"),
        ("deepseek-r1-parsed", {"models": {}},
         "configured text, but the engine separates reasoning"),
        ("deepseek-v3", {"models": {}},
         "no reasoning in the probe, but configured text with REASONING_PARSER=deepseek_r1"),
    ],
    ids=["template", "tags", "separated", "none"],
)  # fmt: skip
async def test_the_probe_fails_each_simulated_model_configured_the_other_way(
    model: str, overrides: dict[str, Any], detail: str
) -> None:
    settings = right(**overrides)
    async with BackgroundServer(create_sim_app(SimConfig())) as sim:
        checks = by_name(await doctor.examine_upstream(f"{sim.url}/v1", settings, model=model))
    assert checks["probe completion"].verdict == "pass"
    assert checks[f"reasoning of {model}"].verdict == "fail"
    assert checks[f"reasoning of {model}"].detail.startswith(detail)
    assert f"for model {model}" in checks[f"reasoning of {model}"].detail


async def test_a_healthy_simulator_fails_no_upstream_check() -> None:
    config = SimConfig(kv_capacity_tokens=40960, block_size=32, max_model_len=8192)
    async with BackgroundServer(create_sim_app(config)) as sim:
        checks = by_name(await doctor.examine_upstream(f"{sim.url}/v1/", right()))  # trailing /
    assert checks["upstream /health"].verdict == "pass"
    assert checks["upstream /v1/models"].detail == ", ".join(config.models)
    assert checks["max_model_len of deepseek-r1"] == Check(
        "max_model_len of deepseek-r1", "info", "8,192"
    )
    assert checks["KV usage metric"].verdict == "pass"
    assert checks["KV capacity"] == Check("KV capacity", "pass", "40,960 tokens")
    assert checks["KV cache dtype / block size"].detail == "auto / 32"
    assert checks["reasoning of deepseek-r1"].verdict == "pass"  # the first model is probed
    assert {c.verdict for c in checks.values()} <= {"pass", "info", "warn"}


@pytest.mark.parametrize(("prefix_caching", "verdict"), [(True, "pass"), (False, "warn")])
async def test_prefix_caching_as_the_simulator_reports_it(
    prefix_caching: bool, verdict: str
) -> None:
    async with BackgroundServer(create_sim_app(SimConfig(prefix_caching=prefix_caching))) as sim:
        checks = by_name(await doctor.examine_upstream(f"{sim.url}/v1", right()))
    assert checks["prefix caching"].verdict == verdict


async def test_an_engine_failing_every_request_fails_the_probe_only() -> None:
    async with BackgroundServer(create_sim_app(SimConfig(error_rate=1.0))) as sim:
        checks = by_name(
            await doctor.examine_upstream(f"{sim.url}/v1", right(), model="deepseek-r1")
        )
    assert checks["probe completion"] == Check(
        "probe completion", "fail", "500: Simulated engine failure"
    )
    assert "reasoning of deepseek-r1" not in checks
    assert checks["upstream /health"].verdict == checks["KV capacity"].verdict == "pass"


@pytest.mark.parametrize("model", [None, "deepseek-r1"])
async def test_an_unreachable_upstream_fails_without_raising(
    closed_port: int, model: str | None
) -> None:
    url = f"http://127.0.0.1:{closed_port}/v1"
    checks = await doctor.examine_upstream(url, right(), model=model)
    expected = ["upstream /health", "upstream /v1/models", "upstream /metrics"]
    expected += ["probe completion"] if model else []  # no model list: nothing to probe
    assert [c.name for c in checks] == expected
    assert all(c.verdict == "fail" and c.detail.startswith("unreachable") for c in checks)


# -- the command ---------------------------------------------------------------------------


@pytest.fixture
def no_configured_upstreams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THINKGATE_UPSTREAMS", raising=False)
    monkeypatch.delenv("THINKGATE_CONFIG", raising=False)  # a YAML file could name some
    for variable in ("THINKGATE_REASONING_SOURCE", "THINKGATE_REASONING_PARSER"):
        monkeypatch.delenv(variable, raising=False)  # the defaults: text, deepseek_r1


def doctor_cli(*args: str) -> int:
    return main(["doctor", *args])


async def test_the_command_prints_the_table_and_exits_0_when_healthy(
    no_configured_upstreams: None, capsys: pytest.CaptureFixture[str]
) -> None:
    async with BackgroundServer(create_sim_app(SimConfig())) as sim:
        url = f"{sim.url}/v1"
        # The command runs its own event loop (asyncio.run): give it a thread of its own.
        code = await asyncio.to_thread(doctor_cli, "--upstream", url, "--no-gateway")
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0] == f"upstream {url}" and "gateway" not in lines
    assert any(line.split()[:3] == ["PASS", "upstream", "/health"] for line in lines)
    assert any(line.split()[:3] == ["PASS", "KV", "capacity"] for line in lines)
    assert not any(line.lstrip().startswith("FAIL") for line in lines)


@pytest.mark.parametrize(
    ("model", "code"), [("deepseek-r1", 1), ("deepseek-r1-parsed", 0)], ids=["tags", "separated"]
)
async def test_the_command_judges_the_probe_by_the_gateways_reasoning_source(
    no_configured_upstreams: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    code: int,
) -> None:
    monkeypatch.setenv("THINKGATE_REASONING_SOURCE", "upstream")
    async with BackgroundServer(create_sim_app(SimConfig())) as sim:
        argv = ("--upstream", f"{sim.url}/v1", "--model", model, "--no-gateway")
        assert await asyncio.to_thread(doctor_cli, *argv) == code
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "reasoning of" in line]
    assert line.split()[:4] == ["FAIL" if code else "PASS", "reasoning", "of", model]
    assert ("configured upstream, but" in line) == bool(code)


async def test_the_command_exits_1_when_a_check_fails(
    no_configured_upstreams: None, capsys: pytest.CaptureFixture[str], closed_port: int
) -> None:
    url = f"http://127.0.0.1:{closed_port}/v1"
    code = await asyncio.to_thread(doctor_cli, "--upstream", url, "--no-gateway")
    assert code == 1
    out = capsys.readouterr().out
    assert any(line.split()[:3] == ["FAIL", "upstream", "/health"] for line in out.splitlines())


def test_the_command_exits_2_without_an_upstream(
    no_configured_upstreams: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert doctor_cli("--no-gateway") == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "no upstream" in captured.err


# -- examine_gateway: Redis and the database -----------------------------------------------


def gateway_settings(database: str, *, redis: str = "") -> Settings:
    return Settings(database_url=database, redis_url=redis)


async def test_a_redis_that_answers_passes(redis_url: str, sqlite_url: str) -> None:
    checks = by_name(await doctor.examine_gateway(gateway_settings(sqlite_url, redis=redis_url)))
    assert checks["Redis"] == Check("Redis", "pass", "answers")


async def test_an_unreachable_redis_fails(sqlite_url: str, closed_port: int) -> None:
    settings = gateway_settings(sqlite_url, redis=f"redis://127.0.0.1:{closed_port}/0")
    checks = by_name(await doctor.examine_gateway(settings))
    assert checks["Redis"].verdict == "fail" and "unreachable" in checks["Redis"].detail
    assert checks["database"].verdict == "pass"  # one failure does not hide the rest


async def test_without_redis_and_a_ledger_both_are_info(sqlite_url: str) -> None:
    checks = by_name(await doctor.examine_gateway(gateway_settings(sqlite_url)))
    assert checks["Redis"].verdict == "info"
    assert checks["database"] == Check("database", "pass", "answers")
    assert checks["ledger checkpoint"] == Check("ledger checkpoint", "info", "no checkpoint yet")


async def test_an_unreachable_database_fails(closed_port: int) -> None:
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{closed_port}/thinkgate"
    checks = await doctor.examine_gateway(gateway_settings(url))
    assert [c.name for c in checks] == ["Redis", "database"]
    assert checks[1].verdict == "fail" and checks[1].detail.startswith("unreachable")


# -- examine_gateway: the ledger a real gateway wrote --------------------------------------

RECORDS = 3  # a tree of size 3: its frontier is two subtrees, (level 1, 0) and (level 0, 2)


@pytest.fixture
async def ledgered(stack_factory: StackFactory, tmp_path: Path) -> Settings:
    """A gateway (SQLite ledger in ``tmp_path``) that has committed ``RECORDS`` completions;
    the doctor's settings for its database and keys."""
    stack = await stack_factory()
    body = {"model": "deepseek-r1", "max_tokens": 16,
            "messages": [{"role": "user", "content": "What is 2 + 2?"}]}  # fmt: skip
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient(base_url=stack.url, headers=headers, timeout=10) as client:
        for _ in range(RECORDS):
            assert (await client.post("/chat/completions", json=body)).status_code == 200
    database = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"  # where stack_factory puts it
    files: dict[str, Any] = ledger_files(tmp_path)
    settings = Settings(database_url=database, redis_url="", **files)
    engine = create_engine(settings.database_url)
    try:
        await eventually(lambda: signed_size(engine), within_s=10)
        async with engine.connect() as conn:
            assert (
                await conn.execute(select(func.count()).select_from(entries))
            ).scalar() == RECORDS
    finally:
        await engine.dispose()
    return settings


async def signed_size(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        size = (await conn.execute(select(func.max(checkpoints.c.size)))).scalar()
    return bool(size == RECORDS)


async def tamper(settings: Settings, statement: Any) -> None:
    """As a DBA would: drop the write-once triggers, then change a row."""
    engine = create_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            for drop in drop_triggers("sqlite"):
                await conn.exec_driver_sql(drop)
            assert (await conn.execute(statement)).rowcount == 1
    finally:
        await engine.dispose()


async def ledger_check(settings: Settings) -> Check:
    checks = by_name(await doctor.examine_gateway(settings))
    assert checks["database"].verdict == "pass"
    return checks["ledger checkpoint"]


def at(node: NodeID) -> Any:
    return (nodes.c.level == node.level) & (nodes.c.idx == node.index)


async def test_the_last_checkpoint_of_a_real_ledger_passes(ledgered: Settings) -> None:
    check = await ledger_check(ledgered)
    assert check == Check("ledger checkpoint", "pass", "size 3, signed, root matches")


@pytest.mark.parametrize("node", frontier(RECORDS), ids=["subtree-1-0", "leaf-2"])
async def test_a_changed_node_hash_fails(ledgered: Settings, node: NodeID) -> None:
    await tamper(ledgered, update(nodes).where(at(node)).values(hash=b"\x07" * 32))
    check = await ledger_check(ledgered)
    assert check.verdict == "fail" and "root differs" in check.detail


async def test_a_deleted_node_fails(ledgered: Settings) -> None:
    await tamper(ledgered, delete(nodes).where(at(frontier(RECORDS)[0])))
    check = await ledger_check(ledgered)
    assert check.verdict == "fail" and "tree incomplete" in check.detail


async def test_a_checkpoint_signed_by_another_key_fails(ledgered: Settings) -> None:
    ledgered.signing_key_file.unlink()
    create_signing_key(ledgered.signing_key_file)  # same origin, another key
    check = await ledger_check(ledgered)
    assert check.verdict == "fail" and "bad signature" in check.detail


async def test_without_the_signing_key_the_checkpoint_cannot_be_checked(
    ledgered: Settings,
) -> None:
    ledgered.signing_key_file.unlink()
    check = await ledger_check(ledgered)
    assert check.verdict == "warn" and str(ledgered.signing_key_file) in check.detail


def test_with_demo_settings_and_no_upstream_it_examines_the_simulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("THINKGATE_UPSTREAMS", raising=False)
    monkeypatch.setenv("THINKGATE_DEMO", "true")
    assert main(["doctor", "--no-gateway"]) == 0
    out = capsys.readouterr().out
    assert "PASS  probe completion" in out and "deepseek-r1" in out
    monkeypatch.setenv("THINKGATE_DEMO", "false")
    assert main(["doctor", "--no-gateway"]) == 2
