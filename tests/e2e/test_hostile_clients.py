"""Hostile clients against the real stack on real sockets, each next to a healthy client.

Every attack asserts two things: the attacker gets a clear answer (an OpenAI error object with
the right status where HTTP allows one; for protocol-level garbage, uvicorn's plain-text 400
and a closed connection, since no route was reached), and a client streaming completions with
the visible key in a loop keeps being served during the attack (every stream succeeds, and at
least ``HEALTHY_RUNS`` complete while the attack runs). What the attacker sent (prompts, keys)
must not come back in error bodies.

The one finding that still holds (connections that never finish their headers: uvicorn has no
header-read timeout) is a strict ``xfail`` raising ``Finding``, its reason naming the cause;
docs/security.md gives the mitigation (the ingress in front).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import openai
import orjson
import pytest

from gateway.auth.keys import split_key
from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import Stack, StackFactory
from tests.openai_errors import assert_openai_error
from tests.waiting import eventually

T = TypeVar("T")
MODEL, CHAT = "deepseek-r1", "/v1/chat/completions"
LIMIT = 4 << 20  # MAX_BODY_BYTES' default
HEALTHY_RUNS = 3
HOLD_LIMIT_S = 6.0  # uvicorn's timeout_keep_alive (5 s), the only client timeout, plus a margin
REASONING = ("zq7rea", "sonmark")  # the simulator's reasoning, two tokens: neither may leak
ANSWER = ["\n\nthe ", "answer"]  # R1's answer starts with a blank line
SIM_CHUNKS: dict[str, list[Any]] = {  # the same reasoning and answer in each simulator mode
    "deepseek-r1": [*REASONING, "\n</think>", *ANSWER],
    "qwq-32b": ["<think>", *REASONING, "</think>", *ANSWER],
    "deepseek-r1-parsed": [*(["reasoning", r] for r in REASONING), "</think>", *ANSWER],
}
INVALID_HTTP = b"Invalid HTTP request received."  # uvicorn's own 400, written before the app


class Finding(Exception):
    """The gateway still does what the hardening issue says it must not (see the xfail)."""


def xfail(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, raises=Finding, reason=reason)


def marker() -> str:
    return f"hostile-{secrets.token_hex(6)}"


def chat_body(content: Any = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


# -- the healthy client -------------------------------------------------------------------------
@dataclass
class HealthyClient:
    """Streams completions with the visible key, one after another, until told to stop."""

    client: openai.AsyncOpenAI
    started: int = 0
    completed: int = 0
    failures: list[str] = field(default_factory=list)
    stopping: bool = False

    async def run(self) -> None:
        while not self.stopping:
            self.started += 1
            try:
                async with asyncio.timeout(10):
                    await self._one()
            except Exception as exc:  # any failure at all is what the tests look for
                self.failures.append(repr(exc))
            else:
                self.completed += 1

    async def _one(self) -> None:
        stream = await self.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], stream=True,
            extra_body={"sim": {"chunks": SIM_CHUNKS[MODEL]}},
        )  # fmt: skip
        reasoning, content = [], []
        async for chunk in stream:
            if chunk.choices:
                delta = chunk.choices[0].delta
                reasoning.append(str((delta.model_extra or {}).get("reasoning_content") or ""))
                content.append(delta.content or "")
        if "".join(REASONING) not in "".join(reasoning) or "".join(content).strip() != "the answer":
            raise AssertionError(f"wrong stream: {reasoning!r} {content!r}")

    async def keeps_serving(self, runs: int = HEALTHY_RUNS) -> None:
        """Wait until ``runs`` streams begun from now on have completed (or one failed)."""
        start = self.started
        await eventually(lambda: self.completed >= start + runs or bool(self.failures), 20)
        assert not self.failures, self.failures

    async def during(self, attack: Callable[[], Awaitable[T]]) -> list[T]:
        """Repeat ``attack`` until ``HEALTHY_RUNS`` streams begun after it began completed."""
        start, outcomes = self.started, []
        async with asyncio.timeout(30):
            while not outcomes or (self.completed < start + HEALTHY_RUNS and not self.failures):
                outcomes.append(await attack())
        assert not self.failures, self.failures
        return outcomes


@contextlib.asynccontextmanager
async def healthy_client(stack: Stack) -> AsyncIterator[HealthyClient]:
    sdk = openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"], max_retries=0)
    healthy = HealthyClient(sdk)
    task = asyncio.create_task(healthy.run())
    try:
        await healthy.keeps_serving(1)  # warmed up (first-request set-up) before any attack
        yield healthy
    finally:
        healthy.stopping = True
        await task
        await sdk.close()
    assert not healthy.failures, healthy.failures


# -- raw HTTP and errors --------------------------------------------------------------------------
@dataclass(frozen=True)
class RawReply:
    """A response read off a raw socket, named like ``httpx.Response``'s attributes."""

    status_code: int | None  # None: the connection closed without a response
    headers: dict[str, str]
    content: bytes


def address(stack: Stack) -> tuple[str, int]:
    host, port = urlsplit(stack.root).netloc.rsplit(":", 1)
    return host, int(port)


def http_request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    """A request that asks to close after it (its reply ends at EOF); ``x_a="b"`` sends
    ``x-a: b``; a content-length is added unless one or a transfer-encoding is given."""
    fields = {"host": "gateway", "connection": "close"}
    fields |= {name.replace("_", "-"): value for name, value in headers.items()}
    if body and not {"content-length", "transfer-encoding"} & fields.keys():
        fields["content-length"] = str(len(body))
    head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    return f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode() + body


async def raw_exchange(stack: Stack, data: bytes) -> RawReply:
    """Send ``data``, read to EOF, parse the response."""
    reader, writer = await asyncio.open_connection(*address(stack))
    with contextlib.closing(writer), contextlib.suppress(ConnectionResetError):
        writer.write(data)
        with contextlib.suppress(ConnectionError):  # the server may answer before reading it all
            await writer.drain()
        async with asyncio.timeout(10):
            return parse_reply(await reader.read())
    return parse_reply(b"")


def parse_reply(raw: bytes) -> RawReply:
    if not raw:
        return RawReply(None, {}, b"")
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return RawReply(int(status_line.split()[1]), headers, body)


def assert_error(
    reply: httpx.Response | RawReply, status: int, code: str, hidden: tuple[str, ...] = ()
) -> dict[str, Any]:
    """An OpenAI error object with this status and code, echoing none of ``hidden``."""
    return assert_openai_error(reply, status, code, hidden=hidden, request_id=False)


def fresh_client() -> httpx.AsyncClient:
    # One per request, as attackers have; plain HTTP, so no CA bundle (~50 ms of CPU each).
    return httpx.AsyncClient(timeout=30, verify=False)


async def post_chat(
    stack: Stack, body: Any, key: str | None = "visible", headers: dict[str, str] | None = None
) -> httpx.Response:
    """POST ``body`` (JSON-encoded unless bytes or an async iterator) with the key named."""
    sent = {"authorization": f"Bearer {stack.keys[key]}"} if key else {}
    content = json.dumps(body).encode() if isinstance(body, dict | list) else body  # big ints
    async with fresh_client() as client:
        return await client.post(f"{stack.root}{CHAT}", content=content,
                                 headers={**sent, **(headers or {})})  # fmt: skip


# -- bodies over the limit ------------------------------------------------------------------------
async def _pieces(data: bytes, size: int = 64 << 10) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("framing", ["content-length", "chunked", "declared-only"])
async def test_bodies_over_the_limit_get_413(stack: Stack, framing: str) -> None:
    """Sent whole with a content-length, chunked without one (httpx chunks an async
    iterator), or only declared (refused before a byte of body is read)."""
    secret = marker()
    over = (secret.encode() * (LIMIT // len(secret) + 2))[: LIMIT + 1]

    async def attack() -> httpx.Response | RawReply:
        if framing == "declared-only":
            declared = http_request("POST", CHAT, content_length=str(10**12),
                                    authorization=f"Bearer {stack.keys['visible']}")  # fmt: skip
            return await raw_exchange(stack, declared)
        return await post_chat(stack, _pieces(over) if framing == "chunked" else over)

    async with healthy_client(stack) as healthy:
        for reply in await healthy.during(attack):
            assert_error(reply, 413, "request_too_large", (secret,))
        at_limit = await post_chat(stack, b" " * LIMIT)  # the limit itself is read, then parsed
        assert_error(at_limit, 400, "invalid_request")


# -- protocol-level garbage -----------------------------------------------------------------------
PROTOCOL_ATTACKS: dict[str, dict[str, Callable[[], bytes]]] = {  # built when a test runs
    "garbage": {
        "binary": lambda: b"\x00\xff\xfe not http\r\n\r\n",
        "http2-preface": lambda: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "nul-in-header": lambda: http_request("GET", "/healthz", x_a="a\x00b"),
        "1mb-url": lambda: http_request("GET", "/healthz?" + "q" * (1 << 20)),
    },
    "bad-framing": {
        "negative-length": lambda: http_request("POST", CHAT, b"{}", content_length="-1"),
        "length-and-chunked": lambda: http_request(
            "POST", CHAT, b"0\r\n\r\n", content_length="5", transfer_encoding="chunked"),
        "bad-chunk-size": lambda: http_request(
            "POST", CHAT, b"zz\r\n{}\r\n0\r\n\r\n", transfer_encoding="chunked"),
    },
    "huge-headers": {
        "1mb-header": lambda: http_request("GET", "/healthz", x_big="a" * (1 << 20)),
        "100k-headers": lambda: http_request("GET", "/healthz",
                                             **{f"x_h{i}": "v" for i in range(10**5)}),
    },
}  # fmt: skip


async def test_huge_headers_get_431_and_others_are_served(stack: Stack) -> None:
    """httptools has no header limit of its own (uvicorn keeps every header); the gateway's
    front door refuses past MAX_HEADER_BYTES with an OpenAI error before anything else runs.
    (An unterminated header of hundreds of MB is buffered by httptools before any limit can
    act: that one is for the ingress in front, docs/security.md.)"""
    cases = PROTOCOL_ATTACKS["huge-headers"]

    async def attack() -> list[RawReply]:
        return await asyncio.gather(*(raw_exchange(stack, build()) for build in cases.values()))

    async with healthy_client(stack) as healthy:
        replies = (await healthy.during(attack))[0]
    for reply in replies:
        assert reply.status_code == 431, reply


@pytest.mark.parametrize("group", [g for g in PROTOCOL_ATTACKS if g != "huge-headers"])
async def test_protocol_garbage_gets_400_and_a_closed_connection(stack: Stack, group: str) -> None:
    """uvicorn answers before the app sees anything: a plain-text 400 (no route was reached,
    so no OpenAI error), then it closes the connection (``raw_exchange`` reads to EOF)."""
    cases = PROTOCOL_ATTACKS[group]

    async def attack() -> list[RawReply]:
        return await asyncio.gather(*(raw_exchange(stack, build()) for build in cases.values()))

    async with healthy_client(stack) as healthy:
        rounds = await healthy.during(attack)
    for name, reply in (pair for replies in rounds for pair in zip(cases, replies, strict=True)):
        if reply.status_code is not None and reply.status_code < 400:
            raise Finding(f"{name} accepted: {reply.status_code} {reply.content[:80]!r}")
        assert reply.status_code == 400 and reply.content == INVALID_HTTP, (name, reply)


# -- hostile JSON -------------------------------------------------------------------------------
def _nested(depth: int, opening: bytes, inner: str, closing: bytes) -> bytes:
    head = b'{"model":"deepseek-r1","messages":[{"role":"user","content":'
    return head + opening * depth + f'"{inner}"'.encode() + closing * depth + b"}]}"


def _spliced(secret: str, tail: bytes) -> bytes:
    """A chat body whose message content (``secret``) ends in ``tail``."""
    return orjson.dumps(chat_body(secret))[: -len('"}]}')] + tail + b'"}]}'


JSON_ATTACKS: dict[str, dict[str, Callable[[str], bytes]]] = {
    "too-deep": {
        "100k-nested-arrays": lambda m: _nested(10**5, b"[", m, b"]"),
        "100k-nested-objects": lambda m: _nested(10**5, b'{"a":', m, b"}"),
    },
    "not-utf-8": {
        "invalid-bytes": lambda m: _spliced(m, b"\xff\xfe\xc0"),
        "lone-surrogate": lambda m: _spliced(m, b"\\ud800"),
        "bom": lambda m: b"\xef\xbb\xbf" + orjson.dumps(chat_body(m)),
    },
    "not-a-json-object": {
        "array": lambda m: orjson.dumps([chat_body(m)]),
        "truncated": lambda m: orjson.dumps(chat_body(m))[:-1],
        "infinity": lambda m: orjson.dumps(chat_body(m))[:-1] + b',"temperature":1e400}',
    },
}


@pytest.mark.parametrize("group", list(JSON_ATTACKS))
async def test_malformed_json_gets_400(stack: Stack, group: str) -> None:
    secret = marker()
    bodies = {name: build(secret) for name, build in JSON_ATTACKS[group].items()}

    async def attack() -> list[httpx.Response]:
        return await asyncio.gather(*(post_chat(stack, body) for body in bodies.values()))

    async with healthy_client(stack) as healthy:
        for replies in await healthy.during(attack):
            for name, reply in zip(bodies, replies, strict=True):
                error = assert_error(reply, 400, "invalid_request", (secret,))
                assert error["param"] is None, (name, error)


# -- n, max_tokens and 10,000 messages -------------------------------------------------------------
OUT_OF_RANGE: dict[str, list[Any]] = {  # each: 400 invalid_request naming the field
    "n": [0, -1, 17, 2**64 - 1, 10**30, "2", 2.0, True, [1]],
    "max_tokens": [0, -5, 1_000_001, 10**30, "100", 1.5, True, {}],
    "max_completion_tokens": [0, -1, 2**63, "5", False],
}
IN_RANGE = {"n": [1, 16], "max_tokens": [1, 8], "max_completion_tokens": [1, 8]}
TOO_BIG_FOR_KV = {"n": {"n": 16, "max_tokens": 10_000}, "max_tokens": {"max_tokens": 10**6},
                  "max_completion_tokens": {"max_completion_tokens": 900_000}}  # fmt: skip


@pytest.mark.parametrize("name", list(OUT_OF_RANGE))
async def test_out_of_range_parameters_get_400(stack: Stack, name: str) -> None:
    secret = marker()

    async def attack() -> None:
        for value in OUT_OF_RANGE[name]:
            reply = await post_chat(stack, chat_body(secret, **{name: value}))
            error = assert_error(reply, 400, "invalid_request", (secret,))
            assert error["param"] == name, (value, error)
        # Within the limits, but more than any engine's KV cache could ever hold: refused too.
        reply = await post_chat(stack, chat_body(secret, **TOO_BIG_FOR_KV[name]))
        assert assert_error(reply, 400, "kv_request_too_large")["param"] == "max_tokens"
        for value in IN_RANGE[name]:  # the boundaries themselves are served
            ok = await post_chat(stack, chat_body(secret, **{"max_tokens": 8, name: value}))
            assert ok.status_code == 200, ok.text

    async with healthy_client(stack) as healthy:
        await healthy.during(attack)


async def test_null_stream_and_n_mean_their_defaults(stack: Stack) -> None:
    async def attack() -> list[httpx.Response]:
        return [await post_chat(stack, chat_body(**{name: None})) for name in ("stream", "n")]

    async with healthy_client(stack) as healthy:
        replies = (await healthy.during(attack))[0]
    for name, reply in zip(("stream", "n"), replies, strict=True):
        if reply.status_code != 200:
            raise Finding(f"{name}: null -> {reply.status_code} {reply.text}")


@pytest.mark.parametrize("capacity", [pytest.param(65536, id="refused"),
                                      pytest.param(1 << 21, id="accepted")])  # fmt: skip
async def test_ten_thousand_messages(stack_factory: StackFactory, capacity: int) -> None:
    """Refused (``kv_request_too_large``) by a small engine, served by a big one; either way
    promptly, and without starving the healthy client."""
    sim = SimConfig(kv_capacity_tokens=capacity, max_model_len=capacity)
    stack: Stack = await stack_factory(sim=sim)
    secret = marker()
    messages = [{"role": ("user", "assistant")[i % 2], "content": f"{secret} {i}"}
                for i in range(10_000)] + [{"role": "user", "content": "?"}]  # fmt: skip
    body = {"model": MODEL, "messages": messages, "sim": {"chunks": SIM_CHUNKS[MODEL]}}

    async def attack() -> httpx.Response:
        async with asyncio.timeout(5):  # not a speed test: answered promptly, not hung
            return await post_chat(stack, body)

    async with healthy_client(stack) as healthy:
        for reply in await healthy.during(attack):
            if capacity == 65536:
                assert_error(reply, 400, "kv_request_too_large", (secret,))
            else:
                assert reply.status_code == 200, reply.text
                assert reply.json()["choices"][0]["message"]["content"].strip() == "the answer"


# -- slow and idle clients ------------------------------------------------------------------------
async def attacker(stack: Stack, first: bytes = b"", trickle: bytes = b"") -> asyncio.Task[bytes]:
    """A connection that sends ``first``, then ``trickle`` a byte a second (the attack's own
    pace, not a synchronisation); the task returns what the gateway sent before closing it."""
    reader, writer = await asyncio.open_connection(*address(stack))
    writer.write(first)

    async def slowly() -> None:
        with contextlib.suppress(ConnectionError):
            for i in range(len(trickle)):
                writer.write(trickle[i : i + 1])
                await writer.drain()
                await asyncio.sleep(1)

    async def held() -> bytes:
        sending = asyncio.create_task(slowly())
        try:
            return await reader.read()
        except ConnectionResetError:  # closed with bytes of ours unread: a close all the same
            return b""
        finally:
            sending.cancel()
            writer.close()

    return asyncio.create_task(held())


async def before_headers(stack: Stack) -> list[asyncio.Task[bytes]]:
    """500 connections that send nothing, 10 that send their headers a byte a second."""
    idle = [await attacker(stack) for _ in range(500)]
    head = b"POST /v1/chat/completions HTTP/1.1\r\n"
    return idle + [await attacker(stack, head, b"host: g\r\n" * 50) for _ in range(10)]


async def during_body(stack: Stack) -> list[asyncio.Task[bytes]]:
    """Uploads that stall after a few bytes or send a byte a second: keyless ones (refused
    at once, before any body is read) and keyed ones (cut off by BODY_TIMEOUT_S: 408)."""
    keyless = http_request("POST", CHAT, content_length="4000")
    keyed = http_request("POST", CHAT, content_length="4000",
                         authorization=f"Bearer {stack.keys['visible']}")  # fmt: skip
    ends = []
    for head in (keyless, keyed):
        ends += [await attacker(stack, head + b'{"model":"') for _ in range(5)]
        ends += [await attacker(stack, head, b"x" * 4000) for _ in range(5)]
    return ends


SLOW_ATTACKS = [
    pytest.param(before_headers, id="before-headers", marks=xfail(
        "connections that never finish their headers are held forever: uvicorn's httptools "
        "protocol (0.54) arms timeout_keep_alive only after a response (httptools_impl.py:345, "
        "on_response_complete), never in connection_made (:101), and disarms it on every "
        "data_received (:171); uvicorn has no header-read timeout. MAX_CLIENT_CONNECTIONS "
        "(uvicorn's limit_concurrency, set by thinkgate serve) bounds how many; an ingress "
        "header timeout closes them (docs/security.md)")),
    pytest.param(during_body, id="during-body"),
]  # fmt: skip


@pytest.mark.parametrize("attack", SLOW_ATTACKS)
async def test_slow_and_idle_clients_are_cut_off(
    stack_factory: StackFactory, attack: Callable[[Stack], Awaitable[list[asyncio.Task[bytes]]]]
) -> None:
    stack = await stack_factory(body_timeout_s=3.0)  # BODY_TIMEOUT_S, short for the test
    ends: list[asyncio.Task[bytes]] = []
    try:
        async with healthy_client(stack) as healthy:
            deadline = asyncio.get_running_loop().time() + HOLD_LIMIT_S
            ends = await attack(stack)
            await healthy.keeps_serving()  # others are served while the attackers hang on
            fresh = await raw_exchange(stack, http_request("GET", "/healthz"))
            assert fresh.status_code == 200, fresh  # and so is a newcomer on a new connection
            remaining = deadline - asyncio.get_running_loop().time()
            _, still_open = await asyncio.wait(ends, timeout=max(remaining, 0.1))
        for end in ends:  # those cut off got a 400, 401 or 408, or just the close
            if end.done() and (answer := parse_reply(end.result())).status_code is not None:
                assert answer.status_code in (400, 401, 408), answer
        if still_open:
            raise Finding(f"{len(still_open)} of {len(ends)} open after {HOLD_LIMIT_S} s")
    finally:
        for end in ends:
            end.cancel()
        await asyncio.gather(*ends, return_exceptions=True)


async def test_an_abandoned_upload_is_not_an_error(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="thinkgate")
    request_id = f"abandoned-{secrets.token_hex(4)}"
    head = http_request("POST", CHAT, content_length="4000", x_request_id=request_id)

    def about_it() -> list[logging.LogRecord]:
        return [r for r in caplog.records if request_id in r.getMessage()
                or request_id in str(getattr(r, "fields", ""))]  # fmt: skip

    async with healthy_client(stack) as healthy:
        _, writer = await asyncio.open_connection(*address(stack))
        writer.write(head + b'{"model":')
        await writer.drain()
        writer.close()
        await healthy.keeps_serving()
        await eventually(lambda: bool(about_it()), 5)
    bad = [r for r in about_it() if r.levelno >= logging.ERROR or r.exc_info]
    if bad:
        raise Finding(f"{bad[0].levelname}: {bad[0].getMessage()}")


# -- reasoning visibility -------------------------------------------------------------------------
VISIBILITY_TRICKS: dict[str, list[tuple[dict[str, Any], dict[str, str]]]] = {  # fields, headers
    "request-fields": [  # none of them lowers visibility, so any one raising it would show
        ({"include_reasoning": True, "reasoning_effort": "high", "return_reasoning": True,
          "reasoning": {"exclude": False, "enabled": True, "effort": "high"},
          "chat_template_kwargs": {"enable_thinking": True, "thinking": True},
          "reasoning_content": True}, {}),
        ({"include_reasoning": True, "stop": ["~"], "n": 2, "logprobs": True, "top_logprobs": 3,
          "stream_options": {"include_usage": True}}, {}),
    ],
    "headers": [({}, {"x-thinkgate-reasoning": "visible", "x-thinkgate-priority": "sheddable",
                      "x-include-reasoning": "true", "x-thinkgate-role": "auditor",
                      "x-reasoning-visibility": "visible", "openai-beta": "reasoning=v1"})],
    "priority-above-ceiling": [({"include_reasoning": True}, {"x-thinkgate-priority": "critical"})],
}  # fmt: skip


@pytest.mark.parametrize("group", list(VISIBILITY_TRICKS))
async def test_a_hidden_key_cannot_turn_reasoning_on(stack: Stack, group: str) -> None:
    """Every trick, on every simulator mode, streamed and whole, with the hidden key and (the
    control: the marker is there to leak) the visible one."""
    cases = [(fields, headers, model, stream) for fields, headers in VISIBILITY_TRICKS[group]
             for model in SIM_CHUNKS for stream in (True, False)]  # fmt: skip

    async def ask(key: str, fields: dict[str, Any], headers: dict[str, str], model: str,
                  stream: bool) -> httpx.Response:  # fmt: skip
        body = {**chat_body("why?", stream=stream, sim={"chunks": SIM_CHUNKS[model]}), **fields}
        return await post_chat(stack, {**body, "model": model}, key, headers)

    async def attack() -> None:
        asked = [ask(key, *case) for case in cases for key in ("hidden", "visible")]
        replies = await asyncio.gather(*asked)
        for case, hidden, visible in zip(cases, replies[::2], replies[1::2], strict=True):
            for piece in REASONING:  # in no delta, no field, no error of the hidden key
                assert piece.encode() not in hidden.content, (case, hidden.text)
            if visible.status_code == 200:
                assert all(p.encode() in visible.content for p in REASONING), visible.text
                assert hidden.status_code == 200 and b"answer" in hidden.content, hidden.text
            else:
                assert_error(hidden, 403, "priority_not_allowed")

    async with healthy_client(stack) as healthy:
        await healthy.during(attack)


# -- keys: revoked, forged, replayed, of another role --------------------------------------------
async def admin(stack: Stack, method: str, path: str, **kw: Any) -> httpx.Response:
    auth = {"authorization": f"Bearer {stack.keys['admin']}"}
    async with fresh_client() as client:
        return await client.request(method, f"{stack.root}/admin/v1{path}", headers=auth, **kw)


async def new_key(stack: Stack, **spec: Any) -> dict[str, Any]:
    created = await admin(stack, "POST", "/keys", json=spec)
    assert created.status_code == 201, created.text
    return dict(created.json())


async def revoked_after_use(stack: Stack) -> str:
    """A key that served a request, then was revoked: the same bearer token, replayed."""
    key = await new_key(stack, tenant="acme", reasoning="visible")
    auth = {"authorization": f"Bearer {key['key']}"}
    assert (await post_chat(stack, chat_body(max_tokens=2), None, auth)).status_code == 200
    assert (await admin(stack, "DELETE", f"/keys/{key['id']}")).status_code == 200
    return str(key["key"])


WRONG_ROLE = "insufficient_permissions"
KEY_ATTACKS = {  # the authorization header (Stack.keys and two more), route, status, code
    "revoked": [("Bearer {revoked}", CHAT, 401, "revoked_api_key"),
                ("Bearer {replayed}", CHAT, 401, "revoked_api_key")],
    "forged": [("Bearer {forged}", CHAT, 401, "invalid_api_key"),  # a real id, a wrong secret
               ("Bearer {visible}x", CHAT, 401, "invalid_api_key"),
               ("Basic {visible}", CHAT, 401, "invalid_api_key"),
               ("", CHAT, 401, "missing_api_key")],
    "wrong-role": [("Bearer {admin}", CHAT, 403, WRONG_ROLE),
                   ("Bearer {auditor}", "/v1/models", 403, WRONG_ROLE),
                   ("Bearer {hidden}", "/audit/v1/records", 403, WRONG_ROLE),
                   ("Bearer {visible}", "/admin/v1/keys", 403, WRONG_ROLE)],
}  # fmt: skip


@pytest.mark.parametrize("group", list(KEY_ATTACKS))
async def test_keys_that_must_not_pass(stack: Stack, group: str) -> None:
    real = split_key(stack.keys["visible"])
    assert real is not None
    keys = {**stack.keys, "forged": f"sk-tg-{real[0]}-{secrets.token_urlsafe(32)}"}
    if group == "revoked":
        keys["replayed"] = await revoked_after_use(stack)
    prompt, cases = marker(), []
    for template, path, status, code in KEY_ATTACKS[group]:
        method, auth = ("POST" if path == CHAT else "GET"), template.format(**keys)
        body = orjson.dumps(chat_body(prompt, stream=True)) if method == "POST" else b""
        cases.append((http_request(method, path, body, authorization=auth), status, code, auth))

    async def attack() -> list[RawReply]:
        return await asyncio.gather(*(raw_exchange(stack, case[0]) for case in cases))

    async with healthy_client(stack) as healthy:
        for replies in await healthy.during(attack):
            for (_, status, code, auth), reply in zip(cases, replies, strict=True):
                assert reply.headers["content-type"] == "application/json"  # never a stream
                sent = (prompt, auth[-43:]) if auth else (prompt,)  # a key's secret part
                assert_error(reply, status, code, sent)


# -- an auditor and another tenant's records ------------------------------------------------------
async def test_an_auditor_cannot_read_another_tenants_records(stack: Stack) -> None:
    other = await new_key(stack, tenant="other", reasoning="visible")
    everyone = await new_key(stack, tenant="*", role="auditor")
    secret = marker()
    auth = {"authorization": f"Bearer {other['key']}"}
    made = await post_chat(stack, chat_body(secret, max_tokens=3), None, auth)
    assert made.status_code == 200, made.text
    request_id = made.headers["x-request-id"]

    async def audit(path: str, key: str = stack.keys["auditor"], **params: Any) -> httpx.Response:
        auth = {"authorization": f"Bearer {key}"}
        async with fresh_client() as client:
            return await client.get(f"{stack.root}/audit/v1{path}", params=params, headers=auth)

    # The control: the record exists, and an auditor of every tenant reads the prompt in it.
    (found,) = (await audit("/records", everyone["key"], request_id=request_id)).json()["data"]
    index = found["index"]
    assert found["tenant"] == "other"
    assert secret in (await audit(f"/records/{index}", everyone["key"])).text

    async def attack() -> None:
        own = await audit("/records", limit=1000)
        assert own.status_code == 200 and {r["tenant"] for r in own.json()["data"]} == {"acme"}
        for params in ({"request_id": request_id}, {"key_id": other["id"]}):
            assert (await audit("/records", **params)).json()["data"] == []
        for path in ("/records", "/export"):  # naming another tenant: 403, whatever the name
            assert_error(await audit(path, tenant="other"), 403, WRONG_ROLE, (secret,))
        theirs, missing = await audit(f"/records/{index}"), await audit("/records/99999999")
        error = assert_error(theirs, 404, "record_not_found", (secret, request_id, other["id"]))
        none = assert_error(missing, 404, "record_not_found")
        # The same answer as for no record at all: its existence is not confirmed.
        assert error["message"].replace(str(index), "N") == none["message"].replace("99999999", "N")
        exported = (await audit("/export")).text
        assert request_id not in exported and other["id"] not in exported

    async with healthy_client(stack) as healthy:
        await healthy.during(attack)
