"""How the simulator tests talk to a simulator: in process (shapes) or over a socket
(streaming, disconnects), and how they read its streams back."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import httpx
import orjson
import uvicorn

from gateway.side.sim import SimConfig, SimState, build_script, create_sim_app
from gateway.side.sim.pieces import ScriptedCall
from gateway.side.sim.script import ToolPlan

PROMPT = "What is a prime number?"
Client = tuple[httpx.AsyncClient, SimState]


def chat(model: str = "deepseek-r1", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], **extra}


def tag_seed(one_token: bool, tool: bool = False) -> int:
    """The first seed whose close tag, for ``PROMPT`` in separated mode, is one token (which
    vLLM's parser swallows) or spelled over several (which it cannot): found, not hard-coded,
    so a change of the simulator's prose cannot silently change what a test covers."""
    plan = ToolPlan(ScriptedCall("x", "get_weather"), '{"city": "sim", "days": 1}')
    for seed in range(1000):
        script = build_script("separated", seed, prompt_tokens=5, question=PROMPT,
                              tool=plan if tool else None)  # fmt: skip
        assert script.tag_at is not None
        whole = script.pieces[script.tag_at].text == ""  # the parser consumed the one token
        if whole == one_token:
            return seed
    raise AssertionError("no such seed")


def question(body: dict[str, Any]) -> str:
    """The last user message of a chat body: what the simulated model talks about."""
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


@contextlib.asynccontextmanager
async def in_process(config: SimConfig | None = None) -> AsyncIterator[Client]:
    app = create_sim_app(config or SimConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        yield client, app.state.sim


@contextlib.asynccontextmanager
async def served(config: SimConfig | None = None) -> AsyncIterator[Client]:
    """uvicorn on a socket bound and listening before the server starts: no start-up wait."""
    app = create_sim_app(config or SimConfig())
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", log_config=None))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            yield client, app.state.sim
    finally:
        server.should_exit = True
        await task
        sock.close()


async def read_events(response: httpx.Response, limit: int | None = None) -> list[str]:
    """The ``data:`` payloads, up to ``limit`` of them."""
    events: list[str] = []
    async with lines_of(response) as lines:
        async for line in lines:
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
            if limit is not None and len(events) >= limit:
                break
    return events


async def collect_lines(client: httpx.AsyncClient, body: dict[str, Any], into: list[str]) -> None:
    """Append every line of a streamed response to ``into``, even if the stream breaks."""
    async with (
        client.stream("POST", "/v1/chat/completions", json=body) as response,
        lines_of(response) as lines,
    ):
        async for line in lines:
            into.append(line)


def lines_of(response: httpx.Response) -> contextlib.aclosing[AsyncGenerator[str, None]]:
    """The response's lines, closed on exit even when the caller stops early."""
    return contextlib.aclosing(cast(AsyncGenerator[str, None], response.aiter_lines()))


async def stream_chunks(client: httpx.AsyncClient, body: dict[str, Any]) -> list[Any]:
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = await read_events(response)
    assert events[-1] == "[DONE]"
    return [orjson.loads(event) for event in events[:-1]]


def deltas(chunks: list[Any], field: str = "content", index: int = 0) -> str:
    return "".join(
        choice["delta"].get(field) or ""
        for chunk in chunks
        for choice in chunk["choices"]
        if choice["index"] == index
    )


def choices(chunks: list[Any], index: int = 0) -> list[Any]:
    """The choice objects of choice ``index``, chunk by chunk."""
    return [c for chunk in chunks for c in chunk["choices"] if c["index"] == index]
