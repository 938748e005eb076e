"""What vLLM 0.32 puts on the wire, as the simulator reproduces it (each rule of
``wire``, ``deltas``, ``reasoning``, ``stops`` of ``gateway.side.sim``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.side.sim.deltas import Delta
from gateway.side.sim.script import CLOSE_TAG, SimMode, build_script, compose
from gateway.side.sim.wire import ChunkEncoder, SimUsage
from tests.gateway.side.sim.clients import (
    PROMPT,
    chat,
    choices,
    deltas,
    in_process,
    stream_chunks,
    tag_seed,
)

USAGE = {"include_usage": True}
PARSED_SEED, SPELLED_SEED = tag_seed(one_token=True), tag_seed(one_token=False)
NULLS = {"refusal": None, "annotations": None, "audio": None, "function_call": None}


async def whole(body: dict[str, Any]) -> Any:
    async with in_process() as (client, _):
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    return response.json()


async def streamed(body: dict[str, Any]) -> list[Any]:
    async with in_process() as (client, _):
        return await stream_chunks(client, {**body, "stream": True})


# --- 1. the finish reason travels in its own final chunk -----------------------------------


@pytest.mark.parametrize("model", ["deepseek-r1", "deepseek-r1-parsed"])
async def test_final_chunk_follows_the_last_token(model: str) -> None:
    sim = {"chunks": [["reasoning", "hm"], ["content", "Hi"]]}
    chunks = await streamed(chat(model, sim=sim))
    last_token, final = choices(chunks)[-2:]
    assert last_token["finish_reason"] is None
    assert final == {
        "index": 0,
        "delta": {"content": ""},
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": None,
    }


async def test_length_finish_and_one_final_chunk_per_choice() -> None:
    chunks = await streamed(chat("deepseek-r1-parsed", n=2, max_tokens=3))
    for index in (0, 1):
        mine = choices(chunks, index)
        assert [c["finish_reason"] for c in mine] == [None] * 4 + ["length"]
        assert mine[-1]["delta"] == {"content": ""}


# --- 2. the null fields vLLM sends ---------------------------------------------------------


async def test_stream_null_fields_and_fingerprint_on_the_usage_chunk_only() -> None:
    chunks = await streamed(chat(seed=3, stream_options=USAGE))
    role, *rest, usage = chunks
    assert list(role) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "prompt_token_ids",
        "usage",
    ]
    assert role["prompt_token_ids"] is None
    assert all("prompt_token_ids" not in chunk for chunk in [*rest, usage])
    for chunk in [role, *rest]:
        (choice,) = chunk["choices"]
        assert list(choice)[-1] == "token_ids"
        assert choice["token_ids"] is None
        assert "system_fingerprint" not in chunk
    assert usage["system_fingerprint"] == "vllm-0.32.0-sim"


async def test_whole_response_null_fields() -> None:
    body = await whole(chat(seed=3))
    for key in ("service_tier", "prompt_logprobs", "prompt_token_ids", "kv_transfer_params"):
        assert key in body
        assert body[key] is None
    assert body["system_fingerprint"] == "vllm-0.32.0-sim"
    (choice,) = body["choices"]
    assert (choice["stop_reason"], choice["token_ids"]) == (None, None)
    message = choice["message"]
    assert {key: message[key] for key in NULLS} == NULLS
    assert "reasoning" in message
    assert message["reasoning"] is None  # explicit without a parser


async def test_whole_response_reasoning_field_with_the_parser() -> None:
    message = (await whole(chat("deepseek-r1-parsed", seed=PARSED_SEED)))["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": compose(PARSED_SEED, PROMPT).answer,
        **NULLS,
        "reasoning": compose(PARSED_SEED, PROMPT).reasoning,
    }


# --- 3. usage details ----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["deepseek-r1", "qwq-32b", "deepseek-v3"])
async def test_usage_without_a_parser(model: str) -> None:
    usage = (await streamed(chat(model, max_tokens=4, stream_options=USAGE)))[-1]["usage"]
    assert usage == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    usage = (await whole(chat(model, max_tokens=4)))["usage"]
    assert usage["prompt_tokens_details"] is None
    assert usage["completion_tokens_details"] is None


async def test_usage_with_the_parser_reports_zero_reasoning_tokens() -> None:
    """vLLM 0.32's bug when the template opened the think block; the gateway works around it."""
    body = chat("deepseek-r1-parsed", seed=PARSED_SEED)
    script = build_script("separated", PARSED_SEED, prompt_tokens=5, question=PROMPT)
    for usage in (
        (await streamed({**body, "stream_options": USAGE}))[-1]["usage"],
        (await whole(body))["usage"],
    ):
        assert usage["completion_tokens"] == script.completion_tokens
        assert usage["completion_tokens_details"] == {"reasoning_tokens": 0}


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_tokens_override_in_both_paths(stream: bool) -> None:
    forced = chat(sim={"reasoning_tokens": 3}, max_tokens=4)
    nulled = chat("deepseek-r1-parsed", sim={"reasoning_tokens": None}, max_tokens=4)
    usages = []
    for body in (forced, nulled):
        if stream:
            usages.append((await streamed({**body, "stream_options": USAGE}))[-1]["usage"])
        else:
            usages.append((await whole(body))["usage"])
    assert usages[0]["completion_tokens_details"] == {"reasoning_tokens": 3}
    assert usages[1].get("completion_tokens_details") is None
    assert ("completion_tokens_details" in usages[1]) is not stream


# --- 4. a spelled </think> is not recognised by vLLM's parser -------------------------------


async def test_spelled_tag_leaves_the_answer_in_reasoning() -> None:
    text = compose(SPELLED_SEED, PROMPT)
    body = chat("deepseek-r1-parsed", seed=SPELLED_SEED)
    chunks = await streamed(body)
    assert deltas(chunks, "reasoning") == text.reasoning + CLOSE_TAG + text.answer
    assert deltas(chunks, "content") == ""
    message = (await whole(body))["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == (
        text.reasoning + CLOSE_TAG + text.answer,
        None,
    )


async def test_one_token_tag_sends_no_delta() -> None:
    chunks = await streamed(chat("deepseek-r1-parsed", seed=PARSED_SEED))
    assert deltas(chunks, "reasoning") == compose(PARSED_SEED, PROMPT).reasoning
    assert deltas(chunks, "content") == compose(PARSED_SEED, PROMPT).answer
    assert all("think>" not in orjson.dumps(c["delta"]).decode() for c in choices(chunks))


async def test_scripted_spelled_tag_is_reasoning_too() -> None:
    sim = {"chunks": [["reasoning", "hm"], ["reasoning", "</th"], ["reasoning", "ink>"], "Hi"]}
    chunks = await streamed(chat("deepseek-r1-parsed", sim=sim))
    assert [c["delta"] for c in choices(chunks)[1:-1]] == [
        {"reasoning": "hm"},
        {"reasoning": "</th"},
        {"reasoning": "ink>"},
        {"reasoning": "Hi"},
    ]
    one = {"chunks": [["reasoning", "hm"], ["reasoning", CLOSE_TAG], "Hi"]}
    chunks = await streamed(chat("deepseek-r1-parsed", sim=one))
    assert [c["delta"] for c in choices(chunks)[1:-1]] == [{"reasoning": "hm"}, {"content": "Hi"}]


# --- 5. stop strings and vllm-project/vllm#51641 -------------------------------------------


@pytest.mark.parametrize(
    ("stop", "tail"), [(["Xy"], ">"), (["Xyz", "Q"], "k>"), ("Xyzabc", "hink>")]
)
async def test_stop_strings_garble_the_separated_stream_only(stop: Any, tail: str) -> None:
    text = compose(PARSED_SEED, PROMPT)
    body = chat("deepseek-r1-parsed", seed=PARSED_SEED, stop=stop)
    chunks = await streamed(body)
    assert deltas(chunks, "reasoning") == text.reasoning[: -len(tail)]
    assert deltas(chunks, "content") == tail + text.answer
    first_content = next(c for c in choices(chunks)[1:] if "content" in c["delta"])
    assert first_content["delta"]["content"].startswith(tail)
    message = (await whole(body))["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == (text.reasoning, text.answer)


@pytest.mark.parametrize("body", [{"stop": ["X"]}, {"stop": []}, {"stop": None}, {}])
async def test_one_character_or_no_stop_changes_nothing(body: dict[str, Any]) -> None:
    chunks = await streamed(chat("deepseek-r1-parsed", seed=PARSED_SEED, **body))
    assert deltas(chunks, "reasoning") == compose(PARSED_SEED, PROMPT).reasoning
    assert deltas(chunks, "content") == compose(PARSED_SEED, PROMPT).answer


async def test_no_garbling_without_a_parser_or_with_a_spelled_tag() -> None:
    template = chat(seed=PARSED_SEED, stop=["Xyz"])
    assert (
        deltas(await streamed(template))
        == (await whole(template))["choices"][0]["message"]["content"]
    )
    spelled = chat("deepseek-r1-parsed", seed=SPELLED_SEED, stop=["Xyz"])
    text = compose(SPELLED_SEED, PROMPT)
    assert deltas(await streamed(spelled), "reasoning") == text.reasoning + CLOSE_TAG + text.answer


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_truncates_the_output(stream: bool) -> None:
    sim = {"chunks": ["Let", " me", " see", ". 42"]}
    body = chat(sim=sim, stop=[" se", "zzz"], stream_options=USAGE if stream else None)
    if stream:
        chunks = await streamed(body)
        assert deltas(chunks) == "Let me"
        assert choices(chunks)[-1]["finish_reason"] == "stop"
        assert choices(chunks)[-1]["stop_reason"] == " se"
        assert chunks[-1]["usage"]["completion_tokens"] == 3
    else:
        result = await whole(body)
        (choice,) = result["choices"]
        assert (choice["message"]["content"], choice["finish_reason"]) == ("Let me", "stop")
        assert choice["stop_reason"] == " se"
        assert result["usage"]["completion_tokens"] == 3


async def test_stops_apply_to_the_reasoning_too() -> None:
    body = chat("deepseek-r1-parsed", seed=PARSED_SEED, stop="Let me think")
    message = (await whole(body))["choices"][0]["message"]
    assert message["reasoning"] == compose(PARSED_SEED, PROMPT).reasoning.split("Let me think")[0]
    assert message["content"] is None


# --- 6. merged tokens ----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["deepseek-r1", "deepseek-r1-parsed"])
async def test_merge_sends_several_tokens_per_delta(model: str) -> None:
    body = chat(model, seed=PARSED_SEED, stream_options=USAGE)
    one = await streamed(body)
    merged = await streamed({**body, "sim": {"merge": 3}})
    for field in ("content", "reasoning"):
        assert deltas(merged, field) == deltas(one, field)
    assert merged[-1]["usage"] == one[-1]["usage"]
    assert len(merged) < len(one) / 2
    mode: SimMode = "separated" if model == "deepseek-r1-parsed" else "template"
    script = build_script(mode, PARSED_SEED, prompt_tokens=5, question=PROMPT)
    (first,) = choices(merged)[1]["delta"].values()
    assert first == "".join(piece.text for piece in script.pieces[:3])


async def test_merge_keeps_channels_apart() -> None:
    sim = {"merge": 5, "chunks": [["reasoning", "a"], ["reasoning", "b"], ["content", "c"], "d"]}
    chunks = await streamed(chat("deepseek-r1-parsed", sim=sim))
    assert [c["delta"] for c in choices(chunks)[1:-1]] == [{"reasoning": "ab"}, {"content": "cd"}]


# --- the encoder's bytes -------------------------------------------------------------------


def test_encoder_bytes_are_compact_json() -> None:
    encoder = ChunkEncoder("chatcmpl-1", 7, "m", include_usage=True)
    events = [
        encoder.role(0),
        encoder.delta(1, Delta("reasoning", 'say "hi"\n', 2)),
        encoder.finish(0, "length", None),
        encoder.finish(0, "stop", "</x>"),
        encoder.usage(SimUsage(3, 4, 0)),
    ]
    for event in events:
        assert event.startswith(b"data: ")
        assert event.endswith(b"\n\n")
        payload = event[6:-2]
        assert orjson.dumps(orjson.loads(payload)) == payload
    assert orjson.loads(events[3][6:-2])["choices"][0]["stop_reason"] == "</x>"


# --- each format's markers, an empty reasoning, thinking switched off ----------------------


@pytest.mark.parametrize(
    ("model", "opening", "close"),
    [
        ("deepseek-r1", None, "\n</think>\n\n"),
        ("qwen3", "<think>\n", "\n</think>\n\n"),
        ("kimi-k3", None, "\n<|close|>think<|sep|>\n\n"),
        ("minimax-m2", None, "\n</think>\n\n"),
    ],
)
async def test_each_model_writes_its_formats_markers(
    model: str, opening: str | None, close: str
) -> None:
    text = compose(7, PROMPT)
    message = (await whole(chat(model, seed=7)))["choices"][0]["message"]
    assert message["content"] == (opening or "") + text.reasoning + close + text.answer
    assert message["reasoning"] is None


async def test_a_format_can_be_asked_for_per_request_and_must_have_markers() -> None:
    message = (await whole(chat("deepseek-r1", seed=7, sim={"format": "kimi_k3"})))["choices"]
    assert "<|close|>think<|sep|>" in message[0]["message"]["content"]
    async with in_process() as (client, _):
        bad = await client.post("/v1/chat/completions", json=chat(sim={"format": "none"}))
    assert bad.status_code == 400


async def test_an_empty_reasoning_behind_a_separating_engine_sends_content_only() -> None:
    # R1 on a trivial prompt: the first token is </think>, which vLLM's parser consumes.
    body = chat("deepseek-r1-parsed", seed=7, sim={"empty_reasoning": True})
    chunks = await streamed({**body, "stream_options": USAGE})
    sent = [c["delta"] for c in choices(chunks)]
    assert all("reasoning" not in d for d in sent)
    assert "".join(d.get("content") or "" for d in sent) == compose(7, PROMPT).answer
    message = (await whole(body))["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == (None, compose(7, PROMPT).answer)


async def test_an_empty_reasoning_in_the_text_is_a_lone_close_marker() -> None:
    body = chat("deepseek-r1", seed=7, sim={"empty_reasoning": True})
    message = (await whole(body))["choices"][0]["message"]
    assert message["content"] == "</think>\n\n" + compose(7, PROMPT).answer


@pytest.mark.parametrize(
    "switch",
    [
        {"chat_template_kwargs": {"thinking": False}},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"reasoning_effort": "none"},
    ],
)
async def test_thinking_off_is_the_answer_alone_and_an_r1_parser_calls_it_reasoning(
    switch: dict[str, Any],
) -> None:
    answer = compose(7, PROMPT).answer
    raw = (await whole(chat("deepseek-r1", seed=7, **switch)))["choices"][0]["message"]
    assert (raw["content"], raw["reasoning"]) == (answer, None)
    parsed = (await whole(chat("deepseek-r1-parsed", seed=7, **switch)))["choices"][0]
    assert (parsed["message"]["content"], parsed["message"]["reasoning"]) == (None, answer)
