"""Reasoning effort budgets end to end, through the real ``openai`` SDK against the simulator:
the gateway cutting the reasoning at its budget and having the engine continue with the answer
(chat and Responses, streamed and whole), the engine keeping it (``thinking_token_budget``
sent) with the gateway's backstop, the key's ceiling, room kept for the answer, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from gateway.cli.keys import open_store
from gateway.relay.effort import ENGINE_SLACK
from gateway.settings import Settings
from gateway.side.sim.app import SimApp
from gateway.side.sim.script import compose, derive_seed
from tests.e2e.conftest import RecordingSink, Stack

# the scripted model: 40 reasoning tokens, then the answer (R1's template opened the block)
STEPS = 40
SCRIPT = [*["step "] * STEPS, "</think>", "\n\n", "Final", " answer", "."]
# the same behind an engine that separates reasoning itself (vLLM with --reasoning-parser)
SEPARATED = [
    *[["reasoning", "step "]] * STEPS,
    *[["content", t] for t in ("Final", " answer", ".")],
]
QUESTION = [{"role": "user", "content": "Think, then answer."}]
BUDGETS = {"low": 5, "medium": 12}


def sdk(stack: Stack, key: str = "visible") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys[key], max_retries=0)


def received(stack: Stack) -> list[dict[str, Any]]:
    assert isinstance(stack.sim, SimApp)
    return list(stack.sim.sim.received)


def scripted(script: list[Any] = SCRIPT, **extra: Any) -> dict[str, Any]:
    return {"sim": {"chunks": script}, **extra}


@pytest.fixture
async def gated(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink, effort_budgets=BUDGETS)
    return stack, sink


async def streamed_chat(
    stack: Stack, key: str = "visible", script: list[Any] = SCRIPT, **params: Any
) -> list[Any]:
    async with sdk(stack, key) as client:
        stream = await client.chat.completions.create(
            model=params.pop("model", "deepseek-r1"), messages=QUESTION, stream=True,
            stream_options={"include_usage": True}, extra_body=scripted(script), **params,
        )  # fmt: skip
        return [chunk async for chunk in stream]


def joined(chunks: list[Any], field: str) -> str:
    texts = []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            texts.append(getattr(delta, field, None) or (delta.model_extra or {}).get(field) or "")
    return "".join(texts)


async def test_a_streamed_chat_reasoning_ends_at_its_budget_and_the_answer_follows(
    gated: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = gated
    chunks = await streamed_chat(stack, reasoning_effort="low")
    reasoning, content = joined(chunks, "reasoning_content"), joined(chunks, "content")
    assert reasoning == "step " * BUDGETS["low"]
    assert content == "Final answer."
    assert len({c.id for c in chunks}) == 1  # the continuation's chunks keep the stream's id
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert finishes == ["stop"]
    usage = chunks[-1].usage
    assert usage.completion_tokens_details.reasoning_tokens == BUDGETS["low"]
    assert usage.completion_tokens == BUDGETS["low"] + 3  # the cut turn + the answer's tokens
    first, continuation = received(stack)[-2:]
    assert "thinking_token_budget" not in first  # this engine keeps none: the gateway does
    assert continuation["continue_final_message"] is True
    assert continuation["add_generation_prompt"] is False
    assert continuation["messages"][:-1] == first["messages"]
    prefix = continuation["messages"][-1]
    assert prefix == {"role": "assistant", "content": f"<think>\n{reasoning}\n</think>\n\n"}
    assert continuation["max_tokens"] == 4096 - BUDGETS["low"]  # DEFAULT_MAX_TOKENS shared
    [record] = await sink.wait_for(1)
    assert (record.reasoning, record.content) == ((reasoning,), (content,))
    assert record.usage is not None and record.usage.completion_tokens == usage.completion_tokens


async def test_a_hidden_key_gets_the_answer_after_a_cut_and_no_reasoning(
    gated: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = gated
    chunks = await streamed_chat(stack, "hidden", reasoning_effort="low")
    assert joined(chunks, "reasoning_content") == "" and b"step" not in orjson.dumps(
        [c.model_dump() for c in chunks]
    )
    assert joined(chunks, "content") == "Final answer."
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == BUDGETS["low"]


async def test_a_whole_chat_completion_is_cut_the_same_way(
    gated: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = gated
    async with sdk(stack) as client:
        whole = await client.chat.completions.create(
            model="deepseek-r1", messages=QUESTION, reasoning_effort="medium",
            extra_body=scripted(),
        )  # fmt: skip
    message = whole.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == "step " * BUDGETS["medium"]
    assert message.content == "Final answer."
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == BUDGETS["medium"]
    first, continuation = received(stack)[-2:]
    assert first["stream"] is True  # only a stream can be cut while it comes
    assert continuation["continue_final_message"] is True
    [record] = await sink.wait_for(1)
    assert record.content == ("Final answer.",) and record.status == "ok"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_responses_effort_is_a_budget(
    gated: tuple[Stack, RecordingSink], stream: bool
) -> None:
    """The Responses API takes no ``sim`` field: the simulator's own text for the prompt."""
    stack, _ = gated
    prompt = "Think, then answer."
    async with sdk(stack) as client:
        if stream:
            async with client.responses.stream(
                model="deepseek-r1", input=prompt, reasoning={"effort": "low"}
            ) as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.create(
                model="deepseek-r1", input=prompt, reasoning={"effort": "low"}
            )
    [reasoning] = [i for i in response.output if i.type == "reasoning"]
    [text] = [c.text for c in reasoning.content or []]
    assert compose(derive_seed(prompt), prompt).reasoning.startswith(text) and text
    continuation = received(stack)[-1]["messages"][-1]
    assert continuation["content"] == f"<think>\n{text}\n</think>\n\n"
    assert response.output_text and response.status == "completed"
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == BUDGETS["low"]


async def test_no_effort_means_no_budget(gated: tuple[Stack, RecordingSink]) -> None:
    stack, _ = gated
    chunks = await streamed_chat(stack)
    assert joined(chunks, "reasoning_content") == "step " * STEPS
    assert len(received(stack)) == 1  # no continuation


async def test_a_budget_keeps_room_for_the_answer(gated: tuple[Stack, RecordingSink]) -> None:
    """ "high" has no entry here, so the default (16,384) applies; max_tokens 24 keeps 6 for
    the answer: the reasoning may take 18."""
    stack, _ = gated
    chunks = await streamed_chat(stack, reasoning_effort="high", max_tokens=24)
    assert joined(chunks, "reasoning_content") == "step " * 18
    assert joined(chunks, "content") == "Final answer."
    assert received(stack)[-1]["max_tokens"] == 24 - 18


async def test_the_key_ceiling_caps_every_budget(stack_factory: Any, tmp_path: Path) -> None:
    """The key is made first (its id names its policy), in the database the stack then uses."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    async with open_store(Settings(database_url=url)) as store:
        new, _ = await store.create(tenant="acme", role="client", reasoning="visible")
    policy = {new.key_id: {"max_reasoning_tokens": 3}}
    stack = await stack_factory(effort_budgets=BUDGETS, keys=policy)
    stack.keys["capped"] = new.secret
    chunks = await streamed_chat(stack, "capped", reasoning_effort="medium")
    assert joined(chunks, "reasoning_content") == "step " * 3
    chunks = await streamed_chat(stack, "capped")
    assert joined(chunks, "reasoning_content") == "step " * 3  # a ceiling needs no effort
    chunks = await streamed_chat(stack, "visible", reasoning_effort="medium")
    assert joined(chunks, "reasoning_content") == "step " * BUDGETS["medium"]  # its own


async def test_an_engine_kept_budget_is_sent_upstream_and_backed_by_the_gateway(
    stack_factory: Any,
) -> None:
    """``reasoning_source: upstream`` (the engine runs a reasoning parser): the budget goes up as
    ``thinking_token_budget``; this engine ignores it, so the gateway ends the reasoning once
    it runs ``ENGINE_SLACK`` past the budget."""
    stack = await stack_factory(
        effort_budgets=BUDGETS, models={"deepseek-r1-parsed": {"reasoning_source": "upstream"}}
    )
    chunks = await streamed_chat(
        stack, model="deepseek-r1-parsed", script=SEPARATED, reasoning_effort="low"
    )
    assert joined(chunks, "reasoning_content") == "step " * (BUDGETS["low"] + ENGINE_SLACK)
    assert joined(chunks, "content") == "Final answer."
    first, continuation = received(stack)[-2:]
    assert first["thinking_token_budget"] == BUDGETS["low"]
    assert "thinking_token_budget" not in continuation


async def test_effort_none_on_a_model_that_always_thinks_leaves_no_reasoning(
    gated: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = gated
    chunks = await streamed_chat(stack, reasoning_effort="none")
    assert joined(chunks, "reasoning_content") == ""
    assert joined(chunks, "content") == "Final answer."
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking_token_budget": -1}, "thinking_token_budget"),
        ({"thinking_token_budget": "many"}, "thinking_token_budget"),
    ],
)
async def test_a_bad_effort_or_budget_is_the_clients_error(
    gated: tuple[Stack, RecordingSink], extra: dict[str, Any], param: str
) -> None:
    stack, _ = gated
    async with sdk(stack) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="deepseek-r1", messages=QUESTION, extra_body=extra
            )
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param  # type: ignore[index]
    assert received(stack) == []  # refused before the engine was asked


async def test_a_client_budget_below_the_effort_wins(gated: tuple[Stack, RecordingSink]) -> None:
    stack, _ = gated
    async with sdk(stack) as client:
        stream = await client.chat.completions.create(
            model="deepseek-r1", messages=QUESTION, stream=True, reasoning_effort="medium",
            extra_body=scripted(thinking_token_budget=2),
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
    assert joined(chunks, "reasoning_content") == "step " * 2
    assert "thinking_token_budget" not in received(stack)[0]
