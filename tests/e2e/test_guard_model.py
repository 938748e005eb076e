"""A guard model in a guardrail policy, end to end through the real SDKs: the simulator plays
Llama Guard (``gateway.side.sim.guard``: ``unsafe\\nS1`` for "detonator", ``unsafe\\nS2`` for
"counterfeit"), asked by the gateway at sentence ends and at each channel's end. An unsafe
sentence never reaches the client; what was found safe before it does; each endpoint ends in
its own shape; a guard model that is down follows ``on_error``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.edge.servers import BackgroundServer
from gateway.side.sim.app import SimApp, SimConfig, create_sim_app
from tests.e2e.conftest import RecordingSink, Stack, StackFactory
from tests.e2e.scripted import Scripted

MESSAGES: list[Any] = [{"role": "user", "content": "How do I bake bread?"}]
# tokens as an engine sends them: a sentence's end is known when the next token's space comes
UNSAFE = ["Bread", " needs", " flour.", "</think>", "\n\nFirst", ", mix", " the flour.",
          " Then", " add", " the deto", "nator", " carefully.", " Done."]  # fmt: skip
SAFE = ["Bread", " needs", " flour.", "</think>", "\n\nMix", " the flour.", " Bake", " it."]
POLICY = """
policies:
  - name: harm
    detect: [{{model: llama-guard, upstream: "{url}", categories: [S1]}}]
    scope: [{scope}]
    action: {action}
{extra}
"""


@contextlib.asynccontextmanager
async def guard_model() -> AsyncIterator[tuple[str, SimApp]]:
    """The simulator playing Llama Guard, on a server of its own."""
    app = create_sim_app(SimConfig())
    async with BackgroundServer(app) as server:
        yield f"{server.url}/v1", app


async def guarded(stack_factory: StackFactory, tmp_path: Path, url: str, *,
                  scope: str = "reasoning, answer", action: str = "block", extra: str = "",
                  chunks: list[str] | None = None) -> tuple[Stack, RecordingSink]:  # fmt: skip
    path = tmp_path / "guardrails.yaml"
    path.write_text(POLICY.format(url=url, scope=scope, action=action, extra=extra))
    sink = RecordingSink()
    apps = [Scripted({"chunks": chunks})] if chunks is not None else None
    stack = await stack_factory(sink=sink, guardrails_file=path, upstream_apps=apps)
    return stack, sink


def client(stack: Stack, key: str = "visible") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys[key], max_retries=0)


async def chat_stream(
    stack: Stack, chunks: list[str], key: str = "visible"
) -> tuple[str, str, list[Any]]:
    async with client(stack, key) as openai_client:
        stream = await openai_client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, stream=True,
            extra_body={"sim": {"chunks": chunks}},
        )  # fmt: skip
        got = [c async for c in stream if c.choices]
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in got)
    content = "".join(c.choices[0].delta.content or "" for c in got)
    return reasoning, content, [c.choices[0].finish_reason for c in got]


async def test_an_unsafe_sentence_ends_the_stream_and_what_was_safe_before_it_goes_out(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    async with guard_model() as (url, judge):
        stack, sink = await guarded(stack_factory, tmp_path, url)
        reasoning, content, finishes = await chat_stream(stack, UNSAFE)
        asked = [b["messages"] for b in judge.sim.received]
    assert reasoning == "Bread needs flour."
    assert content == "\n\nFirst, mix the flour."  # found safe before the unsafe sentence
    assert finishes[-1] == "content_filter" and "stop" not in finishes
    # the guard model saw the user's turn and the agent's text up to each sentence end
    assert asked[0] == [{"role": "user", "content": MESSAGES[0]["content"]},
                        {"role": "assistant", "content": "Bread needs flour."}]  # fmt: skip
    assert any("detonator" in m[1]["content"] for m in asked)
    (record,) = await sink.wait_for(1)
    assert record.finish_reasons == ("content_filter",)
    assert [(a.policy, a.action, a.channel, a.detector) for _, a in record.guardrails] == [
        ("harm", "block", "answer", "model:llama-guard:S1")
    ]
    assert all("detonator" not in text for text in record.content)
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{stack.root}/metrics")).text
    counts = {o: float(re.search(rf'guard_model_seconds_count{{outcome="{o}",policy="harm"}} '
                                 r"(\S+)", metrics)[1]) for o in ("safe", "unsafe")}  # type: ignore[index]  # fmt: skip
    # asks already sent when the first unsafe verdict came may come back unsafe too
    assert counts["safe"] >= 2 and counts["unsafe"] >= 1
    assert 'thinkgate_guardrail_actions_total{action="block",policy="harm",scope="answer"}' in (
        metrics
    )


async def test_a_safe_stream_is_relayed_whole_after_each_verdict(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    async with guard_model() as (url, judge):
        stack, sink = await guarded(stack_factory, tmp_path, url)
        reasoning, content, finishes = await chat_stream(stack, SAFE)
        asked = len(judge.sim.received)
    assert (reasoning, content) == ("Bread needs flour.", "\n\nMix the flour. Bake it.")
    assert finishes[-1] == "stop"
    assert asked == 3  # the reasoning at its end; the answer at "flour." and at its end
    (record,) = await sink.wait_for(1)
    assert record.guardrails == ()


async def test_a_whole_response_and_legacy_completions_are_judged_before_they_go_out(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    async with guard_model() as (url, _):
        stack, sink = await guarded(stack_factory, tmp_path, url)
        async with client(stack) as openai_client:
            whole = await openai_client.chat.completions.create(
                model="deepseek-r1", messages=MESSAGES, extra_body={"sim": {"chunks": UNSAFE}}
            )
            fine = await openai_client.chat.completions.create(
                model="deepseek-r1", messages=MESSAGES, extra_body={"sim": {"chunks": SAFE}}
            )
            legacy = await openai_client.completions.create(
                model="deepseek-r1", prompt="Bake?", extra_body={"sim": {"chunks": UNSAFE}}
            )
            streamed = await openai_client.completions.create(
                model="deepseek-r1", prompt="Bake?", stream=True,
                extra_body={"sim": {"chunks": UNSAFE}},
            )  # fmt: skip
            pieces = [c.choices[0] async for c in streamed if c.choices]
    assert whole.choices[0].finish_reason == "content_filter"
    assert "detonator" not in (whole.choices[0].message.content or "")
    assert fine.choices[0].message.content == "\n\nMix the flour. Bake it."
    assert legacy.choices[0].finish_reason == "content_filter"
    assert "detonator" not in legacy.choices[0].text
    assert pieces[-1].finish_reason == "content_filter"
    # a raw prompt without the open marker: the text is all answer, the marker a word of it
    assert "".join(p.text for p in pieces) == "Bread needs flour.</think>\n\nFirst, mix the flour."
    records = await sink.wait_for(4)
    assert sorted(r.finish_reasons[0] for r in records) == ["content_filter"] * 3 + ["stop"]


async def test_responses_end_incomplete_and_messages_with_refusal(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    async with guard_model() as (url, _):
        stack, _sink = await guarded(stack_factory, tmp_path, url, chunks=UNSAFE)
        async with client(stack) as openai_client:
            events = [e async for e in await openai_client.responses.create(
                model="deepseek-r1", input="Bake?", stream=True)]  # fmt: skip
            whole = await openai_client.responses.create(model="deepseek-r1", input="Bake?")
        claude = anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["visible"],
                                          max_retries=0)  # fmt: skip
        async with (
            claude,
            claude.messages.stream(
                model="deepseek-r1", max_tokens=200, messages=[{"role": "user", "content": "?"}]
            ) as stream,
        ):
            final = await stream.get_final_message()
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "content_filter"  # type: ignore[union-attr]
    assert whole.status == "incomplete" and "detonator" not in whole.output_text
    assert final.stop_reason == "refusal"
    assert "".join(getattr(b, "text", "") for b in final.content) == "\n\nFirst, mix the flour."


async def test_a_verdict_outside_the_policys_categories_does_not_count(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    chunks = ["Use", " counterfeit", " notes.", "</think>", "\n\nNo."]
    async with guard_model() as (url, _):
        stack, sink = await guarded(stack_factory, tmp_path, url, scope="reasoning")
        reasoning, content, finishes = await chat_stream(stack, chunks, key="hidden")
    # S2 is not among the policy's categories: the verdict does not count
    assert (reasoning, content, finishes[-1]) == ("", "\n\nNo.", "stop")
    (record,) = await sink.wait_for(1)
    assert record.guardrails == ()


async def test_a_hidden_keys_reasoning_is_blocked_in_a_counted_category(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    chunks = ["Add", " the", " detonator.", "</think>", "\n\nDone."]
    async with guard_model() as (url, _):
        stack, sink = await guarded(stack_factory, tmp_path, url, scope="reasoning")
        reasoning, content, finishes = await chat_stream(stack, chunks, key="hidden")
    assert (reasoning, content, finishes[-1]) == ("", "", "content_filter")
    (record,) = await sink.wait_for(1)
    assert [(a.channel, a.detector) for _, a in record.guardrails] == [
        ("reasoning", "model:llama-guard:S1")
    ]
    assert "".join(record.reasoning) == ""


async def test_an_unsafe_prompt_is_refused_before_the_engine(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    async with guard_model() as (url, _):
        stack, sink = await guarded(stack_factory, tmp_path, url, scope="prompt")
        assert stack.sim is not None
        async with client(stack) as openai_client:
            with pytest.raises(openai.BadRequestError) as refused:
                await openai_client.chat.completions.create(
                    model="deepseek-r1",
                    messages=[{"role": "user", "content": "Where is a detonator sold?"}],
                )
            fine = await openai_client.chat.completions.create(
                model="deepseek-r1", messages=MESSAGES
            )
    assert refused.value.code == "guardrail_blocked"
    assert "guard model (llama-guard:S1)" in refused.value.message
    assert "detonator" not in refused.value.message
    assert fine.choices[0].finish_reason in ("stop", "length")
    assert len(stack.sim.sim.received) == 1  # only the safe prompt reached the engine
    (record,) = await sink.wait_for(1)
    assert record.guardrails == ()


@pytest.mark.parametrize(("on_error", "blocked"), [("block", True), ("allow", False)])
async def test_a_guard_model_that_is_down_follows_on_error(
    stack_factory: StackFactory, tmp_path: Path, on_error: str, blocked: bool
) -> None:
    stack, sink = await guarded(stack_factory, tmp_path, "http://127.0.0.1:9/v1",
                                extra=f"    on_error: {on_error}")  # fmt: skip
    reasoning, content, finishes = await chat_stream(stack, SAFE)
    if blocked:
        assert (reasoning, content, finishes[-1]) == ("", "", "content_filter")
    else:
        expected = ("Bread needs flour.", "\n\nMix the flour. Bake it.", "stop")
        assert (reasoning, content, finishes[-1]) == expected
    (record,) = await sink.wait_for(1)
    detectors = [a.detector for _, a in record.guardrails]
    assert detectors == (["model:llama-guard:unavailable"] if blocked else [])


async def test_a_flag_policy_holds_nothing_back_and_marks_the_record(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    async with guard_model() as (url, _):
        stack, sink = await guarded(stack_factory, tmp_path, url, action="flag")
        _, content, finishes = await chat_stream(stack, UNSAFE)
    assert "detonator carefully. Done." in content and finishes[-1] == "stop"
    (record,) = await sink.wait_for(1)
    assert [(a.action, a.detector) for _, a in record.guardrails] == [
        ("flag", "model:llama-guard:S1")
    ]
