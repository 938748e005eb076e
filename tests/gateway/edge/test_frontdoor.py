"""``FrontDoor`` (``gateway/edge/frontdoor.py``), built as ``gateway/app.py`` builds it: a
framework app behind it, the chat route as a direct lane. Driven with raw ASGI messages, so the
headers are exactly the bytes a test chooses."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Scope

from gateway.edge.frontdoor import FrontDoor
from gateway.errors import RateLimited

FRESH_ID = re.compile(r"req_[0-9a-f]{24}")
LANE = "/v1/chat/completions"
MESSAGES = "/v1/messages"  # a lane whose errors are in Anthropic's shape


@dataclass
class Reply:
    status: int
    headers: dict[bytes, bytes]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Gateway:
    """The front door, and what reached each side of it."""

    seen: list[tuple[str, str]] = field(default_factory=list)  # (side, request id)
    door: FrontDoor = field(init=False)

    def __post_init__(self) -> None:
        async def echo(request: Request) -> Response:
            self.seen.append(("framework", request.state.request_id))
            return JSONResponse({"ok": True})

        async def chat(request: Request) -> Response:
            self.seen.append(("lane", request.state.request_id))
            raw = await request.body()
            if raw == b"rate-limited":
                raise RateLimited("slow down", retry_after=2.5, headers={"x-ratelimit-x": "1"})
            if raw == b"bug":
                raise RuntimeError("secret internals")
            return JSONResponse({"ok": True})

        framework = Starlette(routes=[Route("/v1/models", echo), Route(LANE, echo)])
        lanes = {("POST", LANE): chat, ("POST", MESSAGES): chat}
        self.door = FrontDoor(framework, lanes, max_header_bytes=1024)

    async def call(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
    ) -> Reply:
        scope: Scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                        "method": method, "path": path, "raw_path": path.encode(),
                        "query_string": b"", "headers": headers, "scheme": "http",
                        "server": ("test", 80), "client": ("127.0.0.1", 1)}  # fmt: skip
        incoming = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[Message] = []

        async def receive() -> Message:
            return incoming.pop(0) if incoming else {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        await self.door(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return Reply(start["status"], dict(start["headers"]), content)


SIDES = [("GET", "/v1/models", "framework"), ("POST", LANE, "lane")]


@pytest.mark.parametrize(("method", "path", "side"), SIDES)
@pytest.mark.parametrize("incoming", [b"abc-123", b"A.b:c_d-9", b"x" * 128])
async def test_a_short_plain_request_id_is_kept(
    method: str, path: str, side: str, incoming: bytes
) -> None:
    gateway = Gateway()
    reply = await gateway.call(method, path, [(b"x-request-id", incoming)])
    assert reply.status == 200
    assert reply.headers[b"x-request-id"] == incoming
    assert gateway.seen == [(side, incoming.decode())]


@pytest.mark.parametrize(("method", "path", "side"), SIDES)
@pytest.mark.parametrize(
    "incoming",
    [None, b"", b"x" * 129, b"has space", b"line\r\nbreak", b"semi;colon", "é".encode()],
)
async def test_any_other_request_id_is_replaced_by_a_fresh_one(
    method: str, path: str, side: str, incoming: bytes | None
) -> None:
    gateway = Gateway()
    headers = [] if incoming is None else [(b"x-request-id", incoming)]
    first = await gateway.call(method, path, headers)
    second = await gateway.call(method, path, headers)
    ids = [first.headers[b"x-request-id"].decode(), second.headers[b"x-request-id"].decode()]
    assert all(FRESH_ID.fullmatch(i) for i in ids) and ids[0] != ids[1]
    assert gateway.seen == [(side, ids[0]), (side, ids[1])]  # the handler knows it too


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", LANE)])
async def test_headers_over_the_limit_are_refused_with_431(method: str, path: str) -> None:
    gateway = Gateway()
    at_limit = [(b"x-request-id", b"abc"), (b"x-pad", b"p" * (1024 - 20))]  # 1024 bytes
    assert (await gateway.call(method, path, at_limit)).status == 200
    over = [(b"x-request-id", b"abc"), (b"x-pad", b"p" * (1024 - 19))]
    reply = await gateway.call(method, path, over)
    assert reply.status == 431
    assert reply.headers[b"content-type"] == b"application/json"
    assert reply.headers[b"x-request-id"] == b"abc"
    assert reply.json() == {"error": {"message": "The request headers exceed 1024 bytes.",
                                      "type": "invalid_request_error", "param": None,
                                      "code": "headers_too_large"}}  # fmt: skip
    assert len(gateway.seen) == 1  # only the request at the limit reached a handler


async def test_a_gateway_error_in_the_lane_is_rendered_with_its_headers() -> None:
    reply = await Gateway().call("POST", LANE, [(b"x-request-id", b"r1")], b"rate-limited")
    assert reply.status == 429
    assert reply.json() == {"error": {"message": "slow down", "type": "rate_limit_error",
                                      "param": None, "code": "rate_limit_exceeded"}}  # fmt: skip
    assert reply.headers[b"retry-after"] == b"3" and reply.headers[b"retry-after-ms"] == b"2500"
    assert reply.headers[b"x-ratelimit-x"] == b"1" and reply.headers[b"x-request-id"] == b"r1"


async def test_a_messages_lanes_errors_are_in_anthropics_shape() -> None:
    gateway = Gateway()
    limited = await gateway.call("POST", MESSAGES, [(b"x-request-id", b"m1")], b"rate-limited")
    assert limited.status == 429 and limited.headers[b"retry-after"] == b"3"
    assert limited.json() == {"type": "error", "error": {"type": "rate_limit_error",
                                                         "message": "slow down"}}  # fmt: skip
    failed = await gateway.call("POST", MESSAGES, [(b"x-request-id", b"m2")], b"bug")
    assert failed.status == 500 and failed.json()["error"]["type"] == "api_error"
    too_large = [(b"x-pad", b"p" * 1024)]
    refused = await gateway.call("POST", MESSAGES, too_large)
    assert refused.status == 431 and refused.json()["type"] == "error"
    assert gateway.seen == [("lane", "m1"), ("lane", "m2")]


async def test_an_unexpected_exception_in_the_lane_is_an_opaque_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="thinkgate"):
        reply = await Gateway().call("POST", LANE, [(b"x-request-id", b"r2")], b"bug")
    assert reply.status == 500 and reply.headers[b"x-request-id"] == b"r2"
    assert reply.json() == {"error": {"message": "The gateway failed to handle the request.",
                                      "type": "server_error", "param": None,
                                      "code": "internal_error"}}  # fmt: skip
    assert b"secret internals" not in reply.body
    logged = [r for r in caplog.records if r.name == "thinkgate"]
    assert len(logged) == 1 and "r2" in logged[0].getMessage() and logged[0].exc_info


async def test_only_the_lanes_method_and_path_take_the_lane() -> None:
    gateway = Gateway()
    await gateway.call("GET", LANE, [(b"x-request-id", b"get")])
    await gateway.call("POST", LANE + "/", [(b"x-request-id", b"slash")])  # framework redirect
    assert [side for side, _ in gateway.seen] == ["framework"]


async def test_non_http_scopes_go_to_the_framework_untouched() -> None:
    scopes: list[Scope] = []

    async def framework(scope: Scope, receive: Any, send: Any) -> None:
        scopes.append(scope)

    door = FrontDoor(framework, {})
    lifespan: Scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    await door(lifespan, None, None)  # type: ignore[arg-type]
    assert scopes == [{"type": "lifespan", "asgi": {"version": "3.0"}}]  # no state, no id
