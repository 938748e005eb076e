"""The real ``openai`` SDK, sync and async, streaming and not, over real sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Stack

MESSAGES: list[Any] = [{"role": "user", "content": "Why is the sky blue?"}]


def reasoning_of(obj: Any) -> str | None:
    extra = obj.model_extra or {}
    value = extra.get("reasoning_content")
    return value if isinstance(value, str) else None


def collect(chunks: Any) -> tuple[str, str, list[Any]]:
    reasoning, content, seen = [], [], []
    for chunk in chunks:
        seen.append(chunk)
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert delta.content != ""
        reasoning.append(reasoning_of(delta) or "")
        content.append(delta.content or "")
    return "".join(reasoning), "".join(content), seen


async def test_sync_sdk_streams_reasoning_and_content(stack: Stack) -> None:
    def run() -> tuple[str, str, list[Any]]:
        with openai.OpenAI(
            base_url=stack.url, api_key=stack.keys["visible"], max_retries=0
        ) as client:
            return collect(
                client.chat.completions.create(
                    model="deepseek-r1", messages=MESSAGES, stream=True, max_tokens=400
                )
            )

    # The sync SDK blocks: it runs in a thread while this loop serves the gateway.
    reasoning, content, _ = await asyncio.to_thread(run)
    assert reasoning and content
    assert "<think>" not in content and "</think>" not in content
    assert "think>" not in reasoning


async def test_async_sdk_stream_and_non_stream_agree(stack: Stack) -> None:
    async with openai.AsyncOpenAI(
        base_url=stack.url, api_key=stack.keys["visible"], max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, stream=True, seed=7, max_tokens=300
        )
        reasoning, content = [], []
        async for chunk in stream:
            if chunk.choices:
                reasoning.append(reasoning_of(chunk.choices[0].delta) or "")
                content.append(chunk.choices[0].delta.content or "")
        whole = await client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, seed=7, max_tokens=300
        )
    message = whole.choices[0].message
    assert reasoning_of(message) == "".join(reasoning)
    assert message.content == "".join(content)
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert (whole.usage.completion_tokens_details.reasoning_tokens or 0) > 0


async def test_sync_sdk_non_streaming(stack: Stack) -> None:
    def run() -> Any:
        with openai.OpenAI(
            base_url=stack.url, api_key=stack.keys["visible"], max_retries=0
        ) as client:
            return client.chat.completions.create(
                model="deepseek-r1", messages=MESSAGES, max_tokens=400
            )

    whole = await asyncio.to_thread(run)
    assert whole.choices[0].message.content and reasoning_of(whole.choices[0].message)
    assert "</think>" not in whole.choices[0].message.content


async def stream_texts(
    stack: Stack, key: str = "visible", **params: Any
) -> tuple[str, str, list[Any]]:
    async with openai.AsyncOpenAI(
        base_url=stack.url, api_key=stack.keys[key], max_retries=0
    ) as client:
        stream = await client.chat.completions.create(
            model=params.pop("model", "deepseek-r1"),
            messages=params.pop("messages", MESSAGES),
            stream=True,
            **params,
        )
        chunks = [chunk async for chunk in stream]
    reasoning = "".join(reasoning_of(c.choices[0].delta) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return reasoning, content, chunks


async def test_tag_cut_across_chunks_is_split(stack: Stack) -> None:
    sim = {"chunks": ["The sky", " scatters </th", "ink>", "\n\nRayleigh", " scattering."]}
    reasoning, content, _ = await stream_texts(stack, extra_body={"sim": sim})
    assert reasoning == "The sky scatters "
    assert content == "\n\nRayleigh scattering."


async def test_usage_is_forwarded_only_when_asked_and_counts_reasoning(stack: Stack) -> None:
    sim = {"chunks": ["Let", " me", "</th", "ink>", "\n\nHi"]}
    _, _, without = await stream_texts(stack, extra_body={"sim": sim})
    assert all(c.usage is None for c in without)
    _, _, chunks = await stream_texts(
        stack, extra_body={"sim": sim}, stream_options={"include_usage": True}
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 5
    # one token per delta: "Let", " me" and the two halves of the tag are reasoning
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 4


async def test_hidden_key_never_receives_reasoning(stack: Stack) -> None:
    import httpx

    visible_reasoning, visible_content, _ = await stream_texts(stack, seed=3, max_tokens=300)
    body = {
        "model": "deepseek-r1",
        "messages": MESSAGES,
        "stream": True,
        "seed": 3,
        "max_tokens": 300,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{stack.url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {stack.keys['hidden']}"},
        )
    raw = response.text
    assert visible_reasoning and visible_content
    assert "reasoning_content" not in raw.replace('"reasoning_tokens"', "")
    assert '"reasoning"' not in raw
    for i in range(0, len(visible_reasoning) - 16, 4):
        assert visible_reasoning[i : i + 16] not in raw
    hidden_reasoning, hidden_content, _ = await stream_texts(
        stack, key="hidden", seed=3, max_tokens=300
    )
    assert hidden_reasoning == "" and hidden_content == visible_content


@pytest.mark.parametrize("lower", [{"include_reasoning": False}, {"reasoning": {"exclude": True}}])
async def test_request_may_lower_its_own_visibility(stack: Stack, lower: dict[str, Any]) -> None:
    reasoning, content, _ = await stream_texts(stack, seed=5, max_tokens=300, extra_body=lower)
    assert reasoning == "" and content


async def test_request_cannot_raise_its_visibility(stack: Stack) -> None:
    reasoning, content, _ = await stream_texts(
        stack, key="hidden", seed=5, max_tokens=300, extra_body={"include_reasoning": True}
    )
    assert reasoning == "" and content


async def test_length_cut_inside_reasoning_has_no_content(stack: Stack) -> None:
    reasoning, content, chunks = await stream_texts(stack, max_tokens=5)
    assert reasoning and content == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


async def test_n_greater_than_one_keeps_state_per_choice(stack: Stack) -> None:
    _, _, chunks = await stream_texts(stack, n=2, max_tokens=300)
    per_choice: dict[int, list[str]] = {0: [], 1: []}
    for chunk in chunks:
        for choice in chunk.choices:
            per_choice[choice.index].append(choice.delta.content or "")
    assert all("".join(parts) for parts in per_choice.values())
    assert all("</think>" not in "".join(parts) for parts in per_choice.values())


async def test_upstream_separated_reasoning_reaches_the_configured_field(stack: Stack) -> None:
    reasoning, content, _ = await stream_texts(stack, model="deepseek-r1-parsed", max_tokens=300)
    assert reasoning and content and "think>" not in content


async def test_per_model_parser_override(stack_factory: Any) -> None:
    stack = await stack_factory(models={"qwq-32b": {"reasoning_parser": "think_tags"}})
    reasoning, content, _ = await stream_texts(stack, model="qwq-32b", max_tokens=300)
    assert reasoning and content
    assert "think>" not in content and "think>" not in reasoning


async def test_models_come_from_the_upstream(stack: Stack) -> None:
    async with openai.AsyncOpenAI(
        base_url=stack.url, api_key=stack.keys["visible"], max_retries=0
    ) as client:
        models = [m.id async for m in client.models.list()]
    assert {"deepseek-r1", "qwq-32b", "deepseek-r1-parsed", "deepseek-v3"} <= set(models)


async def test_withheld_reasoning_is_bridged_with_keepalive_comments(stack_factory: Any) -> None:
    from gateway.side.sim.app import SimConfig

    stack = await stack_factory(sim=SimConfig(itl_ms=5), keepalive_s=0.05)
    reasoning, content, _ = await stream_texts(stack, key="hidden", seed=2, max_tokens=300)
    assert reasoning == "" and content  # the SDK ignores the comments
    import httpx

    body = {
        "model": "deepseek-r1",
        "messages": MESSAGES,
        "stream": True,
        "seed": 2,
        "max_tokens": 300,
    }
    async with httpx.AsyncClient() as client:
        raw = await client.post(
            f"{stack.url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {stack.keys['hidden']}"},
        )
    assert ": keep-alive\n\n" in raw.text
