"""The rest of the HTTP surface: pass-through of unknown fields, admin API, health, ids."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from tests.e2e.conftest import Stack

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


class RecordingUpstream:
    """A model server that remembers request bodies and answers with a fixed completion."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].endswith("/models"):
            await self._send(send, {"object": "list", "data": [{"id": "m", "object": "model"}]})
            return
        if not scope["path"].endswith("/chat/completions"):  # /health, /metrics: none here
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(orjson.loads(raw))
        self.headers.append(dict(scope["headers"]))
        message = {"role": "assistant", "content": "r</think>a"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        await self._send(
            send, {"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage}
        )

    async def _send(self, send: Send, body: dict[str, Any]) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"set-cookie", b"route=a")],
            }
        )
        await send({"type": "http.response.body", "body": orjson.dumps(body)})


async def test_unknown_fields_pass_through_and_directives_do_not(stack_factory: Any) -> None:
    upstream = RecordingUpstream()
    stack = await stack_factory(upstream_apps=[upstream])
    extras = {
        "top_k": 20,
        "structured_outputs": {"regex": "a+"},
        "chat_template_kwargs": {"enable_thinking": True},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "include_reasoning": False,
    }
    messages = [*MESSAGES, {"role": "assistant", "content": "x", "reasoning_content": "why"}]
    async with openai.AsyncOpenAI(
        base_url=stack.url, api_key=stack.keys["visible"], max_retries=0
    ) as c:
        result = await c.chat.completions.create(model="m", messages=messages, extra_body=extras)
    assert result.choices[0].message.content == "a"
    (sent,) = upstream.bodies
    # an earlier turn's reasoning goes where vLLM reads it (REASONING_HISTORY, test_chat_history)
    assert sent["messages"] == [
        *MESSAGES,
        {"role": "assistant", "content": "x", "reasoning": "why"},
    ]
    for name in ("top_k", "structured_outputs", "chat_template_kwargs", "tools"):
        assert sent[name] == extras[name]
    assert "include_reasoning" not in sent and "reasoning" not in sent


async def test_streams_always_ask_the_upstream_for_usage(stack_factory: Any) -> None:
    upstream = RecordingUpstream()
    stack = await stack_factory(upstream_apps=[upstream])
    async with httpx.AsyncClient() as client:
        body = {
            "model": "m",
            "messages": MESSAGES,
            "stream": True,
            "stream_options": {"include_usage": False, "continuous_usage_stats": True},
        }
        await client.post(
            f"{stack.url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {stack.keys['visible']}"},
        )
    assert upstream.bodies[0]["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }


async def admin(stack: Stack, method: str, path: str, **kw: Any) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.request(
            method,
            f"{stack.root}/admin/v1{path}",
            headers={"authorization": f"Bearer {stack.keys['admin']}"},
            **kw,
        )


async def test_admin_api_creates_lists_and_revokes_keys(stack: Stack) -> None:
    created = await admin(
        stack, "POST", "/keys", json={"tenant": "beta", "reasoning": "visible", "rpm": 5}
    )
    assert created.status_code == 201
    key = created.json()
    assert key["key"].startswith("sk-tg-") and key["tenant"] == "beta" and key["rpm"] == 5
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=key["key"], max_retries=0) as client:
        await client.chat.completions.create(model="deepseek-r1", messages=MESSAGES, max_tokens=5)
        listed = (await admin(stack, "GET", "/keys")).json()["data"]
        assert key["id"] in {k["id"] for k in listed}
        assert all("key" not in k for k in listed)
        assert (await admin(stack, "DELETE", f"/keys/{key['id']}")).status_code == 200
        assert (await admin(stack, "DELETE", f"/keys/{key['id']}")).status_code == 404
        with pytest.raises(openai.AuthenticationError) as info:
            await client.chat.completions.create(model="deepseek-r1", messages=MESSAGES)
    assert info.value.code == "revoked_api_key"


async def test_admin_api_rejects_bad_specs(stack: Stack) -> None:
    for spec in (
        {"tenant": ""},
        {"tenant": "a b"},
        {"tenant": "t", "role": "root"},
        {"tenant": "t", "rpm": "5"},
    ):
        response = await admin(stack, "POST", "/keys", json=spec)
        assert response.status_code == 400, spec
        assert response.json()["error"]["type"] == "invalid_request_error"


async def test_health_readiness_and_metrics(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{stack.root}/healthz")).json() == {"status": "ok"}
        vllms = await client.get(f"{stack.root}/health")  # what guidellm probes first
        assert vllms.status_code == 200 and vllms.json() == {"status": "ok"}
        ready = await client.get(f"{stack.root}/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"] == {"upstream": "ok", "database": "ok", "ledger": "ok"}
        metrics = await client.get(f"{stack.root}/metrics")
        assert metrics.status_code == 200 and "process_resident_memory_bytes" in metrics.text


async def test_readiness_fails_without_an_upstream(stack_factory: Any) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    stack = await stack_factory(extra_upstreams=(dead,))
    async with httpx.AsyncClient() as client:
        ready = await client.get(f"{stack.root}/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"] == "ok"


async def test_request_ids(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        mine = await client.get(f"{stack.root}/healthz", headers={"x-request-id": "trace-42"})
        assert mine.headers["x-request-id"] == "trace-42"
        hostile = await client.get(f"{stack.root}/healthz", headers={"x-request-id": "a\tb" * 100})
        assert hostile.headers["x-request-id"].startswith("req_")
        error = await client.post(f"{stack.url}/chat/completions", content=b"{}")
        assert error.status_code == 401 and error.headers["x-request-id"].startswith("req_")


async def test_upstream_cookies_never_travel_with_later_requests(stack_factory: Any) -> None:
    for transport in ("wire", "httpx"):
        upstream = RecordingUpstream()
        stack = await stack_factory(upstream_apps=[upstream], http_transport=transport)
        for key in ("visible", "hidden"):
            async with openai.AsyncOpenAI(
                base_url=stack.url, api_key=stack.keys[key], max_retries=0
            ) as c:
                await c.chat.completions.create(model="m", messages=MESSAGES)
        assert len(upstream.headers) == 2
        assert all(b"cookie" not in h for h in upstream.headers), transport
