"""Room for the answer (``gateway.api.room``): a client that asks for more tokens than the
engine's context leaves after its prompt (Claude Code's ``max_tokens: 32000`` in front of a
model with a 2,048-token context) is served with the limit clamped, said in
``x-thinkgate-clamped``, on every endpoint; refused naming ``max_tokens`` in strict mode.
Without the clamp the engine (the simulator, as vLLM) refuses the request outright."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from gateway.side.sim.app import SimApp, SimConfig
from tests.e2e.conftest import StackFactory

CONTEXT = 2048
ASKED = 32_000
REQUESTS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": ASKED},
    "/v1/completions": {"prompt": "hi", "max_tokens": ASKED},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": ASKED},
    "/v1/responses": {"input": "hi", "max_output_tokens": ASKED},
}  # fmt: skip


async def post(stack: Any, path: str) -> httpx.Response:
    body = {"model": "deepseek-r1", **REQUESTS[path]}
    auth = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient(base_url=stack.root, timeout=30) as client:
        return await client.post(path, json=body, headers=auth)


@pytest.mark.parametrize("path", list(REQUESTS))
async def test_a_limit_past_the_context_is_clamped_to_the_room_left(
    stack_factory: StackFactory, path: str
) -> None:
    stack = await stack_factory(sim=SimConfig(max_model_len=CONTEXT))
    response = await post(stack, path)
    assert response.status_code == 200, response.text
    header = response.headers["x-thinkgate-clamped"]
    assert f"asked={ASKED}" in header and f"context={CONTEXT}" in header
    room = int(header.split(";")[0].removeprefix("max_tokens="))
    assert 0 < room < CONTEXT
    assert isinstance(stack.sim, SimApp)
    sent = stack.sim.sim.received[-1]
    assert max(sent.get("max_tokens") or 0, sent.get("max_completion_tokens") or 0) == room


async def test_strict_mode_refuses_it_naming_max_tokens(stack_factory: StackFactory) -> None:
    stack = await stack_factory(sim=SimConfig(max_model_len=CONTEXT), unknown_fields="refuse")
    response = await post(stack, "/v1/chat/completions")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"
    assert isinstance(stack.sim, SimApp) and not stack.sim.sim.received


async def test_a_limit_within_the_context_is_left_alone(stack_factory: StackFactory) -> None:
    stack = await stack_factory(sim=SimConfig(max_model_len=CONTEXT))
    async with httpx.AsyncClient(base_url=stack.root, timeout=30) as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "deepseek-r1", "max_tokens": 64,
                  "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {stack.keys['visible']}"},
        )  # fmt: skip
    assert response.status_code == 200 and "x-thinkgate-clamped" not in response.headers
    assert isinstance(stack.sim, SimApp) and stack.sim.sim.received[-1]["max_tokens"] == 64


@pytest.mark.parametrize("truncation", ["auto", "disabled"])
async def test_truncation_auto_drops_the_oldest_turns_to_fit_through_the_sdk(
    stack_factory: StackFactory, truncation: str
) -> None:
    """A conversation longer than the engine's context: with ``auto`` its oldest turns go
    (said in ``x-thinkgate-truncated``, echoed), and the engine answers; with ``disabled``
    nothing is cut and the engine refuses it, as vLLM does."""
    stack = await stack_factory(sim=SimConfig(max_model_len=CONTEXT))
    long = "lorem ipsum " * 400  # some 1,200 tokens by the estimate
    history: list[Any] = [{"role": "user", "content": f"first {long}"},
                          {"role": "assistant", "content": f"answer {long}"},
                          {"role": "user", "content": "Why?"}]  # fmt: skip
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        raw = client.responses.with_raw_response
        if truncation == "disabled":
            with pytest.raises(openai.BadRequestError):
                await raw.create(model="deepseek-r1", input=history, truncation="disabled")
            return
        reply = await raw.create(model="deepseek-r1", input=history, truncation="auto",
                                 max_output_tokens=256)  # fmt: skip
    done = reply.parse()
    assert done.status == "completed" and done.truncation == "auto"
    assert reply.headers["x-thinkgate-truncated"] == f"dropped=2; context={CONTEXT}"
    assert isinstance(stack.sim, SimApp)
    assert stack.sim.sim.received[-1]["messages"] == [{"role": "user", "content": "Why?"}]
