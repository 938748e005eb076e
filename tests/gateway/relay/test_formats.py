"""The format registry: each entry against vLLM 0.32's parser of the same name, the thinking
switch of a request, and the start-up refusal of an impossible or unknown format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.cli.main import main
from gateway.relay.formats import BUILTIN, FormatError, ReasoningFormat, lookup
from gateway.settings import Settings

# The names `vllm serve --reasoning-parser` takes for these families (vllm/reasoning/__init__.py).
VLLM_NAMES = [
    "deepseek_r1", "deepseek_v3", "deepseek_v4", "qwen3", "kimi_k2", "kimi_k3", "minimax_m2",
    "glm45", "openai_gptoss",
]  # fmt: skip


def test_the_registry_has_every_family_by_vllms_name_and_the_two_of_our_own() -> None:
    assert set(BUILTIN) == {*VLLM_NAMES, "think_tags", "none"}
    assert all(BUILTIN[name].name == name for name in BUILTIN)


OFF = {"chat_template_kwargs": {"thinking": False}}
OFF_QWEN = {"chat_template_kwargs": {"enable_thinking": False}}
ON = {"chat_template_kwargs": {"thinking": True}}
EFFORT_NONE = {"reasoning_effort": "none"}
EFFORT_LOW = {"reasoning_effort": "low"}

# (format, request fields, thinking?) as vLLM's parser of that name decides it
THINKING: list[tuple[str, dict[str, Any], bool]] = [
    ("deepseek_r1", {}, True),
    ("deepseek_r1", OFF, True),  # R1's template has no switch: it reasons anyway
    ("deepseek_r1", EFFORT_NONE, True),
    ("deepseek_v3", {}, False),  # vLLM's deepseek_v3 parser: thinking defaults to off
    ("deepseek_v3", ON, True),
    ("deepseek_v3", {"chat_template_kwargs": {"enable_thinking": True}}, True),
    ("deepseek_v3", {**ON, **EFFORT_NONE}, True),  # the explicit switch decides
    ("deepseek_v4", {}, True),  # on unless switched off
    ("deepseek_v4", OFF, False),
    ("deepseek_v4", EFFORT_NONE, False),
    # off must never be wrong: the template reads only false as off, and vLLM thinks when
    # either key is on; effort inside the template's kwargs is not the request's effort
    ("deepseek_v4", {"chat_template_kwargs": {"reasoning_effort": "none"}}, True),
    ("glm45", {"chat_template_kwargs": {"thinking": False, "enable_thinking": True}}, True),
    ("kimi_k2", {"chat_template_kwargs": {"enable_thinking": False, "thinking": True}}, True),
    ("qwen3", {"chat_template_kwargs": {"enable_thinking": 0}}, True),
    ("qwen3", {"chat_template_kwargs": {"enable_thinking": ""}}, True),
    ("deepseek_v3", {"chat_template_kwargs": {"thinking": 0}}, True),
    ("glm45", {"chat_template_kwargs": {"thinking": False, "enable_thinking": False}}, False),
    ("deepseek_v4", EFFORT_LOW, True),
    ("qwen3", {}, True),
    ("qwen3", OFF_QWEN, False),
    ("qwen3", OFF, True),  # Qwen3's template reads enable_thinking only
    ("qwen3", EFFORT_NONE, False),  # vLLM maps it onto enable_thinking for the template
    ("kimi_k2", OFF, False),
    ("kimi_k2", OFF_QWEN, False),
    ("kimi_k3", {}, True),
    ("kimi_k3", OFF, False),
    ("kimi_k3", EFFORT_NONE, False),
    ("glm45", OFF_QWEN, False),
    ("minimax_m2", OFF, True),
    ("think_tags", OFF, True),
    ("deepseek_v4", {"chat_template_kwargs": "not an object"}, True),
    ("deepseek_v4", {"chat_template_kwargs": {"thinking": None}}, True),
]


@pytest.mark.parametrize(("name", "params", "thinking"), THINKING)
def test_thinking_is_decided_per_request_as_the_family_decides_it(
    name: str, params: dict[str, Any], thinking: bool
) -> None:
    assert BUILTIN[name].thinking(params) is thinking


def test_lookup_names_the_model_and_every_known_format() -> None:
    with pytest.raises(FormatError) as info:
        lookup("deepseek_r2", model="m1")
    message = str(info.value)
    assert "'deepseek_r2'" in message and "'m1'" in message
    assert all(name in message for name in BUILTIN)


@pytest.mark.parametrize(
    "fields",
    [
        {"open": "<r>", "close": "<r>x"},  # a marker that is a prefix of another
        {"close": "[/THINK]", "ends": ("THINK",)},  # one inside another
        {"open": "<reason>", "ends": ("reas",)},
        {"open": "<t>", "close": "<t>"},  # the same marker twice
        {"ends": ("</think>x",)},
        {"close": ""},
        {"close": None, "open": "<r>"},
    ],
)
def test_impossible_formats_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        ReasoningFormat("mine", **fields)


def write_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    monkeypatch.setenv("THINKGATE_CONFIG", str(config))


def test_a_model_entry_may_name_a_format_a_source_and_its_own_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(tmp_path, monkeypatch, (
        "reasoning_parser: qwen3\n"
        "models:\n"
        "  k3: {reasoning_parser: kimi_k3, reasoning_source: upstream}\n"
        "  mine: {reasoning_format: {open: '<reason>', close: '</reason>', opened: false}}\n"
        "  gpt: {reasoning_parser: openai_gptoss}\n"
    ))  # fmt: skip
    s = Settings()
    k3 = s.reasoning_for("k3")
    assert (k3.format, k3.source) == (BUILTIN["kimi_k3"], "upstream")
    mine = s.reasoning_for("mine").format
    assert (mine.name, mine.open, mine.close, mine.opened) == (
        "mine",
        "<reason>",
        "</reason>",
        False,
    )
    assert mine.ends == BUILTIN["qwen3"].ends  # the rest comes from the named (global) format
    assert s.reasoning_for("gpt").source == "upstream"  # no text markers: always the fields
    assert s.reasoning_for("other").format.name == "qwen3"
    assert s.reasoning_for("other").source == "text"


@pytest.mark.parametrize(
    ("yaml", "says"),
    [
        ("models:\n  m1: {reasoning_parser: deepseek_r2}\n",
         "unknown reasoning parser 'deepseek_r2' for model 'm1'"),
        ("models:\n  m1: {reasoning_format: {open: '<a>', close: '<a>b'}}\n",
         "reasoning format of 'm1': marker '<a>' is inside '<a>b'"),
        ("models:\n  m1: {reasoning_format: {open: 3}}\n", "models.m1.reasoning_format.open"),
        ("models:\n  m1: {reasoning_parser: openai_gptoss, reasoning_source: text}\n",
         "use reasoning_source 'upstream'"),
        ("reasoning_parser: nope\n", "unknown reasoning parser 'nope'"),
        ("reasoning_source: engine\n", "reasoning_source"),
    ],
)  # fmt: skip
def test_a_bad_format_stops_the_start_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    yaml: str, says: str,
) -> None:  # fmt: skip
    write_config(tmp_path, monkeypatch, yaml)
    with pytest.raises(ValidationError):
        Settings()
    assert main(["serve", "--upstream", "http://127.0.0.1:9/v1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("thinkgate: invalid configuration: ") and says in err
    if "known" in err:
        assert all(name in err for name in BUILTIN)
