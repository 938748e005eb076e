"""``POST /v1/messages``: Anthropic's Messages API, translated to the upstream's Chat Completions.

The chat route's recipe with the Messages parser and rewriter: authenticate (``x-api-key`` or
``Authorization: Bearer``) → read the body (bounded) → the field policy, validate and translate
(``gateway.api.messages.request``) → open the reasoning that came back (a ``thinking`` block's
signature must open to its very text, or the block come back with no text, as
``thinking.display: "omitted"`` sent it; ``redacted_thinking`` data opens to the reasoning) and
apply the context edits → build the Messages rewriter for this key (``gateway.relay.apis.messages``:
``message_start`` carries the prompt's estimate, the edits' report goes in the answer) → the
reasoning budget (``thinking``, ``output_config.effort``) → admit → forward to the engine's
``/chat/completions`` → finish (settle and record, endpoint ``messages``). Fields no reference
names are named in ``x-thinkgate-ignored``, server tools left out in
``x-thinkgate-dropped-tools``. Errors are in Anthropic's shape (``gateway.app``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.messages.request import (
    MessagesRequest,
    parse_count_tokens_request,
    parse_messages_request,
)
from gateway.api.tools import DROPPED_HEADER, dropped_header
from gateway.auth.keys import KeyInfo
from gateway.errors import GatewayError, InvalidRequest
from gateway.pipeline.steps import claimed_model
from gateway.relay.apis.messages import MessageMeta, MessagesStream, MessagesWhole, Sealer
from gateway.routes.state import AppState, app_state

log = logging.getLogger("thinkgate")

ENDPOINT, PATH = "messages", "/chat/completions"
COUNTED = "messages.count_tokens"  # the endpoint label of count_tokens' unknown fields


async def create_message(request: Request) -> Response:
    state = app_state(request)
    t0, started_at = time.perf_counter(), time.time()
    key, raw = await state.pipeline.receive(request, "client")
    try:
        parsed = parse_messages_request(raw, state.settings.unknown_fields)
        call = await prepared(state, key, parsed)
        seal = await state.sealer.sealer(key.tenant, call.model) if (
            call.show_thinking and state.sealer is not None) else None  # fmt: skip
        relay = rewriter(state, key, call, seal)
        call = state.pipeline.budgeted(key, call, relay, call.chat)
    except GatewayError as exc:
        state.pipeline.refused(request, key, exc, claimed_model(raw), stream=False)
        raise
    notes = notices(state, call)
    return await state.pipeline.forward(request, key, call, (ENDPOINT, PATH), relay,
                               (started_at, t0), notes=notes)  # fmt: skip


def notices(
    state: AppState, call: MessagesRequest, endpoint: str = ENDPOINT
) -> tuple[tuple[str, str], ...]:
    """The response headers of what the request sent that had no effect: the fields no
    reference names (``x-thinkgate-ignored``, counted and logged as on every API) and the
    server tools left out (``x-thinkgate-dropped-tools``, logged, as on Responses)."""
    notes = state.pipeline.unknown_fields(endpoint, call.unknown)
    if call.dropped:
        log.info("server tools dropped on %s (UNKNOWN_FIELDS=ignore): %s; named in %s",
                 endpoint, ", ".join(call.dropped), DROPPED_HEADER)  # fmt: skip
    return notes + dropped_header(call.dropped)


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
        if text and opened[signature.token] != text:  # empty: sent back as display omitted
            raise InvalidRequest("A thinking block was modified: its text does not match its "
                                 "signature.", param=signature.param)  # fmt: skip
    rule = state.settings.reasoning_for(call.model)
    return call.build(opened, rule.history, rule.turns)


def rewriter(
    state: AppState, key: KeyInfo, call: MessagesRequest, seal: Sealer | None
) -> MessagesWhole | MessagesStream:
    policy = state.pipeline.policy(
        key, call.model, thinking_params=call.params_for_thinking, include_usage=True,
        repair_leak=call.stream and bool(call.stop_sequences),
    )  # fmt: skip
    meta = MessageMeta(call.model, call.show_thinking, call.stop_sequences, seal,
                       omit_thinking=call.omit_thinking, input_tokens=call.prompt_tokens,
                       context_management=call.context_management)  # fmt: skip
    return MessagesStream(policy, meta) if call.stream else MessagesWhole(policy, meta)


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: the request's input tokens (``COUNT_TOKENS`` policy,
    the context edits applied) as the engine's tokenizer counts them with the model's chat
    template (vLLM's ``/tokenize``), else the gateway's estimate (``prompt_estimate``);
    ``x-thinkgate-token-count`` says which (``engine``, ``estimate``). With
    ``context_management``, ``context_management.original_input_tokens`` is the count plus what
    the edits cleared (the gateway's estimate of it: no second count is asked for). Nothing is
    generated, so nothing is recorded or rate-limited beyond the key check."""
    state = app_state(request)
    key, raw = await state.pipeline.receive(request, "client")
    try:
        parsed = parse_count_tokens_request(raw, state.settings.unknown_fields)
        call = await prepared(state, key, parsed)
    except GatewayError as exc:
        state.pipeline.refused(request, key, exc, claimed_model(raw), stream=False)
        raise
    count, source = await counted(state, call)
    answer: dict[str, Any] = {"input_tokens": count}
    if call.manages_context:
        cleared = sum(edit.cleared_input_tokens for edit in call.applied)
        answer["context_management"] = {"original_input_tokens": count + cleared}
    headers = {"x-thinkgate-token-count": source, **dict(notices(state, call, COUNTED))}
    return Response(orjson.dumps(answer), media_type="application/json", headers=headers)


async def counted(state: AppState, call: MessagesRequest) -> tuple[int, str]:
    """The prompt's tokens, and who counted them (``engine`` or ``estimate``)."""
    candidates = await state.upstreams.route(call.model)
    asked = {"model": call.model, "messages": call.messages, "add_generation_prompt": True}
    if call.chat.get("tools"):
        asked["tools"] = call.chat["tools"]
    answer = await state.upstreams.ask(candidates[0], candidates[0].root_url("/tokenize"),
                                       orjson.dumps(asked))  # fmt: skip
    count = answer.get("count") if answer else None
    if type(count) is int:
        return count, "engine"
    return call.prompt_tokens, "estimate"


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/messages", create_message, methods=["POST"], response_model=None)
    app.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"],
                      response_model=None)  # fmt: skip
