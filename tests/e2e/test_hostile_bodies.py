"""No answer without its record, whatever the body: Hypothesis-generated hostile bodies (depth,
width, size, invalid UTF-8, numbers out of range) on every endpoint, against a gateway with its
real ledger (SQLite, strict) in front of the simulator.

For each request: never a 5xx; an engine that was asked means a record (whatever the outcome);
a 200 means a record, and a stream that ends with its API's terminal event. The depth found by
the fault study (an extra field or ``metadata`` nested 253 levels or more: orjson reads 1,024
but writes 254) is among the generated depths, and the boundary cases are pinned below.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import Message, Receive, Scope, Send

from audit.schema import entries
from gateway.api.jsonbody import MAX_DEPTH
from gateway.db import create_engine
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import Stack, StackFactory

MODEL = "deepseek-r1"
ENDPOINTS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 8,
                             "messages": [{"role": "user", "content": "PROMPT"}]},
    "/v1/completions": {"model": MODEL, "prompt": "PROMPT", "max_tokens": 8},
    "/v1/responses": {"model": MODEL, "input": "PROMPT", "max_output_tokens": 8},
    "/v1/messages": {"model": MODEL, "max_tokens": 8,
                     "messages": [{"role": "user", "content": "PROMPT"}]},
    "/v1/embeddings": {"model": MODEL, "input": "PROMPT"},
}  # fmt: skip
TERMINAL = {  # what a stream that ended as its API says ends with
    "/v1/chat/completions": "data: [DONE]",
    "/v1/completions": "data: [DONE]",
    "/v1/messages": 'data: {"type":"message_stop"}',
    "/v1/responses": "event: response.",  # .completed, .incomplete or .failed: checked below
}
# The APIs that pass a field they do not know through to the engine.
PASSED_THROUGH = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# Raw JSON numbers a client can send, spliced in place of a numeric field's value.
NUMBERS = (b"1e400", b"-1e400", b"1e308", b"99999999999999999999999", b"18446744073709551616",
           b"-9223372036854775809", b"1e30", b"-1", b"0", b"2.5", b"1E2")  # fmt: skip
NUMERIC = ("max_tokens", "max_output_tokens", "temperature", "top_p", "n", "seed", "top_k",
           "dimensions")  # fmt: skip


def nested(depth: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def nested_bytes(depth: int, lists: bool) -> bytes:
    """``nested`` as JSON text, for depths orjson would not write."""
    return b"[" * depth + b"1" + b"]" * depth if lists else b'{"a":' * depth + b"1" + b"}" * depth


@dataclass(frozen=True, slots=True)
class Hostile:
    """One generated request: its body as bytes and a nonce that marks it for the engine."""

    path: str
    stream: bool
    body: bytes
    nonce: str


@st.composite
def hostile_bodies(draw: st.DrawFn, path: str) -> Hostile:
    nonce = f"n{secrets.token_hex(6)}"
    body = orjson.loads(orjson.dumps(ENDPOINTS[path]).replace(b"PROMPT", nonce.encode()))
    stream = path != "/v1/embeddings" and draw(st.booleans())
    if stream:
        body["stream"] = True
    splice: list[tuple[bytes, bytes]] = []
    for change in draw(st.lists(st.sampled_from(("depth", "width", "size", "number", "utf8")),
                                min_size=1, max_size=2, unique=True)):  # fmt: skip
        if change == "depth":
            field = draw(st.sampled_from(("x_extra", "metadata", "tools", "stop", "user")))
            depth = draw(st.sampled_from((MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, 200, 250,
                                          252, 253, 254, 300, 1022, 1100)))  # fmt: skip
            body[field] = f"NEST-{field}"  # written as bytes: orjson writes 254 levels at most
            splice.append((f'"NEST-{field}"'.encode(), nested_bytes(depth, draw(st.booleans()))))
        elif change == "width":
            body["x_wide"] = list(range(draw(st.integers(0, 20_000))))
        elif change == "size":
            body["x_big"] = "a" * draw(st.integers(0, 300_000))
        elif change == "number":
            field = draw(st.sampled_from(NUMERIC))
            body[field] = f"NUMBER-{field}"
            splice.append((f'"NUMBER-{field}"'.encode(), draw(st.sampled_from(NUMBERS))))
        else:  # invalid UTF-8 (or a lone surrogate escape) inside the prompt
            splice.append((nonce.encode(), nonce.encode() + draw(st.sampled_from(
                (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\\ud800")))))  # fmt: skip
    raw = orjson.dumps(body)
    for old, new in splice:
        raw = raw.replace(old, new, 1)
    return Hostile(path, stream, raw, nonce)


class Engine:
    """The simulator behind a recorder of every body the gateway sent it, raw: the simulator's
    own list keeps only the requests it accepted."""

    def __init__(self) -> None:
        self.sim = create_sim_app(SimConfig())
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.sim(scope, receive, send)
            return
        parts: list[bytes] = []

        async def recording() -> Message:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                self.bodies.append(b"".join(parts))
            return message

        await self.sim(scope, recording, send)


@dataclass(frozen=True, slots=True)
class Target:
    client: httpx.AsyncClient
    key: str
    engine: Engine
    ledger: AsyncEngine


@pytest.fixture
async def target(stack_factory: StackFactory, tmp_path: Any) -> AsyncIterator[Target]:
    """One gateway with its real ledger for all of a test's examples."""
    engine = Engine()
    stack: Stack = await stack_factory(upstream_apps=[engine])
    ledger = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    try:
        async with httpx.AsyncClient(base_url=stack.root, timeout=30) as client:
            yield Target(client, stack.keys["visible"], engine, ledger)
    finally:
        await ledger.dispose()


async def recorded(target: Target, request_id: str) -> int:
    async with target.ledger.connect() as conn:
        query = select(entries.c.idx).where(entries.c.request_id == request_id)
        return len((await conn.execute(query)).all())


def engine_asked(target: Target, nonce: str) -> bool:
    return any(nonce.encode() in body for body in target.engine.bodies)


async def check(target: Target, hostile: Hostile) -> httpx.Response:
    headers = {"authorization": f"Bearer {target.key}", "content-type": "application/json"}
    response = await target.client.post(hostile.path, content=hostile.body, headers=headers)
    status, text = response.status_code, response.text
    assert status < 500, (status, text[:300])
    records = await recorded(target, response.headers["x-request-id"])
    asked = engine_asked(target, hostile.nonce)
    assert records == (1 if asked else 0), (status, asked, records)  # no request without one
    if status == 200:
        assert asked and records == 1
        if hostile.stream:
            last = [line for line in text.splitlines() if line][-2 if hostile.path ==
                    "/v1/responses" else -1]  # fmt: skip
            assert last.startswith(TERMINAL[hostile.path]), text[-300:]
            assert '"type":"error"' not in text and "event: error" not in text, text[-300:]
    return response


@pytest.mark.parametrize("path", list(ENDPOINTS))
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)  # fmt: skip
@given(data=st.data())
async def test_a_hostile_body_is_answered_and_recorded_or_refused_before_the_engine(
    target: Target, path: str, data: st.DataObject
) -> None:
    await check(target, data.draw(hostile_bodies(path)))


@pytest.mark.parametrize("path", list(ENDPOINTS))
@pytest.mark.parametrize("field", ["x_extra", "metadata"])
@pytest.mark.parametrize("depth", [253, MAX_DEPTH + 1, MAX_DEPTH])
async def test_nesting_past_the_limit_is_refused_naming_the_field_before_the_engine(
    target: Target, path: str, field: str, depth: int
) -> None:
    """The fault study's case (253 levels), the first depth past the limit, and the limit:
    past it, a 400 in the endpoint's own shape naming the field, and no engine asked; at it,
    no refusal for depth (the field may still be refused for itself: Responses has no
    ``x_extra`` today, Messages neither: issue 29)."""
    nonce = f"n{secrets.token_hex(6)}"
    body = orjson.loads(orjson.dumps(ENDPOINTS[path]).replace(b"PROMPT", nonce.encode()))
    body[field] = nested(depth - 1, "dict")  # the body is level 1, this value level 2
    response = await check(target, Hostile(path, False, orjson.dumps(body), nonce))
    message = response.text
    if depth <= MAX_DEPTH:
        assert "deeper than" not in message, message[:300]
        if field == "x_extra" and path in PASSED_THROUGH:
            assert response.status_code == 200, message[:300]
        return
    assert response.status_code == 400 and not engine_asked(target, nonce)
    error = response.json()
    assert f"'{field}' nests JSON deeper than {MAX_DEPTH} levels" in message, message
    if path == "/v1/messages":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    else:
        assert error["error"]["param"] == field, error
