"""One completion record per request, however it ended, with what the ledger will need."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import RecordingSink

MESSAGES: list[Any] = [{"role": "user", "content": "Why is the sky blue?"}]


async def test_completed_streams_and_responses_are_recorded_once(stack_factory: Any) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sink=sink)
    sim = {"chunks": ["Rayleigh", "</think>", "\n\nBlue."]}
    async with openai.AsyncOpenAI(
        base_url=stack.url, api_key=stack.keys["hidden"], max_retries=0
    ) as c:
        stream = await c.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, stream=True, extra_body={"sim": sim}
        )
        async for _ in stream:
            pass
        await c.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, extra_body={"sim": sim}
        )
    streamed, whole = await sink.wait_for(2)
    for record in (streamed, whole):
        assert record.status == "ok" and not record.client_disconnected
        assert record.reasoning == ("Rayleigh",) and record.content == ("\n\nBlue.",)
        assert record.messages == MESSAGES and record.tenant == "acme"
        assert record.usage is not None
        assert record.usage.reasoning_tokens >= 1
        assert record.first_token_at is not None and record.started_at <= record.first_token_at
        assert record.first_token_at <= record.ended_at
    assert streamed.stream and not whole.stream
    assert streamed.finish_reasons == ("stop",)
    assert len(sink.records) == 2


async def test_failures_and_disconnects_are_recorded_with_their_status(stack_factory: Any) -> None:
    sink = RecordingSink()
    stack = await stack_factory(sim=SimConfig(itl_ms=20), sink=sink)
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient(timeout=10) as client:
        drop = {
            "model": "deepseek-r1",
            "messages": MESSAGES,
            "stream": True,
            "sim": {"fail": "drop", "fail_after": 3},
        }
        await client.post(f"{stack.url}/chat/completions", json=drop, headers=headers)
        body = {"model": "deepseek-r1", "messages": MESSAGES, "stream": True, "max_tokens": 2000}
        async with client.stream(
            "POST", f"{stack.url}/chat/completions", json=body, headers=headers
        ) as r:
            await anext(r.aiter_bytes())
    dropped, gone = await sink.wait_for(2)
    assert dropped.status == "upstream_error" and dropped.error_code == "upstream_protocol_error"
    assert gone.status == "client_disconnected" and gone.client_disconnected
    assert gone.reasoning[0]  # what was produced before the client left is kept
    assert len(sink.records) == 2
