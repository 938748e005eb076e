"""The budget rules of ``gateway.relay.effort`` and their settings: the smallest limit wins,
room is kept for the answer, who keeps the budget follows from the model, bad input is the
client's error; the continuation request and its prefix per format."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.api import responses
from gateway.errors import InvalidRequest
from gateway.relay.effort import (
    DEFAULT_BUDGETS,
    EFFORTS,
    ENGINE_SLACK,
    Budget,
    EffortRule,
    continuation_body,
    continuation_prefix,
    plan,
)
from gateway.relay.formats import BUILTIN
from gateway.settings import Settings

RULE = EffortRule({**DEFAULT_BUDGETS, "low": 100}, "gateway", 0.25)


def budget(params: dict[str, Any], max_tokens: int = 4096, ceiling: int | None = None,
           thinking: bool = True) -> int | None:  # fmt: skip
    found = plan(RULE, params, max_tokens, ceiling, thinking=thinking)
    return None if found is None else found.tokens


@pytest.mark.parametrize(
    ("params", "max_tokens", "ceiling", "expected"),
    [
        ({}, 4096, None, None),  # nothing asked, no ceiling: no budget
        ({"reasoning_effort": "low"}, 4096, None, 100),
        ({"reasoning_effort": "high"}, 4096, None, 3072),  # room: 4096 - 1024 for the answer
        ({"reasoning_effort": "high"}, 100000, None, 16384),
        ({"reasoning_effort": "low"}, 4096, 40, 40),  # the key's ceiling
        ({}, 4096, 40, 40),  # a ceiling alone is a budget
        ({"thinking_token_budget": 7}, 4096, None, 7),
        ({"thinking_token_budget": 700, "reasoning_effort": "low"}, 4096, None, 100),
        ({"reasoning_effort": "low"}, 10, None, 7),  # 10 - ceil(2.5)
        ({"reasoning_effort": "none"}, 4096, None, 0),  # a model that cannot stop thinking
        ({"reasoning_effort": "low"}, 1, None, 0),
    ],
)
def test_the_smallest_limit_wins_and_room_is_kept_for_the_answer(
    params: dict[str, Any], max_tokens: int, ceiling: int | None, expected: int | None
) -> None:
    assert budget(params, max_tokens, ceiling) == expected


def test_the_responses_parser_knows_the_same_efforts() -> None:
    assert responses.EFFORTS == EFFORTS


def test_a_request_that_does_not_think_has_no_budget() -> None:
    assert budget({"reasoning_effort": "low"}, thinking=False) is None


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"reasoning_effort": 3}, "reasoning_effort"),
        ({"thinking_token_budget": -1}, "thinking_token_budget"),
        ({"thinking_token_budget": 1.5}, "thinking_token_budget"),
        ({"thinking_token_budget": True}, "thinking_token_budget"),
    ],
)
def test_bad_values_are_the_clients_error(params: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        budget(params, thinking=False)  # checked even when thinking is off
    assert caught.value.param == param


def test_who_keeps_it_decides_what_goes_upstream_and_where_the_gateway_cuts() -> None:
    body = {"model": "m", "stream": True, "thinking_token_budget": 9}
    engine, gateway, none = (Budget(50, kind) for kind in ("engine", "gateway", "none"))
    assert engine.upstream_fields(body)["thinking_token_budget"] == 50
    assert engine.cut_at == 50 + ENGINE_SLACK
    sent = gateway.upstream_fields(body)
    assert "thinking_token_budget" not in sent and gateway.cut_at == 50
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert none.upstream_fields(body) == {"model": "m", "stream": True}
    assert none.cut_at is None


@pytest.mark.parametrize(
    ("fmt", "reasoning", "prefix"),
    [
        ("deepseek_r1", "Let me see.", "<think>\nLet me see.\n</think>\n\n"),
        ("deepseek_r1", "Lines.\n", "<think>\nLines.\n</think>\n\n"),
        ("deepseek_r1", "", "<think>\n</think>\n\n"),
        ("kimi_k3", "Hm.", "<|open|>think<|sep|>\nHm.\n<|close|>think<|sep|>\n\n"),
        ("think_tags", "Hm.", "Hm.\n</think>\n\n"),  # the model opens the block itself
    ],
)
def test_the_continuation_prefix_closes_the_reasoning_in_the_formats_markers(
    fmt: str, reasoning: str, prefix: str
) -> None:
    assert continuation_prefix(BUILTIN[fmt], reasoning) == prefix


def test_the_continuation_continues_the_same_turn_with_what_is_left() -> None:
    body = {
        "model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "thinking_token_budget": 5, "max_completion_tokens": 50, "temperature": 0,
    }  # fmt: skip
    out = continuation_body(body, "<think>\nr\n</think>\n\n", spent=20, max_tokens=50)
    prefix = {"role": "assistant", "content": "<think>\nr\n</think>\n\n"}
    assert out["messages"] == [*body["messages"], prefix]
    assert out["continue_final_message"] is True and out["add_generation_prompt"] is False
    assert out["max_tokens"] == 30 and "max_completion_tokens" not in out
    assert "thinking_token_budget" not in out and out["temperature"] == 0
    assert out["stream_options"] == {"include_usage": True}
    assert continuation_body(body, "p", spent=60, max_tokens=50)["max_tokens"] == 1


def test_settings_choose_who_keeps_it_per_model() -> None:
    settings = Settings(
        effort_budgets={"low": 10},
        models={
            "parsed": {"reasoning_source": "upstream"},
            "plain": {"reasoning_parser": "none"},
            "mine": {"effort_enforcement": "none", "effort_budgets": {"low": 3}},
        },
    )
    assert settings.reasoning_for("r1").effort.enforcement == "gateway"
    assert settings.reasoning_for("parsed").effort.enforcement == "engine"
    assert settings.reasoning_for("plain").effort.enforcement == "none"  # no markers to close
    mine = settings.reasoning_for("mine").effort
    assert (mine.enforcement, mine.budgets["low"], mine.budgets["high"]) == ("none", 3, 16384)
    assert settings.reasoning_for("r1").effort.budgets["low"] == 10


@pytest.mark.parametrize(
    "overrides",
    [
        {
            "models": {
                "gptoss": {
                    "reasoning_parser": "openai_gptoss",
                    "reasoning_source": "upstream",
                    "effort_enforcement": "gateway",
                }
            }
        },
        {"effort_budgets": {"extreme": 5}},
        {"models": {"m": {"effort_budgets": {"low": -1}}}},
        {"reasoning_answer_share": 1.0},
    ],
)
def test_impossible_effort_settings_stop_the_start(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Settings(**overrides)


def test_a_keys_ceiling_comes_from_its_policy() -> None:
    settings = Settings(keys={"abc": {"max_reasoning_tokens": 64}})
    assert settings.reasoning_ceiling("abc") == 64
    assert settings.reasoning_ceiling("other") is None
