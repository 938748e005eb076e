"""Legacy completions and embeddings through the real ``openai`` SDK against the simulator: the
raw prompt goes to the engine's own ``/v1/completions`` (never a chat template), the model's
reasoning is split from the generated text when the prompt opened it, visible keys get it in
``reasoning_content``, hidden keys never; embeddings pass through, recorded without vectors."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from gateway.side.sim.app import SimApp
from gateway.side.sim.script import compose, derive_seed
from tests.e2e.conftest import RecordingSink, Stack

PROMPT = "<｜User｜>What is 6 times 7?<｜Assistant｜><think>\n"  # R1's template, by hand


@pytest.fixture
async def recorded(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    return await stack_factory(sink=sink), sink


def sdk(stack: Stack, key: str = "visible") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys[key], max_retries=0)


def sent(stack: Stack) -> dict[str, Any]:
    assert isinstance(stack.sim, SimApp)
    return stack.sim.sim.received[-1]


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_a_whole_completion_splits_the_reasoning_the_prompt_opened(
    recorded: tuple[Stack, RecordingSink], key: str
) -> None:
    stack, sink = recorded
    expected = compose(derive_seed(PROMPT), PROMPT)
    async with sdk(stack, key) as client:
        done = await client.completions.create(model="deepseek-r1", prompt=PROMPT, max_tokens=400)
    choice = done.choices[0]
    assert choice.text.strip() == expected.answer and choice.finish_reason == "stop"
    extra = choice.model_extra or {}
    if key == "visible":
        assert extra["reasoning_content"].strip() == expected.reasoning
    else:
        assert "reasoning_content" not in extra
        assert expected.reasoning[:40] not in done.model_dump_json()
    assert sent(stack)["prompt"] == PROMPT and "messages" not in sent(stack)
    assert done.usage is not None and done.usage.completion_tokens_details is not None
    assert 0 < done.usage.completion_tokens_details.reasoning_tokens < done.usage.completion_tokens
    [record] = await sink.wait_for(1)
    assert (record.endpoint, record.status) == ("completions", "ok")
    assert record.reasoning[0].strip() == expected.reasoning


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_a_streamed_completion_splits_it_the_same_way(
    recorded: tuple[Stack, RecordingSink], key: str
) -> None:
    stack, _ = recorded
    expected = compose(derive_seed(PROMPT), PROMPT)
    async with sdk(stack, key) as client:
        stream = await client.completions.create(
            model="deepseek-r1", prompt=PROMPT, max_tokens=400, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    reasoning = "".join((c.choices[0].model_extra or {}).get("reasoning_content") or ""
                        for c in chunks if c.choices)  # fmt: skip
    assert text.strip() == expected.answer
    assert reasoning.strip() == (expected.reasoning if key == "visible" else "")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    if key == "hidden":
        raw = orjson.dumps([c.model_dump() for c in chunks])
        assert expected.reasoning[:40].encode() not in raw


async def test_a_prompt_that_opened_no_reasoning_is_all_text(
    recorded: tuple[Stack, RecordingSink],
) -> None:
    """The output of a prompt that does not end in ``<think>`` is not split: the simulator
    writes its markers anyway, and they stay in the text, verbatim."""
    stack, _ = recorded
    async with sdk(stack) as client:
        done = await client.completions.create(model="deepseek-r1", prompt="Say hi.",
                                               max_tokens=400)  # fmt: skip
    assert "</think>" in done.choices[0].text
    assert "reasoning_content" not in (done.choices[0].model_extra or {})


async def test_echo_is_refused_for_a_reasoning_model(recorded: tuple[Stack, RecordingSink]) -> None:
    stack, _ = recorded
    async with sdk(stack) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="deepseek-r1", prompt=PROMPT, echo=True)
    assert caught.value.body["param"] == "echo"  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "param"),
    [({"prompt": 3}, "prompt"), ({"prompt": "x", "n": 0}, "n"), ({"prompt": []}, "prompt")],
)
async def test_bad_completions_are_the_clients_error(
    recorded: tuple[Stack, RecordingSink], body: dict[str, Any], param: str
) -> None:
    stack, _ = recorded
    async with sdk(stack) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.post("/completions", cast_to=object, body={"model": "deepseek-r1", **body})
    assert caught.value.body["param"] == param  # type: ignore[index]


async def test_embeddings_pass_through_and_the_record_has_no_vectors(
    recorded: tuple[Stack, RecordingSink],
) -> None:
    stack, sink = recorded
    async with sdk(stack) as client:
        result = await client.embeddings.create(model="deepseek-r1", input=["alpha", "beta"])
    assert [len(d.embedding) for d in result.data] == [8, 8]
    assert result.data[0].embedding != result.data[1].embedding
    assert result.usage.prompt_tokens > 0
    assert sent(stack)["input"] == ["alpha", "beta"]
    [record] = await sink.wait_for(1)
    assert (record.endpoint, record.status) == ("embeddings", "ok")
    assert record.usage is not None and record.usage.prompt_tokens == result.usage.prompt_tokens
    dumped = orjson.dumps([record.messages, record.content, record.params])
    assert str(result.data[0].embedding[0]).encode() not in dumped


async def test_an_embedding_of_nothing_is_the_clients_error(
    recorded: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = recorded
    async with sdk(stack) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.embeddings.create(model="deepseek-r1", input="")
    assert caught.value.body["param"] == "input"  # type: ignore[index]
