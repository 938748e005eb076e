"""Streams pushed from the upstream connection's read callback straight to the client's
transport (``gateway.exchange.forward.push_stream``), on real sockets: a client that stops
reading holds the engine back (TCP backpressure all the way, nothing piles up in the
gateway), that wait is not the engine's idle time, and every byte still arrives in order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import RecordingSink, StackFactory
from tests.e2e.test_failures import sse_events

MODEL = "deepseek-r1"
EVENTS = 2500
PIECE = 16 * 1024  # 40 MB in all: more than every socket buffer on the way can hold


class BigStream:
    """A model server streaming ``EVENTS`` content deltas of ``PIECE`` characters as fast as
    its client takes them; ``finished_at`` is when its last write was taken."""

    def __init__(self) -> None:
        self.finished_at: float | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if not scope["path"].endswith("/chat/completions"):
            body = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "more_body": True,
                    "body": event({"reasoning_content": "thinking"})})  # fmt: skip
        for n in range(EVENTS):
            content = f"{n:08d}".ljust(PIECE, ".")
            await send({"type": "http.response.body", "body": event({"content": content}),
                        "more_body": True})  # fmt: skip
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        self.finished_at = time.monotonic()


def event(delta: dict[str, Any]) -> bytes:
    chunk = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "model": MODEL,
             "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def test_a_client_that_stops_reading_holds_the_engine_back(
    stack_factory: StackFactory,
) -> None:
    upstream = BigStream()
    sink = RecordingSink()
    stack = await stack_factory(upstream_apps=[upstream], sink=sink, idle_timeout_s=0.3)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    received = bytearray()
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", f"{stack.url}/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        chunks = r.aiter_raw()
        received += await anext(chunks)
        # What is tested: a client that takes nothing for three idle timeouts.
        await asyncio.sleep(1.0)
        resumed = time.monotonic()
        assert upstream.finished_at is None  # the engine was held back, not buffered
        async for part in chunks:
            received += part
    assert upstream.finished_at is not None and upstream.finished_at > resumed
    events = [line[6:] for line in bytes(received).split(b"\n\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    contents = [orjson.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]
                if b'"error"' not in e]  # fmt: skip
    assert all(b'"error"' not in e for e in events)  # no idle timeout, no error event
    text = "".join(c for c in contents if c)
    assert len(text) == EVENTS * PIECE
    assert [text[i * PIECE : i * PIECE + 8] for i in range(EVENTS)] == [
        f"{n:08d}" for n in range(EVENTS)
    ]
    (record,) = await sink.wait_for(1)
    assert record.status == "ok"


def _normalised(raw: str) -> list[Any]:
    """The events a client reads, minus what differs per response (ids, timestamps)."""
    events: list[Any] = []
    for _, data in sse_events(raw):
        if data == "[DONE]":
            events.append(data)
            continue
        event = orjson.loads(data)
        for volatile in ("id", "created", "system_fingerprint"):
            event.pop(volatile, None)
        if isinstance(event.get("error"), dict):
            event["error"].pop("request_id", None)
        events.append(event)
    return events


@pytest.mark.parametrize("key", ["visible", "hidden"])
@pytest.mark.parametrize(
    "sim",
    [
        pytest.param({"chunks": ["Let", " me", " th", "ink</th", "ink>", "\n\nHi", " there"]},
                     id="split-markers"),
        pytest.param({"fail": "drop", "fail_after": 4}, id="reset-mid-stream"),
    ],
)  # fmt: skip
async def test_pushed_and_pulled_relays_send_the_same_stream(
    stack_factory: StackFactory, key: str, sim: dict[str, Any]
) -> None:
    """The default transport pushes (the wire client), ``HTTP_TRANSPORT=httpx`` pulls (a task
    reads the upstream): one set of rules, so a client reads the same events either way,
    a fault's one terminal error event included."""
    seen = []
    for transport in ("wire", "httpx"):
        stack = await stack_factory(sim=SimConfig(), http_transport=transport)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "stream": True, "seed": 7, "max_tokens": 40, "sim": sim,
                "stream_options": {"include_usage": True}}  # fmt: skip
        headers = {"authorization": f"Bearer {stack.keys[key]}"}
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{stack.url}/chat/completions", json=body,
                                         headers=headers)  # fmt: skip
        assert response.status_code == 200
        seen.append(_normalised(response.text))
    pushed, pulled = seen
    assert pushed == pulled
    assert pushed[-1] == "[DONE]"
    errors = [e for e in pushed if isinstance(e, dict) and "error" in e]
    assert len(errors) == (1 if "fail" in sim else 0)
