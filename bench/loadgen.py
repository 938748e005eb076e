"""A lean load generator: C concurrent streaming chat completions, back to back, for S seconds.

The client must never be the bottleneck (on a 2-core machine it shares the CPU with the
simulator and the gateway): it speaks HTTP/1.1 itself on raw ``asyncio`` protocols
(``bench.client``), which also defines what a chunk and an error are.

Rules:

- Each of the C workers owns one keep-alive connection and sends its next request as soon as
  the previous response ended (a closed connection is reopened).
- TTFT: from writing the request to the socket read that carried its first chunk (a reasoning
  model's first reasoning token); answer TTFT: to the read that carried its first answer text
  (after the reasoning; ``-`` when no answer came). Inter-chunk
  gap: between the reads that carried consecutive chunks of one request (0 when one read
  carried both: the client saw them at the same moment).
- End-to-end latency (e2e): from writing the request until its worker saw the response end.
  A failed response is timed too, as wrk times non-2xx ones (errors are counted apart).
- Window: after ``warmup_s`` the counters start (``Meter.start``); ``duration_s`` later they
  stop (``Meter.stop``) and every connection is aborted, as wrk does. Only samples inside the
  window count: a TTFT whose first chunk came in it, a gap or an e2e latency whose both ends
  are in it. The abort at the end is not an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from bench.client import Api, Connection, Recorder

Context = Literal["short", "agent"]

_RECONNECT_BACKOFF_S = 0.1  # a refused connection must not turn a worker into a busy loop
_PROMPTS = 64  # distinct prompts (the simulator seeds its output from the prompt text)
_PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages",
          "completions": "/completions"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class LoadSpec:
    url: str  # OpenAI base URL, e.g. http://127.0.0.1:8080/v1
    api_key: str
    model: str = "deepseek-r1"
    concurrency: int = 32
    duration_s: float = 10.0  # the measured window
    max_tokens: int = 256
    warmup_s: float = 0.0  # load before the window, not counted
    api: Api = "chat"  # chat completions, the Responses API or Anthropic's Messages API
    # "short": one question; "agent": a coding agent's context, 100 tool calls and their
    # results under 20 tool schemas (about 100 kB of JSON; chat: ``agent_messages``,
    # Messages: ``agent_turns``)
    context: Context = "short"


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Nearest-rank percentiles of ``n`` samples, in seconds (NaN when there is none)."""

    n: int
    p50: float
    p99: float

    @classmethod
    def of(cls, samples: list[float]) -> Percentiles:
        if not samples:
            return cls(0, math.nan, math.nan)
        ordered = sorted(samples)
        return cls(len(ordered), _rank(ordered, 0.50), _rank(ordered, 0.99))


@dataclass(frozen=True, slots=True)
class LoadResult:
    spec: LoadSpec
    elapsed_s: float
    requests: int
    chunks: int
    errors: int
    ttft: Percentiles
    gap: Percentiles
    answer_ttft: Percentiles  # to the first answer token (``ttft``: the first token at all)
    e2e: Percentiles  # whole requests: written -> response ended
    first_error: str | None = None

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0


class Meter(Protocol):
    """Told when the measured window starts and stops (e.g. to read a process's CPU time)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


async def run_load(spec: LoadSpec, meter: Meter | None = None) -> LoadResult:
    """Run the load described by ``spec``; ``meter`` brackets the measured window."""
    if spec.concurrency < 1 or spec.duration_s <= 0 or spec.warmup_s < 0:
        raise ValueError("LoadSpec needs concurrency >= 1, duration_s > 0, warmup_s >= 0")
    target = _Target.parse(spec)
    rec = Recorder()
    e2e: list[float] = []
    workers = [
        asyncio.create_task(_worker(target, rec, e2e, index)) for index in range(spec.concurrency)
    ]
    try:
        await asyncio.sleep(spec.warmup_s)
        rec.open_window()
        if meter is not None:
            meter.start()
        await asyncio.sleep(spec.duration_s)
        if meter is not None:
            meter.stop()
        elapsed = rec.close_window()
    finally:
        for task in workers:
            task.cancel()
        for conn in list(rec.connections):
            conn.abort()
        await asyncio.gather(*workers, return_exceptions=True)
    return LoadResult(
        spec=spec,
        elapsed_s=elapsed,
        requests=rec.requests,
        chunks=rec.chunks,
        errors=rec.errors,
        ttft=Percentiles.of(rec.ttfts),
        gap=Percentiles.of(rec.gaps),
        answer_ttft=Percentiles.of(rec.answer_ttfts),
        e2e=Percentiles.of(e2e),
        first_error=rec.first_error,
    )


def report(result: LoadResult) -> str:
    """A compact table of one run (times in milliseconds)."""
    spec = result.spec
    header = (
        f"{'conc':>5} {'window s':>8} {'requests':>8} {'req/s':>8} {'chunks/s':>10} "
        f"{'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'answer p50':>11} {'answer p99':>11} "
        f"{'gap p50 ms':>11} {'gap p99 ms':>11} "
        f"{'e2e p50 ms':>11} {'e2e p99 ms':>11} {'errors':>6}"
    )
    row = (
        f"{spec.concurrency:>5} {result.elapsed_s:>8.2f} {result.requests:>8} "
        f"{result.requests_per_s:>8.1f} {result.chunks_per_s:>10.0f} "
        f"{_ms(result.ttft.p50):>12} {_ms(result.ttft.p99):>12} "
        f"{_ms(result.answer_ttft.p50):>11} {_ms(result.answer_ttft.p99):>11} "
        f"{_ms(result.gap.p50):>11} {_ms(result.gap.p99):>11} "
        f"{_ms(result.e2e.p50):>11} {_ms(result.e2e.p99):>11} {result.errors:>6}"
    )
    lines = [
        f"{spec.url}  model={spec.model}  max_tokens={spec.max_tokens}  (TTFT: the first "
        "token, reasoning or answer; answer: the first answer token)",
        header,
        row,
    ]
    if result.first_error:
        lines.append(f"first error: {result.first_error}")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def _rank(ordered: list[float], q: float) -> float:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# -- targets and workers ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    tls: bool
    requests: tuple[bytes, ...]  # ready-to-send requests, cycled through
    api: Api = "chat"

    @classmethod
    def parse(cls, spec: LoadSpec) -> _Target:
        parts = urlsplit(spec.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {spec.url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = parts.path.rstrip("/") + _PATHS[spec.api]
        host = parts.netloc.rpartition("@")[2]
        requests = tuple(_request(spec, host, path, n) for n in range(_PROMPTS))
        return cls(parts.hostname, port, tls, requests, spec.api)


def agent_messages(n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A coding agent's context for prompt ``n``, as Claude Code or Codex send it through a
    chat API: a system prompt, 100 turns of a tool call and its result, the question; and
    the 20 tools it declares. About 100 kB of JSON and 1,200 containers."""
    schema = {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string", "description": "The file to change."},
        "edits": {"type": "array", "items": {"type": "object", "properties": {
            "old": {"type": "string"}, "new": {"type": "string"}}}}}}  # fmt: skip
    tools = [{"type": "function", "function": {"name": f"tool_{t}", "parameters": schema,
              "description": f"Tool {t}: edit a file in place."}} for t in range(20)]  # fmt: skip
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(100):
        arguments = json.dumps({"path": f"src/m{turn}.py", "edits": [
            {"old": f"value = {turn}\n" * 8, "new": f"value = {turn + 1}\n" * 8}]})  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{turn}",
             "type": "function", "function": {"name": "tool_1", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": f"call_{turn}",
             "content": [{"type": "text", "text": f"Applied {turn}. " * 40}]},
        ]  # fmt: skip
    messages.append({"role": "user", "content": f"Question {n}: what is left to change?"})
    return messages, tools


def agent_turns(n: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``agent_messages`` as Claude Code sends it through Anthropic's Messages API: the
    ``system`` field and ``messages`` (each call a ``tool_use`` block, each result a user
    turn's ``tool_result``), and the tools with their ``input_schema``."""
    chat, functions = agent_messages(n)
    turns: list[dict[str, Any]] = []
    for message in chat[1:]:
        if message["role"] == "assistant":
            turns.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                 "input": json.loads(call["function"]["arguments"])}
                for call in message["tool_calls"]]})  # fmt: skip
        elif message["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": message["tool_call_id"],
                      "content": message["content"]}  # fmt: skip
            turns.append({"role": "user", "content": [result]})
        else:
            turns.append(
                {"role": "user", "content": [{"type": "text", "text": message["content"]}]}
            )
    tools = [{"name": f["function"]["name"], "description": f["function"]["description"],
              "input_schema": f["function"]["parameters"]} for f in functions]  # fmt: skip
    return {"system": chat[0]["content"], "messages": turns}, tools


def _request(spec: LoadSpec, host: str, path: str, n: int) -> bytes:
    question = f"Question {n}: explain it step by step."
    messages = [{"role": "user", "content": question}]
    tools: list[dict[str, Any]] = []
    anthropic: dict[str, Any] = {"messages": messages}
    if spec.context == "agent":
        if spec.api not in ("chat", "messages"):
            raise ValueError("an agent's context is a chat or Messages request here")
        messages, tools = agent_messages(n)
        anthropic, anthropic_tools = agent_turns(n)
        anthropic["tools"] = anthropic_tools
    fields: dict[str, Any] = {
        "responses": {"input": question, "max_output_tokens": spec.max_tokens, "store": False},
        "messages": {**anthropic, "max_tokens": spec.max_tokens, "thinking": {"type": "adaptive"}},
        "chat": {"messages": messages, "max_tokens": spec.max_tokens,
                 "stream_options": {"include_usage": True}, **({"tools": tools} if tools else {})},
        "completions": {"prompt": question, "max_tokens": spec.max_tokens,
                        "stream_options": {"include_usage": True}},
    }[spec.api]  # fmt: skip
    body = json.dumps(
        {"model": spec.model, "stream": True, **fields}, separators=(",", ":")
    ).encode()
    auth = f"Authorization: Bearer {spec.api_key}\r\n" if spec.api_key else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\n{auth}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _worker(target: _Target, rec: Recorder, e2e: list[float], index: int) -> None:
    loop = asyncio.get_running_loop()
    conn: Connection | None = None
    sent = index
    while True:
        if conn is None or conn.closed:
            try:
                _, conn = await loop.create_connection(
                    lambda: Connection(rec, api=target.api),
                    target.host,
                    target.port,
                    ssl=_ssl(target),
                )
            except OSError as exc:
                rec.error(f"connect: {exc}")
                await asyncio.sleep(_RECONNECT_BACKOFF_S)
                continue
        start = time.perf_counter()
        await conn.send(target.requests[sent % len(target.requests)])
        if rec.recording and start >= rec.window_start:
            e2e.append(time.perf_counter() - start)
        sent += 1


def _ssl(target: _Target) -> ssl.SSLContext | None:
    return ssl.create_default_context() if target.tls else None


# -- one connection: HTTP/1.1 response parsing and SSE event scanning ---------------------------
