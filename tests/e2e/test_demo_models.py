"""Every model the demo lists behaves as the README says: the simulated models with the formats
``--demo`` configures for them (``gateway.app.DEMO_MODELS``); for each, a visible key gets the
answer in ``content`` (and reasoning only where the model reasons), a hidden key the same
answer and no reasoning; both are about the question asked."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.app import DEMO_MODELS
from gateway.sim.config import SimConfig

REASONS = {"deepseek-r1": True, "qwq-32b": True, "deepseek-r1-parsed": True,
           "deepseek-v3": False, "qwen3": True, "kimi-k3": True, "minimax-m2": True}  # fmt: skip


@pytest.mark.parametrize("model", sorted(SimConfig().models))
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
