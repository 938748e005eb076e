"""The upstream fault matrix, on real sockets: for each fault (refused, reset mid-stream, stall
past the idle timeout, invalid JSON in an SSE event, an event over the size limit, HTML with
200), streamed and whole, what the client sees, what the ledger record holds and what the
metrics say. ``tests/e2e/test_failures.py`` covers what the client sees in more shapes;
Redis, PostgreSQL and kill -9 live in ``test_rate_limits.py`` and ``test_ledger_crash.py``.

Rules asserted: a fault before the response starts is an OpenAI error with its status; after
it started, the good part is delivered, then exactly one ``error`` event, then ``[DONE]``. Each
request leaves exactly one record (``status="upstream_error"``, the error's code, the upstream
URL, the text relayed before the fault) and adds one to ``thinkgate_requests_total`` and to
``thinkgate_upstream_errors_total`` with the fault's kind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import Receive, Scope, Send

from gateway.edge.servers import BackgroundServer
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import RecordingSink, Stack, StackFactory
from tests.e2e.test_failures import sse_events

MODEL = "deepseek-r1"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
EVENT_LIMIT = 2048

# -- fake model servers --------------------------------------------------------------------

GOOD_CHUNK = {
    "id": "chatcmpl-fake",
    "object": "chat.completion.chunk",
    "model": MODEL,
    "choices": [{"index": 0, "delta": {"content": "r</think>ok"}, "finish_reason": None}],
}
HTML = b"<!doctype html><html><head><title>Login</title></head><body>Sign in</body></html>"


def sse(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else orjson.dumps(payload)) + b"\n\n"


def huge_event() -> bytes:
    """One well-formed chunk whose event is larger than ``EVENT_LIMIT``."""
    big = {**GOOD_CHUNK, "choices": [{"index": 0, "delta": {"content": "x" * 4 * EVENT_LIMIT}}]}
    return sse(big)


def fake_upstream(
    content_type: bytes, stream_parts: list[bytes], whole: bytes
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A model server that lists ``deepseek-r1`` and answers every completion with 200 and
    ``content_type``: ``stream_parts`` (one write each) when asked to stream, else ``whole``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if not scope["path"].endswith("/chat/completions"):  # /models, /health
            body = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        request = b""
        while True:
            message = await receive()
            request += message.get("body", b"")
            if not message.get("more_body"):
                break
        parts = stream_parts if orjson.loads(request).get("stream") else [whole]
        headers = [(b"content-type", content_type)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


# -- the matrix ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    name: str
    code: str  # the OpenAI error code the client sees
    kind: str  # the ``kind`` label of thinkgate_upstream_errors_total
    whole_status: int  # the status of a non-streamed request
    started: bool  # whether a streamed response has begun (200 + error event)
    sim: dict[str, Any] | None = None  # the simulator's per-request faults
    relayed: str = ""  # text a streamed request relays before the fault ("" when unknown)


FAULTS = [
    Fault("refused", "upstream_unreachable", "connect", 502, started=False),
    Fault(
        "reset",
        "upstream_protocol_error",
        "protocol",
        502,
        started=True,
        sim={"fail": "drop", "fail_after": 5},
    ),
    Fault(
        "stall",
        "upstream_timeout",
        "timeout",
        504,
        started=True,
        sim={"fail": "stall", "fail_after": 5},
    ),
    Fault("invalid_json", "upstream_protocol_error", "protocol", 502, True, relayed="ok"),
    Fault("oversize_event", "upstream_protocol_error", "protocol", 502, True, relayed="ok"),
    Fault("html_200", "upstream_protocol_error", "protocol", 502, started=False),
]

FAKES = {
    "invalid_json": fake_upstream(
        b"text/event-stream", [sse(GOOD_CHUNK), sse(b"{oops"), sse(b"[DONE]")], b"{oops"
    ),
    "oversize_event": fake_upstream(
        # The good event and the huge one in one write, so they arrive in one read.
        b"text/event-stream",
        [sse(GOOD_CHUNK) + huge_event(), sse(b"[DONE]")],
        huge_event(),
    ),
    "html_200": fake_upstream(b"text/html; charset=utf-8", [HTML], HTML),
}


@dataclass
class Scene:
    stack: Stack
    sink: RecordingSink
    upstream: str  # the upstream's configured URL, as the record and the metrics name it


async def build(
    fault: Fault, stack_factory: StackFactory, exits: AsyncExitStack, stream: bool
) -> Scene:
    """A gateway in front of one upstream that will commit ``fault``, and that URL."""
    sink = RecordingSink()
    if fault.name == "refused":
        # The catalogue is read at start-up, so the upstream is up then and gone after.
        async with BackgroundServer(create_sim_app(SimConfig())) as doomed:
            upstream = f"{doomed.url}/v1"
            stack = await stack_factory(
                extra_upstreams=(upstream,), sink=sink, models_cache_ttl_s=3600
            )
            await list_models(stack)  # the first use reads the catalogue
        return Scene(stack, sink, upstream)
    app = create_sim_app(SimConfig()) if fault.sim is not None else FAKES[fault.name]
    server = await exits.enter_async_context(BackgroundServer(app))
    upstream = f"{server.url}/v1"
    stack = await stack_factory(
        extra_upstreams=(upstream,),
        sink=sink,
        idle_timeout_s=0.3 if fault.name == "stall" else 10.0,
        # a whole answer is silent until it is done: its stall is cut by the first token's
        # timeout, a stream's by the idle one; nothing else may be cut by it (a loaded
        # machine took over a second for a stream's first token in a full run)
        first_token_timeout_s=1.0 if fault.name == "stall" and not stream else 10.0,
        max_sse_event_bytes=EVENT_LIMIT,
        models_cache_ttl_s=3600,
    )
    return Scene(stack, sink, upstream)


async def list_models(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        headers = {"authorization": f"Bearer {stack.keys['visible']}"}
        response = await client.get(f"{stack.url}/models", headers=headers)
    assert response.status_code == 200, response.text


async def ask(stack: Stack, fault: Fault, stream: bool) -> httpx.Response:
    body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "stream": stream}
    if fault.sim is not None:
        body["sim"] = fault.sim
    async with httpx.AsyncClient(timeout=20) as client:
        return await client.post(
            f"{stack.url}/chat/completions",
            content=orjson.dumps(body),
            headers={"authorization": f"Bearer {stack.keys['visible']}"},
        )


# -- metrics -------------------------------------------------------------------------------

Counts = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(stack: Stack) -> Counts:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{stack.root}/metrics")
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def total(counts: Counts, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in counts.items() if n == name and wanted <= set(ls))


# -- what the client saw -------------------------------------------------------------------


def relayed_text(raw: str) -> tuple[str, str]:
    """The (reasoning, content) a streamed client received before the error event."""
    reasoning, content = [], []
    for name, data in sse_events(raw):
        if name is not None or data == "[DONE]":
            continue
        for choice in orjson.loads(data).get("choices", []):
            delta = choice.get("delta", {})
            reasoning.append(delta.get("reasoning_content") or "")
            content.append(delta.get("content") or "")
    return "".join(reasoning), "".join(content)


def assert_client_saw(fault: Fault, stream: bool, response: httpx.Response) -> tuple[str, str]:
    if stream and fault.started:
        assert response.status_code == 200, response.text
        events = sse_events(response.text)
        errors = [e for e in events if e[0] == "error"]
        assert len(errors) == 1, response.text[-500:]
        assert events[-2][0] == "error" and events[-1] == (None, "[DONE]")
        error = orjson.loads(errors[0][1])["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == fault.code
        reasoning, content = relayed_text(response.text)
        assert reasoning or content, "the good part before the fault was not delivered"
        if fault.relayed:
            assert content == fault.relayed
        return reasoning, content
    status = fault.whole_status if not stream else (504 if fault.kind == "timeout" else 502)
    assert response.status_code == status, response.text
    assert not response.headers["content-type"].startswith("text/event-stream")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["code"] == fault.code
    return "", ""


# -- the test ------------------------------------------------------------------------------


def case(fault: Fault, stream: bool) -> Any:
    return pytest.param(fault, stream, id=f"{fault.name}-{'stream' if stream else 'whole'}")


CASES = [case(fault, stream) for fault in FAULTS for stream in (True, False)]


@pytest.mark.parametrize(("fault", "stream"), CASES)
async def test_fault(stack_factory: StackFactory, fault: Fault, stream: bool) -> None:
    async with AsyncExitStack() as exits:
        await check_fault(await build(fault, stack_factory, exits, stream), fault, stream)


async def check_fault(scene: Scene, fault: Fault, stream: bool) -> None:
    before = await scrape(scene.stack)

    response = await ask(scene.stack, fault, stream)

    reasoning, content = assert_client_saw(fault, stream, response)
    (record,) = await scene.sink.wait_for(1)
    assert record.status == "upstream_error"
    assert record.error_code == fault.code
    assert record.stream is stream
    assert not record.client_disconnected
    assert "".join(record.reasoning) == reasoning
    assert "".join(record.content) == content
    after = await scrape(scene.stack)
    requests = "thinkgate_requests_total"
    labels = {"model": MODEL, "status": "upstream_error", "stream": str(stream).lower()}
    assert total(after, requests, **labels) - total(before, requests, **labels) == 1
    errors = "thinkgate_upstream_errors_total"
    labels = {"upstream": scene.upstream, "kind": fault.kind}
    assert total(after, errors, **labels) - total(before, errors, **labels) == 1
    assert total(after, errors) - total(before, errors) == 1
    assert len(scene.sink.records) == 1
    assert record.upstream == scene.upstream  # last: see NO_UPSTREAM_IN_RECORD
