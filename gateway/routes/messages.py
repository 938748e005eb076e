"""``POST /v1/messages``: Anthropic's Messages API, translated to the upstream's Chat Completions.

The chat route's recipe with the Messages parser and rewriter: authenticate (``x-api-key`` or
``Authorization: Bearer``) → read the body (bounded) → validate and translate
(``gateway.api.messages``) → open the reasoning that came back (a ``thinking`` block's
signature must open to its very text; ``redacted_thinking`` data opens to the reasoning) →
build the Messages rewriter for this key (``gateway.relay.messages``) → the reasoning budget
(``thinking.budget_tokens``) → admit → forward to the engine's ``/chat/completions`` → finish
(settle and record, endpoint ``messages``). Errors are in Anthropic's shape (``gateway.app``).
"""

from __future__ import annotations

import time

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.jsonbody import json_object
from gateway.api.messages import MessagesRequest, parse_messages_request
from gateway.auth.keys import KeyInfo
from gateway.errors import GatewayError, InvalidRequest
from gateway.relay.messages import MessageMeta, MessagesStream, MessagesWhole, Sealer
from gateway.relay.rewrite import Policy
from gateway.routes import steps
from gateway.routes.state import AppState, app_state

ENDPOINT, PATH = "messages", "/chat/completions"


async def create_message(request: Request) -> Response:
    state = app_state(request)
    t0, started_at = time.perf_counter(), time.time()
    key, raw = await steps.receive(state, request, "client")
    try:
        call = await prepared(state, key, parse_messages_request(raw))
        seal = await state.sealer.sealer(key.tenant, call.model) if (
            call.show_thinking and state.sealer is not None) else None  # fmt: skip
        relay = rewriter(state, key, call, seal)
        call = steps.budgeted(state, key, call, relay, call.chat)
    except GatewayError as exc:
        steps.refused(state, request, key, exc, steps.claimed_model(raw), stream=False)
        raise
    return await steps.forward(state, request, key, call, (ENDPOINT, PATH), relay,
                               (started_at, t0))  # fmt: skip


async def prepared(state: AppState, key: KeyInfo, call: MessagesRequest) -> MessagesRequest:
    """The request with the reasoning of earlier turns opened and placed per the model's
    history rule; a thinking block whose text is not what its signature sealed is refused."""
    sealed = call.history.sealed
    if not sealed:
        return call
    if state.sealer is None:
        raise InvalidRequest("Thinking blocks need the ledger's keys, which this gateway does "
                             "not have.", param=sealed[0].param)  # fmt: skip
    opened = await state.sealer.open(key.tenant, call.model, sealed)
    for signature, text in call.signed:
        if opened[signature.token] != text:
            raise InvalidRequest("A thinking block was modified: its text does not match its "
                                 "signature.", param=signature.param)  # fmt: skip
    rule = state.settings.reasoning_for(call.model)
    return call.build(opened, rule.history, rule.turns)


def rewriter(
    state: AppState, key: KeyInfo, call: MessagesRequest, seal: Sealer | None
) -> MessagesWhole | MessagesStream:
    reasoning = state.settings.reasoning_for(call.model)
    policy = Policy(
        format=reasoning.format,
        source=reasoning.source,
        thinking=reasoning.format.thinking(call.params_for_thinking),
        show_reasoning=key.reasoning == "visible",
        reasoning_field=state.settings.reasoning_field,
        include_usage=True,
        repair_leak=call.stream and bool(call.stop_sequences),
    )
    meta = MessageMeta(call.model, call.show_thinking, call.stop_sequences, seal)
    return MessagesStream(policy, meta) if call.stream else MessagesWhole(policy, meta)


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: the request's input tokens as the engine's tokenizer
    counts them with the model's chat template (vLLM's ``/tokenize``), else the gateway's
    estimate (bytes / 4); ``x-thinkgate-token-count`` says which (``engine``, ``estimate``).
    Nothing is generated, so nothing is recorded or rate-limited beyond the key check."""
    state = app_state(request)
    key, raw = await steps.receive(state, request, "client")
    body = json_object(raw)
    body = {k: v for k, v in body.items() if k != "stream"} | {"max_tokens": 1_000_000}
    call = await prepared(state, key, parse_messages_request(orjson.dumps(body)))
    candidates = await state.upstreams.route(call.model)
    asked = {"model": call.model, "messages": call.messages, "add_generation_prompt": True}
    if call.chat.get("tools"):
        asked["tools"] = call.chat["tools"]
    counted = await state.upstreams.ask(candidates[0], candidates[0].root_url("/tokenize"),
                                   orjson.dumps(asked))  # fmt: skip
    count = counted.get("count") if counted else None
    source = "engine" if type(count) is int else "estimate"
    if type(count) is not int:
        count = len(orjson.dumps(call.messages)) // 4 + 1
    return Response(orjson.dumps({"input_tokens": count}), media_type="application/json",
                    headers={"x-thinkgate-token-count": source})  # fmt: skip


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/messages", create_message, methods=["POST"], response_model=None)
    app.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"],
                      response_model=None)  # fmt: skip
