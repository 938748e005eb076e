"""Bytes of vLLM's OpenAI-compatible chat API (sans-I/O, built for speed).

Streaming chunks are assembled from bytes prepared once per response (the envelope with id,
created and model) plus ``orjson.dumps`` of the piece text: no dict and no model per chunk.
The result is byte-for-byte what ``orjson.dumps`` of the whole chunk object would give.

Wire rules (vLLM 0.1x, OpenAI chat completions reference):

- Each event is ``data: <json>\\n\\n``; the stream ends with ``data: [DONE]\\n\\n``.
- The first chunk of a choice has ``delta {"role": "assistant", "content": ""}``; then one
  chunk per token, ``delta {"content": t}`` or ``{"reasoning": t}`` (vLLM's field name when a
  reasoning parser runs); the chunk of the last token carries ``finish_reason``.
- With ``stream_options.include_usage`` every chunk has ``"usage": null`` and a last chunk
  with ``"choices": []`` carries the usage.
- ``completion_tokens_details`` is ``{"reasoning_tokens": R}`` only when reasoning was parsed
  out (``separated`` mode), ``null`` otherwise, unless the request's ``sim`` overrides it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from gateway.sim.request import ReasoningOverride
from gateway.sim.script import FinishReason, Piece, Script, SimMode

DONE = b"data: [DONE]\n\n"
_FINISH: Mapping[FinishReason | None, bytes] = MappingProxyType(
    {None: b"null", "stop": b'"stop"', "length": b'"length"'}
)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one response (all choices; the prompt counted once)."""

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        details = (
            None if self.reasoning_tokens is None else {"reasoning_tokens": self.reasoning_tokens}
        )
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens_details": details,
        }


def usage_for(
    scripts: Sequence[Script], mode: SimMode, override: ReasoningOverride = "auto"
) -> Usage:
    """Usage as vLLM reports it; ``override`` replaces the reasoning count unless ``"auto"``."""
    reasoning: int | None = sum(script.reasoning_tokens for script in scripts)
    if override != "auto":
        reasoning = override
    elif mode != "separated":
        reasoning = None
    completion = sum(script.completion_tokens for script in scripts)
    return Usage(scripts[0].prompt_tokens if scripts else 0, completion, reasoning)


class ChunkEncoder:
    """Encodes the events of one streamed response."""

    __slots__ = ("_close", "_open")

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool):
        envelope = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._open = b"data: " + orjson.dumps(envelope)[:-1] + b',"choices":['
        self._close = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"

    def role(self, index: int) -> bytes:
        """The first chunk of choice ``index``."""
        return self._choice(index, b'{"role":"assistant","content":""}', None)

    def piece(self, index: int, piece: Piece, finish_reason: FinishReason | None) -> bytes:
        """One token of choice ``index``; the last one carries ``finish_reason``."""
        delta = b'{"' + piece.channel.encode() + b'":' + orjson.dumps(piece.text) + b"}"
        return self._choice(index, delta, finish_reason)

    def finish(self, index: int, finish_reason: FinishReason) -> bytes:
        """The closing chunk of a choice that produced no token at all."""
        return self._choice(index, b'{"content":""}', finish_reason)

    def usage(self, usage: Usage) -> bytes:
        """The ``choices: []`` chunk that ends an ``include_usage`` stream."""
        return self._open + b'],"usage":' + orjson.dumps(usage.to_dict()) + b"}\n\n"

    def _choice(self, index: int, delta: bytes, finish_reason: FinishReason | None) -> bytes:
        return b"".join(
            (
                self._open,
                b'{"index":%d,"delta":' % index,
                delta,
                b',"logprobs":null,"finish_reason":',
                _FINISH[finish_reason],
                b"}",
                self._close,
            )
        )


def completion_body(
    completion_id: str,
    created: int,
    model: str,
    scripts: Sequence[Script],
    usage: Usage,
    mode: SimMode,
) -> bytes:
    """A non-streamed ``chat.completion``: the same pieces, joined per channel."""
    choices = [
        {
            "index": index,
            "message": _message(script, mode),
            "logprobs": None,
            "finish_reason": script.finish_reason,
        }
        for index, script in enumerate(scripts)
    ]
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage.to_dict(),
    }
    return orjson.dumps(body)


def _message(script: Script, mode: SimMode) -> dict[str, Any]:
    """Without a parser all raw text is content; with one, content is null until the answer."""
    content = script.text("content")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if mode == "separated" or script.reasoning_tokens:
        message["reasoning"] = script.text("reasoning")
    elif content is None:
        message["content"] = ""
    return message


def models_body(models: Sequence[str], created: int, max_model_len: int) -> bytes:
    """``GET /v1/models``, one card per served name."""
    cards = [
        {
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": max_model_len,
        }
        for model in models
    ]
    return orjson.dumps({"object": "list", "data": cards})
