"""``POST /v1/responses``: the Responses API, translated to the upstream's Chat Completions.

The chat route's recipe with the Responses parser and rewriter: authenticate → read the body
(bounded) → validate and translate (``gateway.api.responses``) → admit → build the Responses
rewriter for this key (``gateway.relay.responses``) → forward to the engine's
``/chat/completions`` → finish (settle and record, endpoint ``responses``). Everything the
chat route guarantees holds: reasoning formats and sources, visibility, limits, KV admission,
one ledger record, metrics, one terminal event after a failure.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.responses import ResponsesRequest, parse_responses_request
from gateway.auth.keys import KeyInfo
from gateway.errors import GatewayError
from gateway.relay.responses import ResponseMeta, ResponsesStream, ResponsesWhole
from gateway.relay.rewrite import Policy, Rewriter
from gateway.routes import steps
from gateway.routes.state import AppState, app_state

ENDPOINT, PATH = "responses", "/chat/completions"


async def create_response(request: Request) -> Response:
    state = app_state(request)
    t0, started_at = time.perf_counter(), time.time()
    key, raw = await steps.receive(state, request, "client")
    try:
        call = parse_responses_request(raw)
    except GatewayError as exc:
        steps.refused(state, request, key, exc, "unknown", stream=False)
        raise
    tokens = steps.reservation(state, call.upstream_body, 1, call.max_tokens)
    ticket, candidates = await steps.admit(state, request, key, call.model, call.stream, tokens)
    ex = steps.exchange(state, request, key, call, (ENDPOINT, PATH), rewriter(state, key, call),
                        ticket, (started_at, t0))  # fmt: skip
    return await state.forwarder.run(ex, candidates, request.receive)


def rewriter(state: AppState, key: KeyInfo, call: ResponsesRequest) -> Rewriter:
    reasoning = state.settings.reasoning_for(call.model)
    policy = Policy(
        format=reasoning.format,
        source=reasoning.source,
        thinking=reasoning.format.thinking(call.params_for_thinking),
        show_reasoning=key.reasoning == "visible",
        reasoning_field=state.settings.reasoning_field,
        include_usage=True,
    )
    meta = ResponseMeta(call.model, call.echo)
    return ResponsesStream(policy, meta) if call.stream else ResponsesWhole(policy, meta)


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/responses", create_response, methods=["POST"], response_model=None)
