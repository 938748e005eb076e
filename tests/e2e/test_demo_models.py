"""Every model the demo lists behaves as the README says: the simulated models with the formats
``--demo`` configures for them (``gateway.app.DEMO_MODELS``); for each, a visible key gets the
answer in ``content`` (and reasoning only where the model reasons), a hidden key the same
answer and no reasoning; both are about the question asked. In an agent's tool loop each calls
the tool that fits, then answers its result in prose (``gateway.side.sim.tools``)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from gateway.app import DEMO_MODELS
from gateway.side.sim.config import SimConfig

# the simulated models that chat (the guard model answers with verdicts: tests/gateway/side/sim)
CHAT_MODELS = sorted(set(SimConfig().models) - set(SimConfig().guards))
REASONS = {"deepseek-r1": True, "qwq-32b": True, "deepseek-r1-parsed": True,
           "deepseek-v3": False, "qwen3": True, "kimi-k3": True, "minimax-m2": True}  # fmt: skip


@pytest.mark.parametrize("model", CHAT_MODELS)
async def test_each_demo_model_answers_in_content_for_every_key(
    stack_factory: Any, model: str
) -> None:
    stack = await stack_factory(models={m: o.model_dump(exclude_none=True)
                                        for m, o in DEMO_MODELS.items()})  # fmt: skip
    answers = {}
    for key in ("visible", "hidden"):
        async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys[key],
                                      max_retries=0) as client:  # fmt: skip
            message = (await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Why is the sky blue?"}],
                max_tokens=2000,
            )).choices[0].message  # fmt: skip
        reasoning = (message.model_extra or {}).get("reasoning_content")
        assert message.content, (model, key)
        assert bool(reasoning) == (key == "visible" and REASONS[model]), (model, key, reasoning)
        assert "the sky" in message.content.lower() and "blue" in message.content  # on topic
        assert not reasoning or "“Why is the sky blue?”" in reasoning
        answers[key] = message.content
    assert answers["visible"] == answers["hidden"]


REMINDER = "<system-reminder>\nToday's date is 2026-01-01. Keep answers short.\n</system-reminder>"
TOOLS: list[Any] = [
    {"type": "function", "function": {
        "name": "Bash", "description": "Executes a bash command and returns its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
]  # fmt: skip


def run_tool(name: str, arguments: str) -> str:
    assert name == "get_weather" and json.loads(arguments) == {"city": "sim"}
    return "Sunny, 24 °C\nwind: light"


@pytest.mark.parametrize("model", CHAT_MODELS)
async def test_an_agent_loop_calls_once_and_ends_in_prose_about_the_result(
    stack_factory: Any, model: str
) -> None:
    """``make run`` as an agent's engine: the question comes among reminders with tools the
    agent offers; the model calls the tool that fits, then answers its result in prose and
    the loop ends (a loop that would not end fails here, it does not hang)."""
    stack = await stack_factory(models={m: o.model_dump(exclude_none=True)
                                        for m, o in DEMO_MODELS.items()})  # fmt: skip
    messages: list[Any] = [
        {"role": "system", "content": "You are an agent. Use the tools."},
        {"role": "user", "content": [{"type": "text", "text": REMINDER},
                                     {"type": "text", "text": "What is the weather in Paris?"}]},
    ]  # fmt: skip
    finishes = []
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        for _ in range(4):
            choice = (await client.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, max_tokens=2000,
            )).choices[0]  # fmt: skip
            finishes.append(choice.finish_reason)
            calls = choice.message.tool_calls or []
            if not calls:
                break
            messages.append({"role": "assistant", "content": choice.message.content,
                             "tool_calls": [c.model_dump() for c in calls]})  # fmt: skip
            messages += [
                {"role": "tool", "tool_call_id": c.id,
                 "content": run_tool(c.function.name, c.function.arguments)}  # type: ignore[union-attr]
                for c in calls
            ]  # fmt: skip
    assert finishes == ["tool_calls", "stop"], model
    answer = (choice.message.content or "").lstrip()  # R1 templates: "\n\n" after the tag
    assert answer.startswith("The get_weather tool returned “Sunny, 24 °C”. "), answer
    assert "weather" in answer and "system-reminder" not in answer and "2026" not in answer
