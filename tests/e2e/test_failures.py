"""Failure behaviour, each with what the client sees: auth, validation, upstream faults,
mid-stream failures (exactly one SSE error event, then [DONE]) and client disconnects."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import openai
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from gateway.edge.servers import BackgroundServer
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import Stack
from tests.openai_errors import assert_openai_error

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def sdk(stack: Stack, key: str = "visible", api_key: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url, api_key=api_key or stack.keys[key], max_retries=0)


async def post(stack: Stack, body: Any, key: str | None = "visible", **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {stack.keys[key]}"} if key else {}
    async with httpx.AsyncClient(timeout=30) as client:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        return await client.post(
            f"{stack.url}/chat/completions", content=content, headers=headers, **kw
        )


def sse_events(raw: str) -> list[tuple[str | None, str]]:
    events = []
    for block in raw.strip().split("\n\n"):
        name = None
        data = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        events.append((name, "\n".join(data)))
    return events


def assert_one_terminal_error(raw: str, code: str) -> dict[str, Any]:
    events = sse_events(raw)
    errors = [e for e in events if e[0] == "error"]
    assert len(errors) == 1, raw[-500:]
    assert events[-2][0] == "error" and events[-1] == (None, "[DONE]")
    error = orjson.loads(errors[0][1])["error"]
    assert error["code"] == code
    return dict(error)


# -- authentication and validation ---------------------------------------------------------


async def test_missing_bad_and_revoked_keys_are_401(stack: Stack) -> None:
    body = {"model": "deepseek-r1", "messages": MESSAGES}
    assert_openai_error(await post(stack, body, key=None), 401, "missing_api_key")
    async with sdk(stack, api_key="sk-tg-000000000000-" + "A" * 43) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model="deepseek-r1", messages=MESSAGES)
    error = assert_openai_error(await post(stack, body, key="revoked"), 401, "revoked_api_key")
    assert stack.keys["revoked"] not in error["message"]


@pytest.mark.parametrize("key", ["auditor", "admin"])
async def test_other_roles_on_v1_are_403(stack: Stack, key: str) -> None:
    async with sdk(stack, key) as client:
        with pytest.raises(openai.PermissionDeniedError):
            await client.chat.completions.create(model="deepseek-r1", messages=MESSAGES)


async def test_client_key_on_admin_route_is_403(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.get(
            f"{stack.root}/admin/v1/keys",
            headers={"authorization": f"Bearer {stack.keys['visible']}"},
        )
    assert_openai_error(response, 403)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "deepseek-r1"}, "messages"),
        ({"messages": MESSAGES}, "model"),
        ({"model": "deepseek-r1", "messages": "hi"}, "messages"),
        ({"model": "deepseek-r1", "messages": []}, "messages"),
        ({"model": "deepseek-r1", "messages": [{"content": "x"}]}, "messages.0.role"),
        ({"model": "deepseek-r1", "messages": MESSAGES, "n": "2"}, "n"),
        ({"model": "deepseek-r1", "messages": MESSAGES, "n": 0}, "n"),
        ({"model": "deepseek-r1", "messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"model": "deepseek-r1", "messages": MESSAGES, "max_tokens": -1}, "max_tokens"),
    ],
)
async def test_invalid_requests_are_400_with_param(stack: Stack, body: Any, param: str) -> None:
    error = assert_openai_error(await post(stack, body), 400)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b"\xff\xfe"])
async def test_undecodable_bodies_are_400(stack: Stack, raw: bytes) -> None:
    assert_openai_error(await post(stack, raw), 400)


async def test_body_over_the_limit_is_413(stack_factory: Any) -> None:
    stack = await stack_factory(max_body_bytes=4096)
    body = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "x" * 5000}]}
    assert_openai_error(await post(stack, body), 413, "request_too_large")


async def test_unknown_model_is_404(stack: Stack) -> None:
    async with sdk(stack) as client:
        with pytest.raises(openai.NotFoundError) as info:
            await client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert info.value.code == "model_not_found"


async def test_unknown_route_is_an_openai_404(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        assert_openai_error(await client.get(f"{stack.url}/nope"), 404)


# -- upstream failures before the first byte -------------------------------------------------


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def test_refused_upstream_is_502_and_the_other_upstream_serves(stack_factory: Any) -> None:
    doomed = BackgroundServer(create_sim_app(SimConfig()))
    async with doomed:
        stack = await stack_factory(
            sim=SimConfig(), extra_upstreams=(f"{doomed.url}/v1",), models_cache_ttl_s=60
        )
        assert (
            await post(stack, {"model": "deepseek-r1", "messages": MESSAGES})
        ).status_code == 200
    alone = await stack_factory(extra_upstreams=(f"{doomed.url}/v1",), upstream_apps=[])
    assert (await post(alone, {"model": "deepseek-r1", "messages": MESSAGES})).status_code == 503
    # ``stack`` still lists the dead upstream in its cached catalogue, next to a healthy one:
    # every request still succeeds, through the retry when the dead one is tried first.
    for _ in range(6):
        assert (
            await post(stack, {"model": "deepseek-r1", "messages": MESSAGES})
        ).status_code == 200


async def test_refused_upstream_alone_is_502(stack_factory: Any) -> None:
    doomed = BackgroundServer(create_sim_app(SimConfig()))
    async with doomed:
        stack = await stack_factory(extra_upstreams=(f"{doomed.url}/v1",), upstream_apps=[])
        assert (
            await post(stack, {"model": "deepseek-r1", "messages": MESSAGES})
        ).status_code == 200
    assert_openai_error(
        await post(stack, {"model": "deepseek-r1", "messages": MESSAGES}),
        502,
        "upstream_unreachable",
    )
    stream = {"model": "deepseek-r1", "messages": MESSAGES, "stream": True}
    assert_openai_error(await post(stack, stream), 502, "upstream_unreachable")


async def test_upstream_5xx_is_502_alone_and_retried_with_two(stack_factory: Any) -> None:
    failing = create_sim_app(SimConfig(error_rate=1.0))
    alone = await stack_factory(upstream_apps=[failing])
    assert_openai_error(await post(alone, {"model": "deepseek-r1", "messages": MESSAGES}), 502)
    both = await stack_factory(
        sim=SimConfig(), upstream_apps=[create_sim_app(SimConfig(error_rate=1.0))]
    )
    for stream in (False, True, False, True):
        body = {"model": "deepseek-r1", "messages": MESSAGES, "stream": stream}
        assert (await post(both, body)).status_code == 200


async def test_timeout_before_the_first_token_is_504(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SimConfig(ttft_ms=5000), first_token_timeout_s=0.3)
    for stream in (False, True):
        body = {"model": "deepseek-r1", "messages": MESSAGES, "stream": stream}
        assert_openai_error(await post(stack, body), 504, "upstream_timeout")


async def test_upstream_4xx_is_relayed_with_its_message(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SimConfig(max_model_len=64))
    body = {
        "model": "deepseek-r1",
        "messages": [{"role": "user", "content": "x" * 400}],
        "max_tokens": 10,
    }
    async with sdk(stack) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(**body)
    assert "maximum context length" in info.value.message


# -- failures after streaming began ------------------------------------------------------------


def faulty_stream(fail: str) -> dict[str, Any]:
    """A streaming request that makes the simulator fail after five pieces."""
    sim = {"fail": fail, "fail_after": 5}
    return {"model": "deepseek-r1", "messages": MESSAGES, "stream": True, "sim": sim}


async def test_upstream_drop_mid_stream_is_one_error_event(stack: Stack) -> None:
    response = await post(stack, faulty_stream("drop"))
    assert response.status_code == 200
    assert_one_terminal_error(response.text, "upstream_protocol_error")
    async with sdk(stack) as client:
        stream = await client.chat.completions.create(
            model="deepseek-r1",
            messages=MESSAGES,
            stream=True,
            extra_body={"sim": {"fail": "drop", "fail_after": 5}},
        )
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass


async def test_upstream_stall_past_the_idle_timeout_is_one_error_event(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SimConfig(), idle_timeout_s=0.3)
    response = await post(stack, faulty_stream("stall"))
    assert_one_terminal_error(response.text, "upstream_timeout")


async def garbage_upstream(scope: Scope, receive: Receive, send: Send) -> None:
    """A model server that sends one good chunk, then an event that is not JSON."""
    if scope["type"] != "http":
        return
    if scope["path"].endswith("/models"):
        body = orjson.dumps({"object": "list", "data": [{"id": "deepseek-r1", "object": "model"}]})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    good = {"choices": [{"index": 0, "delta": {"content": "r</think>ok"}, "finish_reason": None}]}
    await send(
        {
            "type": "http.response.body",
            "body": b"data: " + orjson.dumps(good) + b"\n\n",
            "more_body": True,
        }
    )
    await send({"type": "http.response.body", "body": b"data: {oops\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


async def test_malformed_sse_is_one_error_event_after_the_good_part(stack_factory: Any) -> None:
    stack = await stack_factory(upstream_apps=[garbage_upstream])
    response = await post(stack, {"model": "deepseek-r1", "messages": MESSAGES, "stream": True})
    assert '"content":"ok"' in response.text
    assert_one_terminal_error(response.text, "upstream_protocol_error")


# -- client disconnects --------------------------------------------------------------------


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_client_disconnect_cancels_the_upstream_within_200ms(
    stack_factory: Any, key: str
) -> None:
    stack = await stack_factory(sim=SimConfig(itl_ms=20))
    assert stack.sim is not None
    body = {"model": "deepseek-r1", "messages": MESSAGES, "stream": True, "max_tokens": 2000}
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream(
            "POST",
            f"{stack.url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {stack.keys[key]}"},
        ) as response,
    ):
        assert response.status_code == 200
        if key == "visible":
            reader = response.aiter_bytes()
            await anext(reader)
        # hidden: the reasoning is withheld, so nothing arrives; the client leaves anyway
        await stack.sim.sim.wait_for(lambda s: s.running == 1, timeout=5)
        closed_at = time.monotonic()
    await stack.sim.sim.wait_for(lambda s: s.cancelled == 1, timeout=5)
    cancelled_at = stack.sim.sim.last_cancel_monotonic
    assert cancelled_at is not None
    # at once, not when the 40 s stream would have ended (3 s: a loaded machine's lag)
    assert cancelled_at - closed_at < 3.0
