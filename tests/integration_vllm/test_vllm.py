"""thinkgate in front of real vLLM 0.32 (CPU) with a tiny reasoning model, driven by the real
OpenAI SDK. Random weights make noise, so the text is pinned with ``structured_outputs`` (a
literal regex, applied inside reasoning too); the chunking is vLLM's own, so assertions are on
joined text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import ResponseFormatTextJSONSchemaConfigParam
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.conversation.background import TERMINAL
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from ratelimit.engine_metrics import parse_engine_metrics
from tests.e2e.conftest import RecordingSink, ledger_files, make_keys
from tests.integration_vllm.conftest import TinyModel, VllmServer
from tests.waiting import eventually

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
REASONING = "The user asks for 6 times 7. That is 42.\n"
ANSWER = "\n\nThe answer is 42."
REGEX = r"The user asks for 6 times 7\. That is 42\.\n</think>\n\nThe answer is 42\."
TAGS_REGEX = r"<think>\n" + REGEX  # for the explicit-tags parser: the output opens the block
MODELS = ("tiny-r1-parsed", "tiny-r1")  # vLLM's reasoning parser / thinkgate's splitter


class Gateway:
    def __init__(self, url: str, keys: dict[str, str], sink: RecordingSink, model: TinyModel):
        self.url, self.keys, self.sink, self.model = url, keys, sink, model

    def sdk(self, key: str = "visible") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url, api_key=self.keys[key], max_retries=0)

    def pinned(self, regex: str = REGEX, *, spelled: bool = False, **extra: Any) -> dict[str, Any]:
        """Request fields that pin the output; ``spelled`` forbids the one-token tags, so the
        model spells them across several tokens (and chunks)."""
        bias = -100 if spelled else 100
        body = {
            "structured_outputs": {"regex": regex},
            "logit_bias": {str(self.model.think_id): bias, str(self.model.end_think_id): bias},
        }
        return {**body, **extra}


@pytest.fixture
async def gateway(
    vllm_servers: dict[str, VllmServer], tiny_model: TinyModel, tmp_path: Any
) -> AsyncIterator[Gateway]:
    settings = Settings(
        upstreams=tuple(vllm_servers[name].url for name in ("parsed", "raw", "embed")),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        models={
            "tiny-r1-parsed": {"reasoning_source": "upstream"},  # vLLM runs deepseek_r1
            "tiny-v4-parsed": {"reasoning_source": "upstream", "reasoning_parser": "deepseek_v4"},
            "tiny-r1-tags": {"reasoning_parser": "think_tags"},
            "tiny-v4": {"reasoning_parser": "deepseek_v4"},
            "tiny-k3": {"reasoning_parser": "kimi_k3"},
            "tiny-minimax": {"reasoning_parser": "minimax_m2"},
        },
        # a non-streamed request waits for its whole answer within this bound: a burst of
        # six on a CPU engine that runs two at a time takes a minute on a busy machine
        first_token_timeout_s=180,
        **ledger_files(tmp_path),  # the tenant keys seal reasoning tokens and stored responses
    )
    ensure_keys(settings.ledger, create=True)
    keys = await make_keys(settings)
    sink = RecordingSink()
    async with BackgroundServer(create_app(settings, sink=sink)) as server:
        yield Gateway(f"{server.url}/v1", keys, sink, tiny_model)


async def stream(
    gw: Gateway, model: str, key: str = "visible", **params: Any
) -> tuple[str, str, list[Any]]:
    async with gw.sdk(key) as client:
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model=model, messages=params.pop("messages", QUESTION), stream=True, **params
            )
        ]
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return reasoning, content, chunks


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("spelled", [False, True], ids=["tag-one-token", "tag-spelled"])
async def test_streamed_reasoning_and_answer(gateway: Gateway, model: str, spelled: bool) -> None:
    reasoning, content, chunks = await stream(
        gateway, model, max_tokens=100, extra_body=gateway.pinned(spelled=spelled)
    )
    assert (reasoning, content) == (REASONING, ANSWER)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize("model", MODELS)
async def test_non_streamed_reasoning_and_answer(gateway: Gateway, model: str) -> None:
    async with gateway.sdk() as client:
        whole = await client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=100, extra_body=gateway.pinned()
        )
    message = whole.choices[0].message
    assert ((message.model_extra or {}).get("reasoning_content"), message.content) == (
        REASONING,
        ANSWER,
    )
    assert "reasoning" not in (message.model_extra or {})
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert (
        0
        < (whole.usage.completion_tokens_details.reasoning_tokens or 0)
        < whole.usage.completion_tokens
    )


@pytest.mark.parametrize("spelled", [False, True], ids=["tags-one-token", "tags-spelled"])
async def test_explicit_tags_parser(gateway: Gateway, spelled: bool) -> None:
    reasoning, content, _ = await stream(
        gateway,
        "tiny-r1-tags",
        max_tokens=100,
        extra_body=gateway.pinned(TAGS_REGEX, spelled=spelled),
    )
    assert (reasoning, content) == ("\n" + REASONING, ANSWER)


@pytest.mark.parametrize("model", MODELS)
async def test_hidden_key_and_lowered_visibility_get_no_reasoning(
    gateway: Gateway, model: str
) -> None:
    for key, extra in (("hidden", {}), ("visible", {"include_reasoning": False})):
        body = {
            "model": model,
            "messages": QUESTION,
            "stream": True,
            "max_tokens": 100,
            **gateway.pinned(**extra),
        }
        async with httpx.AsyncClient(timeout=60) as client:
            raw = (
                await client.post(
                    f"{gateway.url}/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {gateway.keys[key]}"},
                )
            ).text
        assert "reasoning" not in raw
        content = "".join(
            choice["delta"].get("content") or ""
            for line in raw.splitlines()
            if line.startswith("data: {")
            for choice in json.loads(line[6:])["choices"]
        )
        assert content == ANSWER


@pytest.mark.parametrize("model", MODELS)
async def test_max_tokens_cut_inside_reasoning(gateway: Gateway, model: str) -> None:
    reasoning, content, chunks = await stream(
        gateway, model, max_tokens=6, extra_body=gateway.pinned()
    )
    assert reasoning and REASONING.startswith(reasoning) and content == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


@pytest.mark.parametrize("model", MODELS)
async def test_two_choices(gateway: Gateway, model: str) -> None:
    _, _, chunks = await stream(gateway, model, n=2, max_tokens=100, extra_body=gateway.pinned())
    texts: dict[int, list[str]] = {0: [], 1: []}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index].append(choice.delta.content or "")
    assert {i: "".join(t) for i, t in texts.items()} == {0: ANSWER, 1: ANSWER}


@pytest.mark.parametrize("model", MODELS)
async def test_usage_reasoning_tokens_filled_when_vllm_reports_zero(
    gateway: Gateway, model: str
) -> None:
    _, _, chunks = await stream(
        gateway,
        model,
        max_tokens=100,
        extra_body=gateway.pinned(),
        stream_options={"include_usage": True},
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens_details is not None
    reasoning_tokens = usage.completion_tokens_details.reasoning_tokens or 0
    # vLLM reports 0 when the template opened the block; thinkgate counts: the pinned
    # reasoning is about two dozen tokens and the answer about ten.
    assert 10 < reasoning_tokens < usage.completion_tokens


async def test_stop_strings_with_vllms_reasoning_parser_do_not_leak_tag_fragments(
    gateway: Gateway,
) -> None:
    # vllm-project/vllm#51641: with any stop string, streaming garbles the reasoning/content
    # boundary (how depends on vLLM's chunking, so several tries and stop lengths); thinkgate
    # removes the tag pieces. Text vLLM lost before the tag stays lost.
    for stop, expected in ((["Xy"], ANSWER), (["Xyz"], ANSWER), (["answer"], "\n\nThe ")):
        for _ in range(3):
            reasoning, content, _ = await stream(
                gateway, "tiny-r1-parsed", max_tokens=100, extra_body=gateway.pinned(stop=stop)
            )
            assert content == expected
            assert REASONING.startswith(reasoning)


async def test_models_come_from_both_servers(gateway: Gateway) -> None:
    async with gateway.sdk() as client:
        ids = {m.id async for m in client.models.list()}
    assert {"tiny-r1", "tiny-r1-tags", "tiny-r1-parsed"} <= ids


async def test_vllm_400_reaches_the_client_with_vllms_message(gateway: Gateway) -> None:
    too_long = [{"role": "user", "content": "times " * 600}]
    async with gateway.sdk() as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="tiny-r1", messages=too_long, max_tokens=10)
    assert "context length" in info.value.message or "maximum" in info.value.message


async def engine_counts(server: VllmServer) -> dict[str, float]:
    """vLLM's own counters: requests running, started (a first token), finished (any
    ``finished_reason``) and tokens generated."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{server.root}/metrics")).text
    names = {
        "vllm:num_requests_running": "running",
        "vllm:time_to_first_token_seconds_count": "started",
        "vllm:request_success_total": "finished",
        "vllm:generation_tokens_total": "generated",
    }  # fmt: skip
    counts = dict.fromkeys(names.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                counts[names[sample.name]] += sample.value
    return counts


# Seconds per engine step of a paced request (enginepace.py): 490 tokens take 24.5 s at least.
PACE_S = 0.05


async def generating(server: VllmServer, before: dict[str, float]) -> bool:
    """Whether the engine has started a request since ``before`` and is still running it."""
    now = await engine_counts(server)
    return now["started"] > before["started"] and now["running"] > 0


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_client_disconnect_aborts_the_vllm_request(
    gateway: Gateway, vllm_servers: dict[str, VllmServer], key: str
) -> None:
    """The client leaves mid-stream: the gateway closes its upstream request, vLLM aborts it.
    The request is paced (``PACE_S`` per engine step), so its ``max_tokens`` (ignore_eos) take
    the engine 24.5 s at least, however loaded the machine: the client leaves once the engine
    reports it running (the gateway's 200 already says vLLM sent a first token), long before
    it could end on its own. vLLM 0.32 counts no abort in
    ``request_success_total{finished_reason="abort"}``: the proof is that the request started,
    left the running ones without finishing under any reason, and generated fewer tokens
    than asked for (without the abort it would run to ``length``, all 490)."""
    server, limit = vllm_servers["parsed"], 490
    before = await engine_counts(server)
    body = {
        "model": "tiny-r1-parsed",
        "messages": QUESTION,
        "stream": True,
        "max_tokens": limit,
        "ignore_eos": True,
        "vllm_xargs": {"pace_s": PACE_S},
    }
    url = f"{gateway.url}/chat/completions"
    headers = {"authorization": f"Bearer {gateway.keys[key]}"}
    async with (
        httpx.AsyncClient(timeout=60) as client,
        client.stream("POST", url, json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        await eventually(lambda: generating(server, before), within_s=30, every=0.02)
    # the body unread, leaving closed the connection: the client is gone
    [record] = await gateway.sink.wait_for(1)
    assert record.status == "client_disconnected"

    async def gone() -> dict[str, float] | None:
        now = await engine_counts(server)
        return now if now["running"] == 0 else None

    # long enough for an engine that was not aborted to finish its 490 paced tokens: the
    # assertions below then say what went wrong
    after = await eventually(gone, within_s=90, every=0.05)
    assert after["started"] - before["started"] == 1
    assert after["finished"] == before["finished"]  # neither stop nor length: aborted
    assert 0 < after["generated"] - before["generated"] < limit


async def test_kv_metrics_of_the_real_server_parse(
    gateway: Gateway, vllm_servers: dict[str, VllmServer]
) -> None:
    server = vllm_servers["raw"]
    async with httpx.AsyncClient() as client:
        snap = parse_engine_metrics((await client.get(f"{server.root}/metrics")).text)
    assert snap.block_size and snap.kv_capacity_tokens
    assert snap.kv_capacity_tokens % snap.block_size == 0 and snap.kv_capacity_tokens >= 4096
    assert snap.kv_usage is not None and 0 <= snap.kv_usage <= 1
    # --max-num-seqs 2: with six concurrent requests, four wait at first, for seconds (small
    # enough to finish well within the gateway's timeout while another test worker runs)
    body = {"model": "tiny-r1", "messages": QUESTION, "max_tokens": 240}
    most_waiting, most_used = 0.0, 0.0
    # vLLM's engine and its HTTP server share one process here: on a loaded machine a scrape
    # can be answered only once the burst is over, so a burst is tried up to three times
    for _ in range(3):
        async with gateway.sdk() as sdk, httpx.AsyncClient() as client:
            extra = {"ignore_eos": True}
            calls = asyncio.gather(
                *(sdk.chat.completions.create(**body, extra_body=extra) for _ in range(6))
            )
            while not calls.done():  # sample the server's own view while the burst runs
                now = parse_engine_metrics((await client.get(f"{server.root}/metrics")).text)
                most_waiting = max(most_waiting, now.requests_waiting or 0)
                most_used = max(most_used, now.kv_usage or 0)
                await asyncio.wait([calls], timeout=0.02)
            await calls
        if most_waiting >= 1:
            break
    assert most_waiting >= 1, (most_waiting, most_used)
    assert 0 < most_used <= 1


async def test_records_hold_what_vllm_produced(gateway: Gateway) -> None:
    for model in MODELS:
        await stream(gateway, model, max_tokens=100, extra_body=gateway.pinned())
    records = await gateway.sink.wait_for(2)
    for record in records:
        assert record.status == "ok"
        assert (record.reasoning, record.content) == ((REASONING,), (ANSWER,))
        assert record.upstream is not None and record.usage is not None


# -- reasoning formats and sources (gateway.relay.formats) -----------------------------------

EMPTY_REGEX = r"</think>\n\nThe answer is 42\."  # R1 with nothing to think about
EMPTY_ANSWER = "\n\nThe answer is 42."


async def whole(gw: Gateway, model: str, key: str, **params: Any) -> tuple[str | None, str | None]:
    async with gw.sdk(key) as client:
        done = await client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=100, **params
        )
    message = done.choices[0].message
    return (message.model_extra or {}).get("reasoning_content"), message.content


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_an_empty_reasoning_behind_vllms_parser_leaves_the_answer_for_every_key(
    gateway: Gateway, key: str
) -> None:
    # vLLM's deepseek_r1 parser swallows the lone </think> token and sends content only; with
    # reasoning_source: upstream that content is the answer (it used to become reasoning).
    pinned = gateway.pinned(EMPTY_REGEX)
    reasoning, content, _ = await stream(
        gateway, "tiny-r1-parsed", key=key, max_tokens=100, extra_body=pinned
    )
    assert (reasoning, content) == ("", EMPTY_ANSWER)
    assert await whole(gateway, "tiny-r1-parsed", key, extra_body=pinned) == (None, EMPTY_ANSWER)


THINKING_OFF_REGEX = r"The answer is 42\."


@pytest.mark.parametrize("model", ["tiny-v4-parsed", "tiny-v4"])
@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_thinking_off_through_chat_template_kwargs_is_all_answer(
    gateway: Gateway, model: str, key: str
) -> None:
    # The tiny template closes the block in the prompt (as DeepSeek-V3.1's does); vLLM's
    # deepseek_r1 parser, which has no switch, then calls the whole answer reasoning.
    pinned = gateway.pinned(THINKING_OFF_REGEX, chat_template_kwargs={"thinking": False})
    reasoning, content, _ = await stream(gateway, model, key=key, max_tokens=100, extra_body=pinned)
    assert (reasoning, content) == ("", "The answer is 42.")
    assert await whole(gateway, model, key, extra_body=pinned) == (None, "The answer is 42.")
    records = [r for r in gateway.sink.records if r.model == model]
    assert records and all(r.thinking is False and r.reasoning == ("",) for r in records)


K3_REGEX = (
    r"The user asks for 6 times 7\. That is 42\.\n<\|close\|>think<\|sep\|>\n\nThe answer is 42\."
)
MINIMAX_REGEX = (
    r"<think>The user asks for 6 times 7\. That is 42\.\n<minimax:tool_call><invoke>f</invoke>"
)


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_kimi_k3_three_part_markers_spelled_as_text_are_split_by_thinkgate(
    gateway: Gateway, key: str
) -> None:
    reasoning, content, _ = await stream(
        gateway, "tiny-k3", key=key, max_tokens=100, extra_body=gateway.pinned(K3_REGEX)
    )
    assert content == ANSWER
    assert reasoning == (REASONING if key == "visible" else "")


async def test_minimax_close_only_and_its_tool_call_marker_are_split_by_thinkgate(
    gateway: Gateway,
) -> None:
    # MiniMax M2's template opened the block; a <think> the model writes is dropped, and its
    # tool-call marker ends reasoning and stays in the content.
    reasoning, content, _ = await stream(
        gateway, "tiny-minimax", max_tokens=100, extra_body=gateway.pinned(MINIMAX_REGEX)
    )
    assert (reasoning, content) == (REASONING, "<minimax:tool_call><invoke>f</invoke>")


# -- the Responses API through translation (gateway.routes.responses) ------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_a_responses_call_through_translation_splits_as_chat_does(
    gateway: Gateway, model: str, key: str
) -> None:
    # The Responses API has no way to pass vLLM's regex (its schema is strict), so the random
    # weights write noise: what is checked is the event shape, the usage, the record, and that
    # a hidden key gets no reasoning whatever the noise holds.
    async with gateway.sdk(key) as client:
        stream = await client.responses.create(
            model=model, input="What is 6 times 7?", max_output_tokens=100, stream=True
        )
        events = [event async for event in stream]
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    kinds = [item.type for item in final.output]
    if key == "hidden":
        assert "reasoning" not in kinds
        assert all(e.type != "response.reasoning_text.delta" for e in events)
    assert final.usage is not None and final.usage.output_tokens > 0
    (record,) = [r for r in gateway.sink.records if r.endpoint == "responses" and r.model == model]
    assert record.status == "ok"


@pytest.mark.parametrize("carry", ["encrypted", "stored"])
async def test_reasoning_carried_across_turns_reaches_real_vllm(
    gateway: Gateway, carry: str
) -> None:
    # A hidden key's reasoning goes back to the engine on the next turn, sealed in the item
    # (store: false) or kept by the gateway (previous_response_id); vLLM must accept the
    # assistant turn with its ``reasoning`` field (its chat template renders it).
    asked: dict[str, Any] = {"model": "tiny-r1", "max_output_tokens": 24}
    if carry == "encrypted":
        asked.update(store=False, include=["reasoning.encrypted_content"])
    question = {"role": "user", "content": "What is 6 times 7?"}
    async with gateway.sdk("hidden") as client:
        first = await client.responses.create(input=[question], **asked)
        trace = [r for r in gateway.sink.records if r.endpoint == "responses"][-1].reasoning[0]
        assert trace
        # the hidden key sees no reasoning text: no item carries it, and the trace is nowhere
        # in the response (checked when it is long enough to mean something: the random
        # weights may reason one replacement character that the answer's noise holds too)
        assert all(not item.content and not item.summary
                   for item in first.output if item.type == "reasoning")  # fmt: skip
        if len(trace) >= 8:
            assert trace[:20] not in first.model_dump_json()
        follow: Any = [question]
        if carry == "encrypted":
            assert first.output[0].type == "reasoning" and first.output[0].encrypted_content
            follow += [i.model_dump(exclude_none=True) for i in first.output]
        else:
            asked["previous_response_id"] = first.id
        second = await client.responses.create(
            input=[*follow, {"role": "user", "content": "And 7 times 6?"}], **asked
        )
    assert second.status in ("completed", "incomplete")
    sent = [r for r in gateway.sink.records if r.endpoint == "responses"][-1].messages
    assistant = next(m for m in sent if m["role"] == "assistant")
    assert assistant["reasoning"] == trace


# The gateway cuts at the first upstream delta that reaches the budget; vLLM on this CPU puts
# up to three tokens in one delta (it merges tokens of several steps under load): the slack.
DELTA_SLACK = 3


def unpinned(model: TinyModel) -> dict[str, Any]:
    """Random text that never ends on its own: the tags and the end of sequence forbidden, so
    only a budget ends the reasoning and only ``max_tokens`` ends the answer."""
    tokens = json.loads((model.path / "tokens.json").read_text())
    eos = tokens["<｜end▁of▁sentence｜>"]
    return {"logit_bias": {str(i): -100 for i in (model.think_id, model.end_think_id, eos)}}


@pytest.mark.parametrize("model", MODELS, ids=["engine-keeps-it", "gateway-keeps-it"])
@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "whole"])
async def test_an_effort_budget_ends_the_reasoning_and_an_answer_follows(
    gateway: Gateway, model: str, streamed: bool
) -> None:
    """vLLM keeps the budget behind its reasoning parser (``thinking_token_budget``); the gateway
    keeps it in front of the raw server (cut, then a continuation after ``</think>``). Either
    way the reasoning ends within the budget and the answer fills the rest of the output.
    At temperature 0 this model writes one "\n" token per step while it reasons, so the
    reasoning's length in characters is its length in tokens."""
    budget, limit = 12, 40
    extra = {**unpinned(gateway.model), "thinking_token_budget": budget}
    async with gateway.sdk() as client:
        if streamed:
            reasoning, content, chunks = await stream(
                gateway, model, max_tokens=limit, temperature=0,
                stream_options={"include_usage": True}, extra_body=extra,
            )  # fmt: skip
            usage = chunks[-1].usage
        else:
            whole = await client.chat.completions.create(
                model=model, messages=QUESTION, max_tokens=limit, temperature=0, extra_body=extra
            )
            message = whole.choices[0].message
            reasoning = (message.model_extra or {}).get("reasoning_content") or ""
            content, usage = message.content or "", whole.usage
    assert set(reasoning) == {"\n"}
    # vLLM counts the "\n" its template wrote after <think> against the budget: one less
    assert budget - 1 <= len(reasoning) <= budget + DELTA_SLACK
    assert content and "</think>" not in content  # noise, but the answer's: it filled the rest
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens == limit
    if model == "tiny-r1":  # cut by the gateway at vLLM's running count
        assert budget <= usage.completion_tokens_details.reasoning_tokens <= budget + DELTA_SLACK


@pytest.mark.parametrize("model", MODELS, ids=["engine-keeps-it", "gateway-keeps-it"])
async def test_a_responses_effort_is_a_budget_on_real_vllm(gateway: Gateway, model: str) -> None:
    """ "minimal" is 256 tokens by default; 40 output tokens keep 10 for the answer: 30. (The
    Responses API has no ``logit_bias``: what the answer is, is the model's business here.)"""
    async with gateway.sdk() as client:
        response = await client.responses.create(
            model=model, input="What is 6 times 7?", max_output_tokens=40, temperature=0,
            reasoning={"effort": "minimal"}, stream=False,
        )  # fmt: skip
    [item] = [i for i in response.output if i.type == "reasoning"]
    [text] = [c.text for c in item.content or []]
    assert 29 <= len(text) <= 30 + DELTA_SLACK and set(text) == {"\n"}
    assert response.usage is not None and response.usage.output_tokens == 40


async def test_chat_reasoning_history_reaches_real_vllm_under_reasoning(gateway: Gateway) -> None:
    """A client sends an earlier turn's reasoning as ``reasoning_content`` (DeepSeek's name);
    vLLM 0.32 reads only ``reasoning``: the gateway renames it, and vLLM accepts the turn."""
    messages: Any = [
        *QUESTION,
        {"role": "assistant", "content": "42.", "reasoning_content": "six sevens"},
        {"role": "user", "content": "And 7 times 6?"},
    ]
    async with gateway.sdk() as client:
        whole = await client.chat.completions.create(
            model="tiny-r1", messages=messages, max_tokens=8, temperature=0
        )
    assert whole.choices[0].finish_reason == "length"
    record = [r for r in gateway.sink.records if r.endpoint == "chat.completions"][-1]
    assert record.status == "ok"
    assistant = record.messages[1]
    assert assistant["reasoning"] == "six sevens" and "reasoning_content" not in assistant


@pytest.mark.parametrize("key", ["visible", "hidden"])
@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "whole"])
async def test_a_legacy_completion_of_a_prompt_that_opens_the_reasoning_is_split(
    gateway: Gateway, key: str, streamed: bool
) -> None:
    """The raw prompt goes to vLLM's own /v1/completions (no chat template): written as R1's
    template would, it ends with ``<think>\\n``, so the output starts inside the reasoning."""
    prompt = "<｜begin▁of▁sentence｜><｜User｜>What is 6 times 7?<｜Assistant｜><think>\n"
    pinned = gateway.pinned()
    async with gateway.sdk(key) as client:
        if streamed:
            stream = await client.completions.create(
                model="tiny-r1", prompt=prompt, max_tokens=100, stream=True, extra_body=pinned
            )
            choices = [c.choices[0] async for c in stream if c.choices]
        else:
            whole = await client.completions.create(
                model="tiny-r1", prompt=prompt, max_tokens=100, extra_body=pinned
            )
            choices = list(whole.choices)
    text = "".join(c.text for c in choices)
    reasoning = "".join((c.model_extra or {}).get("reasoning_content") or "" for c in choices)
    assert text == ANSWER
    assert reasoning == (REASONING if key == "visible" else "")
    record = [r for r in gateway.sink.records if r.endpoint == "completions"][-1]
    assert (record.reasoning, record.content) == ((REASONING,), (ANSWER,))


@pytest.mark.parametrize("model", MODELS)
async def test_anthropic_messages_with_thinking_through_translation(
    gateway: Gateway, model: str
) -> None:
    """The anthropic SDK against real vLLM: a thinking block signed by the gateway, the text,
    and the block handed back on the next turn as the engine's reasoning."""
    import anthropic

    root = gateway.url.removesuffix("/v1")
    async with anthropic.AsyncAnthropic(base_url=root, api_key=gateway.keys["visible"],
                                        max_retries=0) as client:  # fmt: skip
        first = await client.messages.create(
            model=model, max_tokens=100, messages=QUESTION,  # type: ignore[arg-type]
            thinking={"type": "enabled", "budget_tokens": 90}, extra_body=gateway.pinned(),
        )  # fmt: skip
        assert [b.type for b in first.content] == ["thinking", "text"]
        thinking, text = first.content
        assert thinking.type == "thinking" and thinking.thinking == REASONING
        assert text.type == "text" and text.text == ANSWER
        assert first.stop_reason == "end_turn"
        turns: Any = [
            {"role": "user", "content": "What is 6 times 7?"},
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": "And 7 times 6?"},
        ]
        second = await client.messages.create(model=model, max_tokens=8, messages=turns)
        counted = await client.messages.count_tokens(model=model, messages=turns)
    assert second.stop_reason == "max_tokens"
    record = [r for r in gateway.sink.records if r.endpoint == "messages"][-1]
    assert record.messages[1]["reasoning"] == REASONING
    assert counted.input_tokens > 10  # vLLM's own tokenizer, with the chat template


async def test_embeddings_pass_through_to_vllms_pooling_runner(gateway: Gateway) -> None:
    async with gateway.sdk() as client:
        result = await client.embeddings.create(model="tiny-embed", input=["six", "seven"])
    assert len(result.data) == 2 and len(result.data[0].embedding) == 128  # the hidden size
    assert result.data[0].embedding != result.data[1].embedding
    assert result.usage.prompt_tokens > 0
    record = [r for r in gateway.sink.records if r.endpoint == "embeddings"][-1]
    assert record.status == "ok" and record.usage is not None
    assert record.usage.prompt_tokens == result.usage.prompt_tokens


# -- background responses (gateway.exchange.background) --------------------------------------

# The engine's structured output pins a five-token answer that ends the request (vLLM's
# enable_in_reasoning: the template opened the think block, so it is all reasoning to R1).
PINNED_ANSWER: ResponseFormatTextJSONSchemaConfigParam = {
    "type": "json_schema", "name": "answer", "strict": True,
    "schema": {"type": "string", "enum": ["42"]},
}  # fmt: skip


async def status_once(client: openai.AsyncOpenAI, response_id: str, *wanted: str) -> Any:
    """The response if its status is one of ``wanted``, else ``None`` (for ``eventually``)."""
    response = await client.responses.retrieve(response_id)
    return response if response.status in wanted else None


async def test_a_background_response_completes_on_real_vllm(gateway: Gateway) -> None:
    async with gateway.sdk() as client:
        queued = await client.responses.create(
            model="tiny-r1", input="What is 6 times 7?", background=True, temperature=0,
            max_output_tokens=16, text={"format": PINNED_ANSWER},
        )  # fmt: skip
        assert (queued.status, queued.background) == ("queued", True)
        done = await eventually(
            lambda: status_once(client, queued.id, "completed", "incomplete", "failed",
                                "cancelled"), within_s=60, every=0.05,
        )  # fmt: skip
    assert done.status == "completed", done
    [item] = done.output
    assert item.type == "reasoning" and [c.text for c in item.content or []] == ['"42"']
    assert done.usage is not None and 0 < done.usage.output_tokens <= 16
    assert done.usage.input_tokens > 0
    [record] = await gateway.sink.wait_for(1)
    assert (record.endpoint, record.status) == ("responses", "ok")


async def test_cancelling_a_background_response_aborts_vllms_request(
    gateway: Gateway, vllm_servers: dict[str, VllmServer]
) -> None:
    """The request is paced (``PACE_S`` per engine step, through vLLM's own ``vllm_xargs``,
    which the Responses API passes on) and ignores end-of-sequence, so its
    ``max_output_tokens`` take the engine 20 s at least, however loaded the machine; cancelled
    as soon as it is ``in_progress`` (the gateway's status once vLLM sent the first chunk), the
    engine's request goes. vLLM 0.32 counts no abort in
    ``request_success_total{finished_reason="abort"}``: the proof is that the request started,
    left the running ones without finishing under any reason, and generated fewer tokens than
    asked for."""
    server, limit = vllm_servers["raw"], 400  # tiny-r1's server
    before = await engine_counts(server)
    async with gateway.sdk() as client:
        queued = await client.responses.create(
            model="tiny-r1", input="What is 6 times 7?", background=True, temperature=0,
            max_output_tokens=limit,
            extra_body={"ignore_eos": True, "vllm_xargs": {"pace_s": PACE_S}},
        )  # fmt: skip
        seen = await eventually(
            lambda: status_once(client, queued.id, "in_progress", *TERMINAL), within_s=60,
            every=0.02,
        )  # fmt: skip
        assert seen.status == "in_progress", seen  # a paced request cannot have ended yet
        cancelled = await client.responses.cancel(queued.id)
        again = await client.responses.retrieve(queued.id)
    assert (cancelled.status, again.status) == ("cancelled", "cancelled")

    async def gone() -> dict[str, float] | None:
        now = await engine_counts(server)
        return now if now["running"] == 0 and now["started"] > before["started"] else None

    after = await eventually(gone, within_s=20, every=0.05)
    assert after["started"] - before["started"] == 1
    assert after["finished"] == before["finished"]  # neither stop nor length: aborted
    assert 0 < after["generated"] - before["generated"] < limit
    [record] = await gateway.sink.wait_for(1)
    assert (record.endpoint, record.status, record.error_code) == (
        "responses", "cancelled", "cancelled")  # fmt: skip


# -- batches (gateway.batch) ------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
async def test_a_small_chat_batch_completes_on_real_vllm(gateway: Gateway, model: str) -> None:
    """Four chat lines, the output pinned, through the Files and Batch API: each answered once
    with vLLM's reasoning split out, a hidden key's results without it, one record per line
    naming the batch."""
    body = {"model": model, "messages": QUESTION, "max_tokens": 100, **gateway.pinned()}
    lines = b"".join(
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": body}).encode() + b"\n"
        for i in range(4)
    )  # fmt: skip
    outputs = {}
    for key in ("visible", "hidden"):
        async with gateway.sdk(key) as client:
            uploaded = await client.files.create(file=("in.jsonl", lines), purpose="batch")
            batch = await client.batches.create(input_file_id=uploaded.id,
                                                endpoint="/v1/chat/completions",
                                                completion_window="24h")  # fmt: skip

            async def ended(batch_id: str = batch.id, c: openai.AsyncOpenAI = client) -> Any:
                found = await c.batches.retrieve(batch_id)
                return found if found.status in ("completed", "failed") else None

            done = await eventually(ended, within_s=120, every=0.1)
            assert (done.status, done.request_counts.completed) == ("completed", 4), done
            raw = (await client.files.content(done.output_file_id)).content
        outputs[key] = {item["custom_id"]: item for item in map(json.loads, raw.splitlines())}
    assert sorted(outputs["visible"]) == sorted(outputs["hidden"]) == ["l0", "l1", "l2", "l3"]
    for item in outputs["visible"].values():
        message = item["response"]["body"]["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == (REASONING, ANSWER)
    for item in outputs["hidden"].values():
        message = item["response"]["body"]["choices"][0]["message"]
        assert message["content"] == ANSWER and "reasoning_content" not in message
    hidden_raw = json.dumps(list(outputs["hidden"].values()))
    assert REASONING[:20] not in hidden_raw
    records = await gateway.sink.wait_for(8)
    assert sum(1 for r in records if r.batch is not None and r.status == "ok") == 8
