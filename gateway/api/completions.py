"""The legacy completions and the embeddings requests at the edge (sans-I/O).

``parse_completions_request(raw) -> CompletionsRequest``: ``POST /v1/completions`` goes to the
engine's own ``/v1/completions``, never through a chat template: a raw prompt is the model's
whole input. Validated: ``model``, ``prompt`` (a string, a list of strings, or token ids: a
list of integers or of lists of integers), ``stream``, ``n``, ``max_tokens``; every other field
passes through (``stop``, ``logprobs``, ``suffix``, vLLM extras) and the engine refuses what it
does not serve. ``echo`` is refused where the model's output is split: the echoed prompt would be
read as generated text. ``include_reasoning: false`` lowers the request's own visibility, as on
chat. Streams always ask for usage, and the client's own choice is remembered.

``parse_embeddings_request(raw) -> EmbeddingsRequest``: ``model`` and ``input`` (a string, a
list of strings, or token ids) validated, the body passed through as it came.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.api.fields import COMPLETIONS, EMBEDDINGS, UnknownFields
from gateway.api.jsonbody import json_object
from gateway.api.screen import screen
from gateway.errors import InvalidRequest

MAX_N = 16
MAX_TOKENS = 1_000_000


@dataclass(frozen=True, slots=True)
class CompletionsRequest:
    model: str
    stream: bool
    include_usage: bool
    wants_reasoning: bool
    max_tokens: int | None
    n: int
    echo: bool
    prompt: Any
    messages: list[Any]  # the prompt as the record keeps it: [{"role": "prompt", "content"}]
    params: dict[str, Any]
    upstream_body: bytes
    unknown: tuple[str, ...] = ()  # fields no reference names, accepted (UNKNOWN_FIELDS=ignore)

    @property
    def prompts(self) -> int:
        """How many prompts the request holds: a string or one list of token ids is one, a
        list of strings or of token-id lists one each (the engine answers ``n`` per prompt)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
            return len(prompt)
        return 1

    @property
    def prompt_text(self) -> str | None:
        """The prompt's text when it is one string (token ids have none the gateway reads)."""
        prompt = self.prompt
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return prompt if isinstance(prompt, str) else None


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    model: str
    inputs: int  # how many inputs (texts or token lists)
    messages: list[Any]  # the input as the record keeps it (per AUDIT_CAPTURE)
    params: dict[str, Any]
    upstream_body: bytes
    stream: bool = False
    n: int = 1
    unknown: tuple[str, ...] = ()  # fields no reference names, accepted (UNKNOWN_FIELDS=ignore)
    max_tokens: int | None = None


def parse_completions_request(raw: bytes, unknown: UnknownFields = "ignore") -> CompletionsRequest:
    screened = screen(json_object(raw), COMPLETIONS, unknown, forward_unknown=True)
    body = screened.body
    model = _model(body)
    prompt = body.get("prompt")
    if not _prompt_ok(prompt):
        raise InvalidRequest("Invalid value for 'prompt': a string, a list of strings, or "
                             "token ids.", param="prompt")  # fmt: skip
    stream = body.get("stream")
    if not isinstance(stream, bool | None):
        raise InvalidRequest("Invalid value for 'stream': a boolean.", param="stream")
    n = _int(body, "n", 1, MAX_N) or 1
    max_tokens = _int(body, "max_tokens", 1, MAX_TOKENS)
    wants = body.pop("include_reasoning", True)
    if not isinstance(wants, bool):
        raise InvalidRequest("Invalid value for 'include_reasoning': a boolean.",
                             param="include_reasoning")  # fmt: skip
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    if stream:
        body["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                  "include_usage": True}  # fmt: skip
    return CompletionsRequest(
        model=model, stream=bool(stream), include_usage=include_usage, wants_reasoning=wants,
        max_tokens=max_tokens, n=n, echo=body.get("echo") is True, prompt=prompt,
        messages=[{"role": "prompt", "content": prompt}],
        params={k: v for k, v in body.items() if k != "prompt"},
        upstream_body=orjson.dumps(body), unknown=screened.unknown,
    )  # fmt: skip


def parse_embeddings_request(raw: bytes, unknown: UnknownFields = "ignore") -> EmbeddingsRequest:
    parsed = json_object(raw)
    screened = screen(parsed, EMBEDDINGS, unknown, forward_unknown=True)
    body = screened.body
    if len(body) != len(parsed):  # a field left out: the body sent on is no longer the client's
        raw = orjson.dumps(body)
    model = _model(body)
    given: Any = body.get("input")
    if not _prompt_ok(given) or given == "":
        raise InvalidRequest("Invalid value for 'input': a non-empty string, a list of "
                             "strings, or token ids.", param="input")  # fmt: skip
    inputs = 1 if isinstance(given, str) or _ints(given) else len(given)
    return EmbeddingsRequest(model, inputs, [{"role": "input", "content": given}],
                             {k: v for k, v in body.items() if k != "input"}, raw,
                             unknown=screened.unknown)  # fmt: skip


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    return model


def _int(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        raise InvalidRequest(f"Invalid value for '{name}': an integer from {low} to {high}.",
                             param=name)  # fmt: skip
    return value


def _ints(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)


def _prompt_ok(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    return all(isinstance(p, str) for p in prompt) or _ints(prompt) or all(_ints(p) for p in prompt)
