"""The simulator app on the wire: in-process for shapes, over a real socket for streaming."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from gateway.side.sim import SimConfig, build_script, create_sim_app
from gateway.side.sim.script import CLOSE_TAG, compose
from tests.gateway.side.sim.clients import (
    PROMPT,
    chat,
    collect_lines,
    deltas,
    in_process,
    read_events,
    served,
    stream_chunks,
    tag_seed,
)

# --- in-process: wire shapes and validation ------------------------------------------------


@pytest.mark.asyncio
async def test_models_lists_every_served_name() -> None:
    async with in_process() as (client, _):
        response = await client.get("/v1/models")
    body = response.json()
    assert body["object"] == "list"
    assert [card["id"] for card in body["data"]] == list(SimConfig().models)
    card = body["data"][0]
    assert card["owned_by"] == "vllm"
    assert card["root"] == card["id"]
    assert card["parent"] is None
    assert card["max_model_len"] == 32768


@pytest.mark.asyncio
async def test_health_and_unknown_routes() -> None:
    async with in_process() as (client, _):
        health = await client.get("/health")
        missing = await client.get("/v2/nothing")
        wrong_method = await client.get("/v1/chat/completions")
    assert (health.status_code, health.content) == (200, b"")
    assert missing.status_code == 404
    assert wrong_method.status_code == 405


@pytest.mark.asyncio
async def test_whole_response_in_template_mode_keeps_the_raw_text() -> None:
    async with in_process() as (client, state):
        response = await client.post("/v1/chat/completions", json=chat(seed=11))
    body = response.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == "deepseek-r1"
    (choice,) = body["choices"]
    text = compose(11, PROMPT)
    assert choice["message"] == {
        "role": "assistant",
        "content": f"{text.reasoning}\n{CLOSE_TAG}\n\n{text.answer}",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,  # vLLM 0.32 sends it explicitly, even without a parser
    }
    assert (choice["index"], choice["logprobs"], choice["finish_reason"]) == (0, None, "stop")
    assert (choice["stop_reason"], choice["token_ids"]) == (None, None)
    script = build_script("template", 11, prompt_tokens=len(PROMPT) // 4, question=PROMPT)
    assert body["usage"] == {
        "prompt_tokens": len(PROMPT) // 4,
        "completion_tokens": script.completion_tokens,
        "total_tokens": len(PROMPT) // 4 + script.completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert (state.requests_total, state.completed, state.running) == (1, 1, 0)


@pytest.mark.asyncio
async def test_whole_response_in_separated_mode_splits_reasoning() -> None:
    seed = tag_seed(one_token=True)
    parsed = chat("deepseek-r1-parsed", seed=seed)
    async with in_process() as (client, _):
        body = (await client.post("/v1/chat/completions", json=parsed)).json()
        cut = await client.post("/v1/chat/completions", json={**parsed, "max_tokens": 5})
    message = body["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == (
        compose(seed, PROMPT).reasoning,
        compose(seed, PROMPT).answer,
    )
    # vLLM 0.32's bug when the template opened the think block: it counts none
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    (choice,) = cut.json()["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning"].startswith("Okay,")
    assert cut.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


@pytest.mark.asyncio
async def test_same_prompt_same_output_and_seeds_per_choice() -> None:
    async with in_process() as (client, _):
        first, again = [
            (await client.post("/v1/chat/completions", json=chat("qwq-32b", n=2))).json()
            for _ in range(2)
        ]
        seeded = (await client.post("/v1/chat/completions", json=chat(n=2, seed=4))).json()
    contents = [choice["message"]["content"] for choice in first["choices"]]
    assert contents == [choice["message"]["content"] for choice in again["choices"]]
    assert contents[0] != contents[1]
    for index, choice in enumerate(seeded["choices"]):
        script = build_script("template", 4 + index, prompt_tokens=1, question=PROMPT)
        assert choice["message"]["content"] == script.text("content")


@pytest.mark.asyncio
async def test_reasoning_tokens_override() -> None:
    async with in_process() as (client, _):
        forced = await client.post(
            "/v1/chat/completions", json=chat(sim={"reasoning_tokens": 3, "chunks": ["a"]})
        )
        nulled = await client.post(
            "/v1/chat/completions",
            json=chat("deepseek-r1-parsed", sim={"reasoning_tokens": None}),
        )
    assert forced.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    assert nulled.json()["usage"]["completion_tokens_details"] is None


@pytest.mark.asyncio
async def test_unknown_model_is_vllms_404() -> None:
    async with in_process() as (client, state):
        response = await client.post("/v1/chat/completions", json=chat("gpt-9"))
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model `gpt-9` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    assert state.requests_total == 0


@pytest.mark.asyncio
async def test_bad_requests_are_400() -> None:
    async with in_process(SimConfig(max_model_len=100)) as (client, _):
        no_messages = await client.post("/v1/chat/completions", json={"model": "deepseek-r1"})
        too_long = await client.post("/v1/chat/completions", json=chat(max_tokens=200))
        not_json = await client.post("/v1/chat/completions", content=b"{")
    for response in (no_messages, too_long, not_json):
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "BadRequestError"
        assert response.json()["error"]["code"] == 400
    assert no_messages.json()["error"]["param"] == "messages"
    message = too_long.json()["error"]["message"]
    assert message.startswith("This model's maximum context length is 100 tokens.")


@pytest.mark.asyncio
async def test_error_fault_is_a_500_before_any_byte() -> None:
    async with in_process(SimConfig(error_rate=1.0)) as (client, state):
        rolled = await client.post("/v1/chat/completions", json=chat())
    async with in_process() as (client, _):
        forced = await client.post("/v1/chat/completions", json=chat(sim={"fail": "error"}))
    for response in (rolled, forced):
        assert response.status_code == 500
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("InternalServerError", 500)
    assert (state.failed, state.running) == (1, 0)


@pytest.mark.asyncio
async def test_each_chunk_is_its_own_compact_body_message() -> None:
    app = create_sim_app(SimConfig())
    body = chat(stream=True, stream_options={"include_usage": True}, sim={"chunks": ["a", "b"]})
    messages: list[Any] = []
    requests = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]
    finished = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and not message["more_body"]:
            finished.set()

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    await app(scope, receive, send)
    bodies = [message["body"] for message in messages[1:]]
    assert len(bodies) == 6  # role, a, b, finish, usage, [DONE]
    assert bodies[-1] == b"data: [DONE]\n\n"
    for event in bodies[:-1]:
        payload = event.removeprefix(b"data: ").removesuffix(b"\n\n")
        assert orjson.dumps(orjson.loads(payload)) == payload


# --- over a socket: streaming, disconnects, faults -----------------------------------------


@pytest.mark.asyncio
async def test_stream_shape_usage_and_done() -> None:
    body = chat(seed=2, stream=True, stream_options={"include_usage": True})
    async with served() as (client, state):
        chunks = await stream_chunks(client, body)
    first = chunks[0]
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": None,
        }
    ]
    assert first["prompt_token_ids"] is None
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert {chunk["id"] for chunk in chunks} == {first["id"]}
    script = build_script("template", 2, prompt_tokens=len(PROMPT) // 4, question=PROMPT)
    pieces = chunks[1:-2]
    assert [c["choices"][0]["delta"] for c in pieces] == [
        {"content": piece.text} for piece in script.pieces
    ]
    assert {c["choices"][0]["finish_reason"] for c in pieces} == {None}
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == script.completion_tokens
    assert "completion_tokens_details" not in chunks[-1]["usage"]
    assert (state.completed, state.kv_tokens_in_use) == (1, 0)


@pytest.mark.asyncio
async def test_stream_without_usage_has_no_usage_field() -> None:
    async with served() as (client, _):
        chunks = await stream_chunks(client, chat(stream=True, sim={"chunks": ["x"]}))
    assert all("usage" not in chunk for chunk in chunks)
    assert [c["choices"][0]["delta"] for c in chunks[1:]] == [{"content": "x"}, {"content": ""}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.asyncio
async def test_scripted_chunks_stream_verbatim_in_their_channels() -> None:
    sim = {"chunks": [["reasoning", "hm"], ["reasoning", "m."], ["content", "Hi"]]}
    options = {"include_usage": True}
    body = chat("deepseek-r1-parsed", stream=True, stream_options=options, sim=sim)
    tags = chat(stream=True, sim={"chunks": ["<thi", "nk>a", "</th", "ink>b"]})
    async with served() as (client, _):
        separated = await stream_chunks(client, body)
        tagged = await stream_chunks(client, tags)
    assert [c["choices"][0]["delta"] for c in separated[1:-1]] == [
        {"reasoning": "hm"},
        {"reasoning": "m."},
        {"content": "Hi"},
        {"content": ""},  # the finish chunk
    ]
    assert separated[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert [c["choices"][0]["delta"]["content"] for c in tagged[1:-1]] == sim_text(tags)


def sim_text(body: dict[str, Any]) -> list[str]:
    chunks: list[str] = body["sim"]["chunks"]
    return chunks


@pytest.mark.asyncio
async def test_n_choices_interleave_round_robin() -> None:
    body = chat(n=2, stream=True, sim={"chunks": ["a", "b", "c"]})
    async with served() as (client, _):
        chunks = await stream_chunks(client, body)
    order = [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks]
    role = {"role": "assistant", "content": ""}
    finish = {"content": ""}
    assert order == [
        (0, role),
        (1, role),
        *[(index, {"content": text}) for text in "ab" for index in (0, 1)],
        (0, {"content": "c"}),
        (0, finish),  # each choice's finish chunk follows its last token at once
        (1, {"content": "c"}),
        (1, finish),
    ]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons == [None] * 7 + ["stop", None, "stop"]
    assert deltas(chunks, index=1) == "abc"


@pytest.mark.asyncio
async def test_client_disconnect_cancels_the_stream() -> None:
    async with served(SimConfig(itl_ms=50)) as (client, state):
        async with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as r:
            assert len(await read_events(r, limit=2)) == 2
        await state.wait_for(lambda s: s.cancelled == 1, timeout=2)
        assert (state.running, state.kv_tokens_in_use, state.completed) == (0, 0, 0)
        assert state.last_cancel_monotonic is not None


@pytest.mark.asyncio
async def test_requests_beyond_kv_capacity_wait() -> None:
    config = SimConfig(kv_capacity_tokens=16, block_size=16)
    holder = chat(stream=True, max_tokens=4, sim={"fail": "stall", "fail_after": 1})
    async with served(config) as (client, state):
        async with client.stream("POST", "/v1/chat/completions", json=holder) as held:
            await read_events(held, limit=2)
            queued = asyncio.create_task(client.post("/v1/chat/completions", json=chat()))
            await state.wait_for(lambda s: s.waiting == 1 and s.running == 1, timeout=2)
        response = await queued
    assert response.status_code == 200
    assert (state.cancelled, state.completed, state.waiting) == (1, 1, 0)


@pytest.mark.asyncio
async def test_drop_cuts_the_stream_without_done() -> None:
    sim = {"fail": "drop", "fail_after": 3, "chunks": list("abcdef")}
    events: list[str] = []
    async with served() as (client, state):
        with pytest.raises(httpx.RemoteProtocolError):
            await collect_lines(client, chat(stream=True, sim=sim), events)
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/chat/completions", json=chat(sim={"fail": "drop"}))
    data = [line for line in events if line]
    assert len(data) == 4  # the role chunk and three pieces
    assert "data: [DONE]" not in data
    assert (state.failed, state.running, state.kv_tokens_in_use) == (2, 0, 0)


@pytest.mark.asyncio
async def test_drop_rate_drops_streams() -> None:
    async with served(SimConfig(drop_rate=1.0)) as (client, state):
        with pytest.raises(httpx.RemoteProtocolError):
            await stream_chunks(client, chat(stream=True))
    assert state.failed == 1


@pytest.mark.asyncio
async def test_a_finite_stall_resumes_the_stream() -> None:
    sim = {"fail": "stall", "fail_after": 1, "stall_ms": 20, "chunks": ["a", "b"]}
    async with served() as (client, state):
        chunks = await stream_chunks(client, chat(stream=True, sim=sim))
    assert deltas(chunks) == "ab"
    assert state.completed == 1


@pytest.mark.asyncio
async def test_disconnect_during_an_endless_stall_cancels() -> None:
    sim = {"fail": "stall", "fail_after": 0}
    async with served() as (client, state):
        request = asyncio.create_task(client.post("/v1/chat/completions", json=chat(sim=sim)))
        await state.wait_for(lambda s: s.running == 1, timeout=2)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await state.wait_for(lambda s: s.cancelled == 1, timeout=2)
    assert state.kv_tokens_in_use == 0
