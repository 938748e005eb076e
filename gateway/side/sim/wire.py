"""Bytes of vLLM's OpenAI-compatible chat API (sans-I/O, built for speed).

Streaming chunks are assembled from bytes prepared once per response (the envelope with id,
created and model) plus ``orjson.dumps`` of the delta text: no dict and no model per chunk.
The result is byte-for-byte what ``orjson.dumps`` of the whole chunk object would give.

Wire rules (vLLM 0.32, OpenAI chat completions reference):

- Each event is ``data: <json>\\n\\n``; the stream ends with ``data: [DONE]\\n\\n``.
- The first chunk of a choice has ``delta {"role": "assistant", "content": ""}`` and, at the
  top level after ``choices``, ``"prompt_token_ids": null``. Then one chunk per delta,
  ``delta {"content": t}`` or ``{"reasoning": t}`` (vLLM's field name when a reasoning parser
  runs), with ``finish_reason: null``. Every streamed choice object ends in ``"token_ids": null``.
- The finish reason travels in a separate final chunk per choice, after its last delta:
  ``{"index": i, "delta": {"content": ""}, "logprobs": null, "finish_reason": "stop"|"length",
  "stop_reason": <the stop string or null>, "token_ids": null}``, in every mode.
- A tool call (vLLM with ``--tool-call-parser``): its first delta is ``{"tool_calls": [{"id",
  "type": "function", "index": 0, "function": {"name", "arguments"}}]}``, the others
  ``{"tool_calls": [{"index": 0, "function": {"arguments"}}]}``; the finish reason is
  ``tool_calls``. A whole message has ``tool_calls`` when the choice made a call (the key is
  left out otherwise), and ``content`` ``null`` when nothing else was written.
- With ``stream_options.include_usage`` every chunk has ``"usage": null`` and a last chunk
  with ``"choices": []`` carries the usage and ``"system_fingerprint"`` (the only chunk
  where vLLM sends it).
- Usage details: without a reasoning parser (``template``, ``tags``, ``none``) a streamed
  usage has no ``completion_tokens_details`` key, a whole one has it ``null`` (and
  ``prompt_tokens_details`` ``null``). With ``--reasoning-parser deepseek_r1`` and a template
  that opened the think block (``separated``) vLLM reports ``{"reasoning_tokens": 0}``: a
  vLLM bug the gateway works around. The request's ``sim.reasoning_tokens`` overrides the
  count (``null``: as without a parser).
- A whole response: each choice has ``"stop_reason"`` and ``"token_ids": null``; the message
  has ``refusal``, ``annotations``, ``audio``, ``function_call`` (all ``null``) and
  ``reasoning`` (the parsed text, ``null`` when there is none, explicitly so without a
  parser); the top level has ``service_tier``, ``prompt_logprobs``, ``prompt_token_ids``,
  ``kv_transfer_params`` (``null``) and ``system_fingerprint``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from gateway.side.sim.deltas import Delta
from gateway.side.sim.pieces import Channel, FinishReason, Script, ScriptedCall, SimMode
from gateway.side.sim.request import ReasoningOverride

DONE = b"data: [DONE]\n\n"
SYSTEM_FINGERPRINT = "vllm-0.32.0-sim"
_FINISH: Mapping[FinishReason, bytes] = MappingProxyType(
    {"stop": b'"stop"', "length": b'"length"', "tool_calls": b'"tool_calls"'}
)
_DELTA: Mapping[Channel, bytes] = MappingProxyType(
    {"content": b'{"content":', "reasoning": b'{"reasoning":'}
)
_TOOL_NEXT = b'{"tool_calls":[{"index":0,"function":{"arguments":'  # then the text, "}}]}"
_OPEN_CHOICE = b'{"index":%d,"delta":'
_OPEN_CHOICE_END = b',"logprobs":null,"finish_reason":null,"token_ids":null}'
_ROLE = b'{"role":"assistant","content":""}'
_FINGERPRINT = b',"system_fingerprint":' + orjson.dumps(SYSTEM_FINGERPRINT)


@dataclass(frozen=True, slots=True)
class SimUsage:
    """Token counts of one response (all choices; the prompt counted once).

    ``reasoning_tokens`` ``None`` means vLLM sends no ``completion_tokens_details``.
    """

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None
    cached_tokens: int | None = None  # None: no prompt_tokens_details (vLLM without the flag)

    def to_dict(self, *, streamed: bool) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        details = (
            None if self.reasoning_tokens is None else {"reasoning_tokens": self.reasoning_tokens}
        )
        cached = None if self.cached_tokens is None else {"cached_tokens": self.cached_tokens}
        if not streamed:
            usage["prompt_tokens_details"] = cached
            usage["completion_tokens_details"] = details
        else:
            if cached is not None:
                usage["prompt_tokens_details"] = cached
            if details is not None:
                usage["completion_tokens_details"] = details
        return usage


def usage_for(
    scripts: Sequence[Script], mode: SimMode, override: ReasoningOverride = "auto"
) -> SimUsage:
    """Usage as vLLM 0.32 reports it: 0 reasoning tokens with its parser (its bug), no count
    without one; ``override`` replaces that unless ``"auto"``."""
    reasoning: int | None = 0 if mode == "separated" else None
    if override != "auto":
        reasoning = override
    completion = sum(script.completion_tokens for script in scripts)
    return SimUsage(scripts[0].prompt_tokens if scripts else 0, completion, reasoning)


class ChunkEncoder:
    """Encodes the events of one streamed response."""

    __slots__ = ("_close", "_open", "_role_close")

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool):
        envelope = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._open = b"data: " + orjson.dumps(envelope)[:-1] + b',"choices":['
        usage = b',"usage":null' if include_usage else b""
        self._close = b"]" + usage + b"}\n\n"
        self._role_close = b'],"prompt_token_ids":null' + usage + b"}\n\n"

    def role(self, index: int) -> bytes:
        """The first chunk of choice ``index``."""
        choice = _OPEN_CHOICE % index + _ROLE + _OPEN_CHOICE_END
        return self._open + choice + self._role_close

    def delta(self, index: int, delta: Delta) -> bytes:
        """One delta (one or more tokens on one channel) of choice ``index``."""
        return b"".join(
            (
                self._open,
                _OPEN_CHOICE % index,
                _DELTA[delta.channel],
                orjson.dumps(delta.text),
                b"}",
                _OPEN_CHOICE_END,
                self._close,
            )
        )

    def tool_delta(self, index: int, delta: Delta, call: ScriptedCall | None) -> bytes:
        """A piece of choice ``index``'s tool call: with ``call``, the first (id and name)."""
        if call is None:
            body = _TOOL_NEXT + orjson.dumps(delta.text) + b"}}]}"
        else:
            first = {"id": call.id, "type": "function", "index": 0,
                     "function": {"name": call.name, "arguments": delta.text}}  # fmt: skip
            body = b'{"tool_calls":[' + orjson.dumps(first) + b"]}"
        return b"".join((self._open, _OPEN_CHOICE % index, body, _OPEN_CHOICE_END, self._close))

    def finish(self, index: int, finish_reason: FinishReason, stop_reason: str | None) -> bytes:
        """The final chunk of choice ``index``: empty content and the finish reason."""
        return b"".join(
            (
                self._open,
                _OPEN_CHOICE % index,
                b'{"content":""},"logprobs":null,"finish_reason":',
                _FINISH[finish_reason],
                b',"stop_reason":',
                orjson.dumps(stop_reason),
                b',"token_ids":null}',
                self._close,
            )
        )

    def usage(self, usage: SimUsage) -> bytes:
        """The ``choices: []`` chunk that ends an ``include_usage`` stream."""
        body = orjson.dumps(usage.to_dict(streamed=True))
        return self._open + b'],"usage":' + body + _FINGERPRINT + b"}\n\n"


def completion_body(
    completion_id: str,
    created: int,
    model: str,
    scripts: Sequence[Script],
    usage: SimUsage,
    mode: SimMode,
) -> bytes:
    """A non-streamed ``chat.completion``: the same pieces, joined per channel."""
    choices = [
        {
            "index": index,
            "message": _message(script, mode),
            "logprobs": None,
            "finish_reason": script.finish_reason,
            "stop_reason": script.stop_reason,
            "token_ids": None,
        }
        for index, script in enumerate(scripts)
    ]
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage.to_dict(streamed=False),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }
    return orjson.dumps(body)


def _message(script: Script, mode: SimMode) -> dict[str, Any]:
    """Without a parser all raw text is content (``""`` if none); with one, content is null
    until the answer."""
    content = script.text("content")
    reasoning = script.text("reasoning")
    if content is None and reasoning is None and mode != "separated" and script.tool is None:
        content = ""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": reasoning,
    }
    if script.tool is not None:
        arguments = script.text("tool") or ""
        function = {"name": script.tool.name, "arguments": arguments}
        message["tool_calls"] = [{"id": script.tool.id, "type": "function", "function": function}]
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
