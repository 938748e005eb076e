"""Load for the fault tests: clients that send chat and Messages requests (whole or streamed)
to gateway replicas while something fails, what each saw (``Result``), and a tap on the
engine's request bodies (``BodyTap``). Used by ``tests/e2e/test_replica_faults.py``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.waiting import eventually

MODEL = "deepseek-r1"
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


# -- what a client saw ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    url: str  # a replica's root URL
    key: str  # the key's name in ``Cluster.keys``
    path: str = CHAT


@dataclass(frozen=True, slots=True)
class Result:
    """One request as its client saw it."""

    target: Target
    stream: bool
    began: float  # time.monotonic() when it was sent
    status: int | None  # None: no status arrived (the connection failed first)
    request_id: str | None
    completed: bool
    detail: str  # what went wrong, else ""
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""


def request_body(stream: bool, max_tokens: int = 16) -> Any:
    """A request both APIs read alike (Chat Completions and Anthropic's Messages)."""
    messages = [{"role": "user", "content": "fault"}]
    return {"model": MODEL, "stream": stream, "max_tokens": max_tokens, "messages": messages}


def auth(path: str, secret: str) -> dict[str, str]:
    if path == MESSAGES:  # the anthropic SDK's way
        return {"x-api-key": secret, "anthropic-version": "2023-06-01"}
    return {"authorization": f"Bearer {secret}"}


def sse_names(raw: str) -> list[str]:
    return [line[7:].strip() for line in raw.split("\n") if line.startswith("event: ")]


def is_complete(path: str, stream: bool, raw: str) -> bool:
    """A whole answer: the stream's proper end with no error event, or a whole JSON body."""
    if stream:
        end = "message_stop" in sse_names(raw) if path == MESSAGES else raw.endswith(
            "data: [DONE]\n\n")  # fmt: skip
        return end and "error" not in sse_names(raw)
    try:
        body = json.loads(raw)
    except ValueError:
        return False
    return bool(body.get("type") == "message" if path == MESSAGES else body.get("choices"))


async def send(
    client: httpx.AsyncClient, target: Target, secret: str, stream: bool, max_tokens: int = 16
) -> Result:
    began = time.monotonic()
    status: int | None = None
    request_id: str | None = None
    headers: dict[str, str] = {}
    try:
        async with client.stream(
            "POST", f"{target.url}{target.path}", json=request_body(stream, max_tokens),
            headers=auth(target.path, secret),
        ) as response:  # fmt: skip
            status, headers = response.status_code, dict(response.headers)
            request_id = response.headers.get("x-request-id")
            raw = (await response.aread()).decode(errors="replace")
    except httpx.TransportError as exc:
        return Result(target, stream, began, status, request_id, False,
                      f"{type(exc).__name__}: {exc}", headers)  # fmt: skip
    done = status == 200 and is_complete(target.path, stream, raw)
    return Result(target, stream, began, status, request_id, done, "" if done else raw[-300:],
                  headers, raw)  # fmt: skip


class RawRequest:
    """One request on a TCP connection of its own, which the test closes when it likes: how a
    client that gives up looks to the gateway."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.received = b""

    @classmethod
    async def send(cls, url: str, secret: str, body: Any, request_id: str,
                   upload: int | None = None) -> RawRequest:  # fmt: skip
        """POST ``body`` to the chat route; only its first ``upload`` bytes, if given."""
        where = httpx.URL(url)
        assert where.host and where.port
        reader, writer = await asyncio.open_connection(where.host, where.port)
        payload = json.dumps(body).encode()
        head = [f"POST {CHAT} HTTP/1.1", f"host: {where.host}:{where.port}",
                f"authorization: Bearer {secret}", "content-type: application/json",
                f"content-length: {len(payload)}", f"x-request-id: {request_id}",
                "", ""]  # fmt: skip
        writer.write("\r\n".join(head).encode() + payload[:upload])
        await writer.drain()
        return cls(reader, writer)

    async def read_events(self, count: int) -> None:
        """Until ``count`` SSE data events with a chunk arrived."""
        async with asyncio.timeout(10):
            while self.received.count(b"data: {") < count:
                data = await self.reader.read(1 << 16)
                assert data, self.received[-300:]
                self.received += data

    async def read_to_end(self) -> None:
        """Until the connection ends (10 s at most)."""
        async with asyncio.timeout(10):
            while data := await self.reader.read(1 << 16):
                self.received += data

    async def close(self) -> None:
        """Close the connection (again: a no-op)."""
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def summary(results: Iterable[Result]) -> str:
    """How requests ended, counted: for assertion messages."""
    counts = Counter(
        (r.target.url[-5:], r.target.key, r.target.path, r.status, r.completed, r.detail[:120])
        for r in results
    )
    return "\n".join(f"{n} x {outcome}" for outcome, n in counts.most_common(12))


class Load:
    """``concurrency`` clients, each sending one request after another (streamed and whole in
    turn) to the current ``targets`` in turn, until the load is left; every result is kept."""

    def __init__(self, keys: dict[str, str], targets: list[Target], concurrency: int) -> None:
        self.keys = keys
        self.targets = targets  # replaced, not mutated, to steer the clients
        self.results: list[Result] = []
        self._concurrency = concurrency
        self._turn = itertools.count()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        limits = httpx.Limits(max_connections=4 * concurrency, max_keepalive_connections=None)
        self._client = httpx.AsyncClient(timeout=30, limits=limits)

    async def __aenter__(self) -> Load:
        self._tasks = [asyncio.create_task(self._run()) for _ in range(self._concurrency)]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stopping.set()
        try:
            async with asyncio.timeout(35):
                await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._client.aclose()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            turn = next(self._turn)
            target = self.targets[turn % len(self.targets)]
            stream = (turn // len(self.targets)) % 2 == 0
            self.results.append(await send(self._client, target, self.keys[target.key], stream))

    def completed(self, since: float = 0.0, url: str | None = None, key: str | None = None,
                  path: str | None = None) -> list[Result]:  # fmt: skip
        return [r for r in self.results if r.completed and r.began >= since
                and url in (None, r.target.url) and key in (None, r.target.key)
                and path in (None, r.target.path)]  # fmt: skip

    async def served(self, count: int, since: float = 0.0, url: str | None = None,
                     key: str | None = None, path: str | None = None) -> None:  # fmt: skip
        """Until ``count`` requests begun after ``since`` (to ``url``, with ``key``, on
        ``path``) completed; 30 s at most."""
        try:
            await eventually(lambda: len(self.completed(since, url, key, path)) >= count, 30)
        except TimeoutError:
            later = [r for r in self.results if r.began >= since]
            raise AssertionError(f"fewer than {count} completed ({url}, {key}, {path}) in 30 s:"
                                 f"\n{summary(later)}") from None  # fmt: skip


# -- the cluster ---------------------------------------------------------------------------


class BodyTap:
    """The simulator, with the body of every chat request it received kept (in order): what the
    gateway sent upstream, whose length is the prompt estimate the rate limit charges."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        parts: list[bytes] = []

        async def tapped() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self.bodies.append(b"".join(parts))
            return message

        await self.app(scope, tapped, send)
