"""vLLM's legacy completions and embeddings, simulated (tests and the demo; not a hot path).

``POST /v1/completions``: the prompt is the model's whole input, so the simulator plans it as a
chat whose one user message is the prompt text, served by the chat code, and the bytes are
rewritten on their way out into the completions wire format (vLLM 0.32):

- ``object`` ``text_completion``, ids ``cmpl-…``; each choice ``{"index", "text", "logprobs":
  null, "finish_reason", "stop_reason"}``; streamed chunks carry one choice's text each, the
  same ``usage`` rules as chat. vLLM runs no reasoning parser on completions: a model served in
  ``separated`` mode writes its markers in the text here (``template``).
- ``prompt``: a string or a list of one string (token ids and batches are refused: the
  simulator has no tokenizer); ``echo`` and ``suffix`` are refused, as vLLM refuses ``suffix``.

``POST /v1/embeddings``: ``input`` a string or a list of strings; each gets a deterministic
unit vector of ``DIMENSIONS`` floats from a hash of its text; usage counts the input tokens
(words).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from typing import Any

import orjson
from starlette.types import Message, Send

from gateway.side.sim.errors import SimRequestError, error_body
from gateway.side.sim.request import SimRequest, parse_chat_request
from gateway.side.sim.script import count_prompt_tokens

DIMENSIONS = 8
_HEADERS_LENGTH = b"content-length"


def completions_request(body: bytes, config: Any) -> tuple[SimRequest, dict[str, Any]]:
    """The chat request the simulator plans for a completions ``body``, and the body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise SimRequestError(400, "BadRequestError", "invalid JSON body") from None
    if not isinstance(data, dict):
        raise SimRequestError(400, "BadRequestError", "the body must be an object")
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise SimRequestError(400, "BadRequestError", "prompt must be a string", "prompt")
    for name in ("suffix", "echo"):
        if data.get(name):
            raise SimRequestError(400, "BadRequestError", f"{name} is not supported", name)
    chat = {k: v for k, v in data.items() if k not in ("prompt", "echo", "suffix", "logprobs")}
    chat["messages"] = [{"role": "user", "content": prompt}]
    request = parse_chat_request(orjson.dumps(chat), config)
    if request.mode == "separated":  # no reasoning parser on completions
        request = dataclasses.replace(request, mode="template")
    return request, data


class AsCompletions:
    """An ASGI ``send`` that turns the chat code's responses into completions ones."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._start: Message | None = None
        self._buffer = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers") or [])
            if _HEADERS_LENGTH in headers and message.get("status") == 200:
                self._start = message  # a whole body: sent with its new length
                return
            await self._send(message)
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        body = message.get("body", b"")
        if self._start is not None:
            start, self._start = self._start, None
            body = _whole(body)
            kept = [(k, v) for k, v in start.get("headers") or [] if k != _HEADERS_LENGTH]
            kept.append((_HEADERS_LENGTH, str(len(body)).encode()))
            await self._send({**start, "headers": kept})
            await self._send({**message, "body": body})
            return
        self._buffer += body
        events, _, self._buffer = self._buffer.rpartition(b"\n\n")
        out = b"".join(_event(e) for e in events.split(b"\n\n") if e) if events else b""
        await self._send({**message, "body": out})


def _event(event: bytes) -> bytes:
    if not event.startswith(b"data: ") or event == b"data: [DONE]":
        return event + b"\n\n"
    chunk = orjson.loads(event[6:])
    if "choices" in chunk:
        chunk["object"] = "text_completion"
        chunk["id"] = "cmpl-" + str(chunk.get("id", "")).removeprefix("chatcmpl-")
        chunk["choices"] = [_choice(c, c.get("delta") or {}) for c in chunk["choices"]]
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _whole(body: bytes) -> bytes:
    data = orjson.loads(body)
    if "choices" not in data:
        return body  # an error
    data["object"] = "text_completion"
    data["id"] = "cmpl-" + str(data.get("id", "")).removeprefix("chatcmpl-")
    data["choices"] = [_choice(c, c.get("message") or {}) for c in data["choices"]]
    return orjson.dumps(data)


def _choice(choice: dict[str, Any], holder: dict[str, Any]) -> dict[str, Any]:
    text = (holder.get("reasoning") or "") + (holder.get("content") or "")
    return {"index": choice.get("index", 0), "text": text, "logprobs": None,
            "finish_reason": choice.get("finish_reason"),
            "stop_reason": choice.get("stop_reason")}  # fmt: skip


def embeddings_body(body: bytes, models: list[str]) -> tuple[int, bytes]:
    """``(status, body)`` of an embeddings request."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 400, error_body("invalid JSON body", "BadRequestError", None, 400)
    model = data.get("model") if isinstance(data, dict) else None
    if model not in models:
        return 404, error_body(f"The model `{model}` does not exist.", "NotFoundError",
                               "model", 404)  # fmt: skip
    inputs = data.get("input")
    inputs = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
        return 400, error_body("input must be a string or a list of strings",
                               "BadRequestError", "input", 400)  # fmt: skip
    tokens = sum(count_prompt_tokens(text) for text in inputs)
    vectors = [{"object": "embedding", "index": i, "embedding": embedding(text)}
               for i, text in enumerate(inputs)]  # fmt: skip
    return 200, orjson.dumps({
        "id": "embd-" + hashlib.sha256(body).hexdigest()[:24], "object": "list",
        "created": 0, "model": model, "data": vectors,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    })  # fmt: skip


def embedding(text: str) -> list[float]:
    """A deterministic unit vector for ``text``."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [v / 2**31 - 1.0 for v in struct.unpack(f">{DIMENSIONS}I", digest[: 4 * DIMENSIONS])]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]
