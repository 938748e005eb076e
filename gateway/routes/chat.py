"""``POST /v1/chat/completions``: the route, as the recipe.

authenticate → read the body (bounded) → validate → admit (the ledger takes records, priority,
route, rate limits and KV budget at once) → build the chat rewriter for this key → forward
(open the upstream and check its status and first bytes *before* the response starts, relay,
finish: settle and record exactly once).

Authentication comes before validation, as with OpenAI's API: an unauthenticated caller learns
nothing about the request schema. Everything that can fail before the first byte becomes an
HTTP error; after the response started, a failure yields exactly one SSE ``error`` event, then
``[DONE]`` (``gateway.exchange.forward``).
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.chat import ChatRequest, parse_chat_request
from gateway.auth.keys import KeyInfo
from gateway.errors import GatewayError, InvalidRequest
from gateway.pipeline.steps import claimed_model
from gateway.relay.rewrite import Rewriter, StreamRelay
from gateway.routes.state import AppState, app_state

ENDPOINT, PATH = "chat.completions", "/chat/completions"


async def chat_completions(request: Request) -> Response:
    state = app_state(request)
    t0, started_at = time.perf_counter(), time.time()
    key, raw = await state.pipeline.receive(request, "client")
    try:
        chat = parse_chat_request(raw, state.settings.unknown_fields)
        history = state.settings.reasoning_for(chat.model)
        chat = chat.with_history(history.history, history.turns)
        relay = rewriter(state, key, chat)
        if chat.params.get("echo") is True and relay.policy.thinking:
            # vLLM puts the last assistant message before the output: the splitter would read
            # it as generated text (as completions' echo, refused there too)
            raise InvalidRequest("'echo' is not supported for a reasoning model: the echoed "
                                 "message would be read as its output.", param="echo")  # fmt: skip
        if not relay.policy.thinking:  # forwarded as decided: the template cannot think either
            chat = chat.without_thinking(relay.policy.format.switches)
        chat = state.pipeline.budgeted(key, chat, relay, chat.params)
    except GatewayError as exc:
        state.pipeline.refused(request, key, exc, claimed_model(raw), stream=False)
        raise
    notes = state.pipeline.unknown_fields(ENDPOINT, chat.unknown)
    return await state.pipeline.forward(request, key, chat, (ENDPOINT, PATH), relay,
                               (started_at, t0), tokens=estimate_tokens(chat, state),
                               notes=notes)  # fmt: skip


def rewriter(state: AppState, key: KeyInfo, chat: ChatRequest) -> Rewriter:
    """The chat rewriter of this request: the model's reasoning format and source, thinking as
    the request switched it, reasoning shown only to a key allowed to see it."""
    policy = state.pipeline.policy(
        key, chat.model, thinking_params=chat.params, wants_reasoning=chat.wants_reasoning,
        include_usage=chat.include_usage, repair_leak=chat.stream and chat.has_stop,
        choices=chat.n,
    )  # fmt: skip
    return StreamRelay(policy) if chat.stream else Rewriter(policy)


def estimate_tokens(chat: ChatRequest, state: AppState) -> int:
    """OpenAI's reservation rule: prompt estimate (bytes / 4) + max_tokens, per choice."""
    return state.pipeline.reservation(chat.upstream_body, chat.n, chat.max_tokens)


def add_routes(app: FastAPI) -> None:
    app.add_api_route(f"/v1{PATH}", chat_completions, methods=["POST"], response_model=None)
