"""``python -m bench.paced --port P``: an upstream that streams the way an engine does.

vLLM sends one SSE event per engine step, so each token is one ``transport.write`` and, at a
real inter-token delay, one read on the other side: every per-read cost of a proxy is paid per
token. ``thinkgate sim`` writes several tokens per write at zero delay; this server never does.

It speaks just enough OpenAI for the gateway and the relay: ``GET /v1/models``, ``GET
/health``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streamed, HTTP/1.1
chunked, keep-alive). The model name picks the shape (``MODELS``): reasoning words in
DeepSeek-R1's text (starting at once: its template opens ``<think>`` in the prompt, so the first
event is a token for every client; the splitter cuts at ``</think>``), answer words, the delay
between events (and before the first). A chat stream's role chunk comes with the first token,
as vLLM sends it (in the first token's engine step, just before it): the TTFT covers what a
gateway does with an engine's first bytes. Each event is one chunk of the chunked body in one
write; with ``stream_options.include_usage`` a usage chunk comes before ``[DONE]``.

Raw uvloop protocols on purpose: the upstream shares the 2 cores with what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import uvloop


@dataclass(frozen=True, slots=True)
class Shape:
    reasoning_words: int
    answer_words: int
    delay_ms: float  # between events; also before the first one
    think: bool = True  # reasoning in <think> text (False: the answer only)


MODELS = {
    "bench-flat": Shape(150, 50, 0),  # flat out: as fast as the reader reads
    "bench-paced": Shape(40, 20, 10),  # 100 tokens/s per stream, a realistic engine
    "bench-short": Shape(0, 3, 0),  # </think> (dropped by the gateway), 3 answer chunks
}


@functools.cache
def events(model: str, chat: bool, usage: bool) -> tuple[bytes, ...]:
    """Every SSE event of one response to ``model``, in order (made once per shape: the
    upstream must cost little; vLLM's field order and compact JSON)."""
    shape = MODELS[model]
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(choice: dict[str, object]) -> bytes:
        chunk = {"id": "cmpl-bench", "object": kind, "created": created, "model": model,
                 "choices": [{"index": 0, **choice}]}  # fmt: skip
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    def piece(text: str, finish: str | None = None) -> bytes:
        body: dict[str, object] = {"delta": {"content": text}} if chat else {"text": text}
        return event({**body, "logprobs": None, "finish_reason": finish})

    out = [event({"delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None})] if chat else []  # fmt: skip
    texts: list[str] = []
    if shape.think:  # R1's chat template opens <think> in the prompt: the output starts inside
        texts += [f" thought{i}" for i in range(shape.reasoning_words)]
        texts.append("\n</think>\n\n")
    texts += [f" word{i}" for i in range(shape.answer_words)]
    out += [piece(t) for t in texts]
    out.append(piece("", "stop"))
    if usage:
        counts = {"prompt_tokens": 12, "completion_tokens": len(texts),
                  "total_tokens": len(texts) + 12}  # fmt: skip
        chunk = {"id": "cmpl-bench", "object": kind, "created": created, "model": model,
                 "choices": [], "usage": counts}  # fmt: skip
        out.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return tuple(out)


class _Http(asyncio.Protocol):
    """One client connection: requests one after another, each answered by a task."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buf = b""
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self._busy:
            self._next()

    def _next(self) -> None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self._buf[:end].decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(self._buf) < end + 4 + length:
            return
        body = self._buf[end + 4 : end + 4 + length]
        self._buf = self._buf[end + 4 + length :]
        method, path, _ = head[0].split(" ", 2)
        self._busy = True
        asyncio.get_running_loop().create_task(self._answer(method, path, body))

    async def _answer(self, method: str, path: str, body: bytes) -> None:
        try:
            if method == "GET" and path in ("/health", "/v1/health"):
                self._whole(200, b"{}")
            elif method == "GET" and path == "/v1/models":
                cards = [{"id": m, "object": "model", "owned_by": "bench", "max_model_len": 32768}
                         for m in MODELS]  # fmt: skip
                self._whole(200, json.dumps({"object": "list", "data": cards}).encode())
            elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                await self._stream(path.endswith("chat/completions"), json.loads(body))
            else:
                self._whole(404, b'{"error":{"message":"not found"}}')
        finally:
            self._busy = False
        if self._transport is not None and self._buf:
            self._next()

    def _whole(self, status: int, body: bytes) -> None:
        if self._transport is None:
            return
        reason = "OK" if status == 200 else "Not Found"
        self._transport.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )

    async def _stream(self, chat: bool, request: dict[str, object]) -> None:
        model = str(request.get("model"))
        shape = MODELS.get(model)
        if shape is None or self._transport is None:
            self._whole(404, b'{"error":{"message":"no such model"}}')
            return
        options = request.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        self._transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        delay = shape.delay_ms / 1000
        for index, event in enumerate(events(model, chat, usage)):
            # vLLM sends a chat stream's role chunk in the engine step of the first token,
            # just before it: both come after the TTFT, in writes of their own
            await asyncio.sleep(0 if chat and index == 1 else delay)
            # (0: still one write per event, other streams between)
            if self._transport is None:
                return  # the client went away
            self._transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        if self._transport is not None:
            self._transport.write(b"0\r\n\r\n")


async def serve(host: str, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Http, host, port, backlog=2048)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
