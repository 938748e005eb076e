"""A pushed stream's response head rides in one write with the body's first piece, but never
waits for the answer: a hidden key's stream, whose engine has sent only a reasoning chunk
(withheld from that key) and holds its answer back, has its head at once, not at the
keepalive (15 s) nor at the answer."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from starlette.types import Receive, Scope, Send

from gateway.side.sim.app import SimConfig, create_sim_app


def _event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    chunk = {"id": "chatcmpl-held", "object": "chat.completion.chunk", "created": 1,
             "model": "deepseek-r1",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class HeldEngine:
    """The simulator, but a chat stream sends some reasoning, then waits for ``go`` before the
    answer."""

    def __init__(self) -> None:
        self.sim = create_sim_app(SimConfig())
        self.go = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await self.sim(scope, receive, send)
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        first = _event({"reasoning_content": "thinking it over"})  # nothing for a hidden key
        await send({"type": "http.response.body", "body": first, "more_body": True})
        await self.go.wait()
        rest = _event({"content": "the answer"}) + _event({}, "stop") + b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": rest, "more_body": False})


async def test_a_hidden_keys_head_arrives_while_the_engine_still_reasons(
    stack_factory: Any,
) -> None:
    engine = HeldEngine()
    stack = await stack_factory(upstream_apps=[engine])
    body = {"model": "deepseek-r1", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    headers = {"authorization": f"Bearer {stack.keys['hidden']}"}
    async with httpx.AsyncClient(timeout=30) as client:
        request = client.stream("POST", f"{stack.url}/chat/completions", json=body,
                                headers=headers)  # fmt: skip
        # the head is in while the engine holds its answer (the keepalive would be 15 s)
        response = await asyncio.wait_for(request.__aenter__(), 5)
        try:
            assert response.status_code == 200
            assert not engine.go.is_set()
            engine.go.set()
            text = (await response.aread()).decode()
        finally:
            await request.__aexit__(None, None, None)
    assert "the answer" in text and "thinking" not in text
    assert text.rstrip().endswith("data: [DONE]")
