"""``POST /v1/completions`` and ``POST /v1/embeddings``: the engine's own endpoints, behind the
same pipeline as chat.

Completions: authenticate → read the body (bounded) → validate (``gateway.api.completions``) →
the completions rewriter for this key (the model's reasoning format over the generated text,
``gateway.relay.apis.completions``) → admit → forward to the engine's ``/completions`` (a raw prompt
never passes through a chat template) → finish (settle and record, endpoint ``completions``).

Embeddings: the same recipe, forwarded whole to the engine's ``/embeddings`` and answered as the
engine answered; the record keeps the request's metadata and usage, the input per
``AUDIT_CAPTURE`` like any request's messages, and never the vectors. The rate limit reserves
the input's estimate (bytes / 4) and settles on the engine's ``prompt_tokens``.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.completions import parse_completions_request, parse_embeddings_request
from gateway.errors import GatewayError, InvalidRequest
from gateway.pipeline.steps import claimed_model
from gateway.relay.apis.completions import CompletionsRelay, CompletionsWhole, opened_by
from gateway.relay.formats import NONE
from gateway.relay.rewrite import Rewriter
from gateway.routes.state import app_state


async def create_completion(request: Request) -> Response:
    state = app_state(request)
    t0, started_at = time.perf_counter(), time.time()
    key, raw = await state.pipeline.receive(request, "client")
    try:
        call = parse_completions_request(raw, state.settings.unknown_fields)
        model = state.settings.reasoning_for(call.model)
        fmt = opened_by(model.format, call.prompt_text)
        if call.echo and fmt.splits:
            raise InvalidRequest("'echo' is not supported for a reasoning model: the echoed "
                                 "prompt would be read as its output.", param="echo")  # fmt: skip
    except GatewayError as exc:
        state.pipeline.refused(request, key, exc, claimed_model(raw), stream=False)
        raise
    policy = state.pipeline.policy(key, call.model, opened=fmt,
                                   wants_reasoning=call.wants_reasoning,
                                   include_usage=call.include_usage,
                                   choices=call.n * call.prompts)  # fmt: skip
    relay = CompletionsRelay(policy) if call.stream else CompletionsWhole(policy)
    notes = state.pipeline.unknown_fields("completions", call.unknown)
    return await state.pipeline.forward(request, key, call, ("completions", "/completions"),
                               relay, (started_at, t0), notes=notes)  # fmt: skip


class _Embeddings(Rewriter):
    """The engine's answer as it is; only its usage is kept (for the record and the limit)."""

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        usage = body.get("usage")
        if isinstance(usage, dict):
            self.usage = {"prompt_tokens": usage.get("prompt_tokens") or 0,
                          "completion_tokens": 0,
                          "total_tokens": usage.get("total_tokens") or 0}  # fmt: skip
        return body


async def create_embeddings(request: Request) -> Response:
    state = app_state(request)
    t0, started_at = time.perf_counter(), time.time()
    key, raw = await state.pipeline.receive(request, "client")
    try:
        call = parse_embeddings_request(raw, state.settings.unknown_fields)
    except GatewayError as exc:
        state.pipeline.refused(request, key, exc, claimed_model(raw), stream=False)
        raise
    policy = state.pipeline.policy(key, call.model, opened=NONE, wants_reasoning=False,
                                   guarded=False)  # fmt: skip
    notes = state.pipeline.unknown_fields("embeddings", call.unknown)
    return await state.pipeline.forward(request, key, call, ("embeddings", "/embeddings"),
                               _Embeddings(policy), (started_at, t0),
                               tokens=len(call.upstream_body) // 4 + 1, notes=notes)  # fmt: skip


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/completions", create_completion, methods=["POST"],
                      response_model=None)  # fmt: skip
    app.add_api_route("/v1/embeddings", create_embeddings, methods=["POST"],
                      response_model=None)  # fmt: skip
