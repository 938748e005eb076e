"""Reasoning formats and sources through the gateway, driven by the real ``openai`` SDK against
the simulator: the hidden answer that vanished (a separating engine with an empty reasoning),
hybrid models with thinking off, and the markers of other families split by thinkgate."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.ledger.sink import record_facts
from gateway.side.sim.app import SimConfig
from gateway.side.sim.script import compose
from tests.e2e.conftest import RecordingSink, Stack

SEED = 7
MESSAGES: list[Any] = [{"role": "user", "content": "Hi"}]
MODELS = {
    "deepseek-r1-parsed": {"reasoning_source": "upstream"},
    # a hybrid behind vLLM's deepseek_r1 parser, which knows no thinking switch
    "deepseek-v4-parsed": {"reasoning_source": "upstream", "reasoning_parser": "deepseek_v4"},
    "qwen3": {"reasoning_parser": "qwen3"},
    "kimi-k3": {"reasoning_parser": "kimi_k3"},
    "minimax-m2": {"reasoning_parser": "minimax_m2"},
    "deepseek-r1": {"reasoning_parser": "deepseek_v4"},  # R1's output, a hybrid's switch
}


@pytest.fixture
async def formats(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    sim = SimConfig(models={**SimConfig().models, "deepseek-v4-parsed": "separated"})
    stack = await stack_factory(sim=sim, sink=sink, models=MODELS)
    return stack, sink


def reasoning_of(obj: Any) -> str | None:
    value = (obj.model_extra or {}).get("reasoning_content")
    return value if isinstance(value, str) else None


async def ask(
    stack: Stack, key: str, model: str, *, stream: bool, **extra: Any
) -> tuple[str | None, str | None, str]:
    """(reasoning, content, raw JSON of everything received) for one request."""
    async with openai.AsyncOpenAI(
        base_url=stack.url, api_key=stack.keys[key], max_retries=0
    ) as client:
        body: dict[str, Any] = {"model": model, "messages": MESSAGES, "seed": SEED, **extra}
        if not stream:
            whole = await client.chat.completions.create(**body)
            message = whole.choices[0].message
            return reasoning_of(message), message.content, whole.model_dump_json()
        chunks = [c async for c in await client.chat.completions.create(**body, stream=True)]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(reasoning_of(d) or "" for d in deltas) or None
    content = "".join(d.content or "" for d in deltas) or None
    return reasoning, content, "".join(c.model_dump_json() for c in chunks)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_the_answer_after_an_empty_reasoning_reaches_every_key(
    formats: tuple[Stack, RecordingSink], key: str, stream: bool
) -> None:
    # vLLM --reasoning-parser deepseek_r1 swallows a lone </think> and sends only content.
    stack, sink = formats
    sim = {"sim": {"empty_reasoning": True}}
    reasoning, content, _ = await ask(
        stack, key, "deepseek-r1-parsed", stream=stream, extra_body=sim
    )
    assert (reasoning, content) == (None, compose(SEED, MESSAGES[-1]["content"]).answer)
    (record,) = await sink.wait_for(1)
    assert record.content == (
        compose(SEED, MESSAGES[-1]["content"]).answer,
    ) and record.reasoning == ("",)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_separating_engine_with_reasoning_still_separates(
    formats: tuple[Stack, RecordingSink], stream: bool
) -> None:
    stack, _ = formats
    reasoning, content, _ = await ask(stack, "visible", "deepseek-r1-parsed", stream=stream)
    text = compose(SEED, MESSAGES[-1]["content"])
    assert (reasoning, content) == (text.reasoning, text.answer)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("key", ["visible", "hidden"])
@pytest.mark.parametrize(
    ("model", "switch"),
    [
        ("deepseek-v4-parsed", {"thinking": False}),  # the engine's parser calls it reasoning
        ("deepseek-r1", {"thinking": False}),
        ("deepseek-r1", {"enable_thinking": False}),
    ],
)
async def test_thinking_off_is_all_answer_and_the_record_says_so(
    formats: tuple[Stack, RecordingSink], model: str, switch: dict[str, Any], key: str,
    stream: bool,
) -> None:  # fmt: skip
    stack, sink = formats
    extra = {"extra_body": {"chat_template_kwargs": switch}}
    reasoning, content, raw = await ask(stack, key, model, stream=stream, **extra)
    assert (reasoning, content) == (None, compose(SEED, MESSAGES[-1]["content"]).answer)
    assert '"reasoning":"' not in raw and '"reasoning_content":"' not in raw
    (record,) = await sink.wait_for(1)
    assert record.thinking is False and record.reasoning == ("",)
    facts = record_facts(record, "full")
    assert facts.thinking is False
    assert facts.reasoning_format == MODELS[model].get("reasoning_parser", "deepseek_r1")


async def test_reasoning_effort_none_switches_a_hybrid_off_but_not_r1(
    stack_factory: Any,
) -> None:
    # R1's template has no switch: its reasoning must not reach a hidden key as the answer.
    stack = await stack_factory(models={"deepseek-r1-parsed": {"reasoning_source": "upstream"}})
    sim = {"sim": {"chunks": [["reasoning", "secret plan"], ["content", "Answer"]]}}
    reasoning, content, raw = await ask(
        stack, "hidden", "deepseek-r1-parsed", stream=True, reasoning_effort="none",
        extra_body=sim,
    )  # fmt: skip
    assert (reasoning, content) == (None, "Answer") and "secret" not in raw
    hybrid = await stack_factory(
        models={"deepseek-r1-parsed": {"reasoning_source": "upstream", "reasoning_parser": "qwen3"}}
    )
    reasoning, content, _ = await ask(
        hybrid, "hidden", "deepseek-r1-parsed", stream=True, reasoning_effort="none"
    )
    assert (reasoning, content) == (None, compose(SEED, MESSAGES[-1]["content"]).answer)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(
    ("model", "opening"),
    [("qwen3", "<think>\n"), ("kimi-k3", ""), ("minimax-m2", "")],
)
async def test_other_families_markers_are_split_by_thinkgate(
    formats: tuple[Stack, RecordingSink], model: str, opening: str, stream: bool
) -> None:
    stack, _ = formats
    text = compose(SEED, MESSAGES[-1]["content"])
    shown = await ask(stack, "visible", model, stream=stream)
    # the marker goes, the newline after it stays: thinkgate never trims whitespace
    expected = opening.removeprefix("<think>") + text.reasoning + "\n"
    assert shown[:2] == (expected, "\n\n" + text.answer)
    hidden = await ask(stack, "hidden", model, stream=stream)
    assert hidden[:2] == (None, "\n\n" + text.answer)
    assert "think" not in hidden[2].replace("reasoning_tokens", "")


async def test_qwen3_tool_call_in_reasoning_ends_it_and_stays_in_the_content(
    formats: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = formats
    chunks = ["<think>", "I will", " call", "<tool", "_call>", '{"name": "f"}', "</tool_call>"]
    reasoning, content, _ = await ask(
        stack, "visible", "qwen3", stream=True, extra_body={"sim": {"chunks": chunks}}
    )
    assert (reasoning, content) == ("I will call", '<tool_call>{"name": "f"}</tool_call>')
