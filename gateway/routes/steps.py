"""The steps every completion route shares before its exchange starts (sans the API's own).

``receive(state, request, role)`` authenticates (before any body is read: a caller without a
key cannot make the gateway read one) and reads the body, bounded. ``admit(state, request, key,
model, stream, tokens)`` refuses what the ledger cannot record, applies the priority rules,
routes the model and passes the ``Gate``. Every refusal on the way is counted
(``thinkgate_requests_total``, and by kind for limits) and logged, as ``refused`` does.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.admission.budget import priority_of
from gateway.admission.gate import Ticket
from gateway.api.room import clamp, clamped_header, room_for
from gateway.api.screen import ignored_header
from gateway.auth.bearer import authenticate
from gateway.auth.keys import KeyInfo, Role
from gateway.edge.body import read_body
from gateway.errors import GatewayError, InvalidRequest, LedgerUnavailable
from gateway.exchange.lifecycle import Exchange, Forwarded
from gateway.exchange.screening import ScreenPlan, judge_prompt
from gateway.guard.judging import Rule, prompt_text, prompt_texts
from gateway.guard.prompt import PromptBlocked, screen_prompt
from gateway.guard.stream import ChoiceGuard
from gateway.ledger.record import CompletionRecord, check_recordable
from gateway.relay.effort import UPSTREAM_FIELD, plan
from gateway.relay.guarding import GuardAct, TextGuard
from gateway.relay.rewrite import Rewriter
from gateway.telemetry.logs import log_refusal
from gateway.telemetry.traceparent import parse_traceparent
from gateway.upstream.engine import Upstream

log = logging.getLogger("thinkgate")

# The API a path belongs to, as records and metrics name it (a fixed set: labels stay bounded).
ENDPOINTS = {
    "/v1/chat/completions": "chat.completions", "/v1/responses": "responses",
    "/v1/messages": "messages", "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}  # fmt: skip

if TYPE_CHECKING:  # the state is handed in; what it is made of is the lifespan's business
    from gateway.routes.state import AppState


async def receive(state: AppState, request: Request, role: Role) -> tuple[KeyInfo, bytes]:
    """The caller's key, then its body."""
    try:
        key = await authenticate(state.keys, authorization(request), role)
    except GatewayError as exc:  # counted and logged too: key guessing must leave a trace
        refused(state, request, None, exc, "unknown", stream=False)
        raise
    try:
        raw = await read_body(request, state.settings.max_body_bytes, state.settings.body_timeout_s)
    except GatewayError as exc:  # a body too large or too slow: the key's tenant is known
        refused(state, request, key, exc, "unknown", stream=False)
        raise
    return key, raw


async def admit(
    state: AppState, request: Request, key: KeyInfo, model: str, stream: bool, tokens: int
) -> tuple[Ticket, list[Upstream]]:
    """Everything that may refuse the request before any upstream is asked."""
    served = False  # a metrics label only for a model an upstream serves: labels stay bounded
    try:
        if not state.sink.accepting():
            raise LedgerUnavailable("The audit ledger cannot store records; try again later.")
        await state.sink.prepare(key.tenant)  # a record that could not be sealed: refused now
        ceiling = state.settings.priority_ceiling(key.key_id, key.tenant)
        priority = priority_of(request.headers.get("x-thinkgate-priority"), ceiling)
        candidates = await state.upstreams.route(model)
        served = True
        return await state.gate.admit(key, candidates, priority, tokens)
    except GatewayError as exc:
        refused(state, request, key, exc, model, stream, served=served)
        raise


class _Budgeted(Protocol):
    @property
    def model(self) -> str: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def n(self) -> int: ...
    @property
    def upstream_body(self) -> bytes: ...


C = TypeVar("C", bound=_Budgeted)


def authorization(request: Request) -> str | None:
    """The caller's ``Authorization`` header; under ``/v1/messages`` Anthropic's ``x-api-key``
    too (the ``anthropic`` SDK's way), as a bearer token."""
    header = request.headers.get("authorization")
    if header is None and request.url.path.startswith("/v1/messages"):
        api_key = request.headers.get("x-api-key")
        return f"Bearer {api_key}" if api_key else None
    return header


def budgeted(
    state: AppState, key: KeyInfo, call: C, relay: Rewriter, params: Mapping[str, Any]
) -> C:
    """The request with its reasoning budget (``gateway.relay.effort``) in place, from the chat
    ``params`` it asks upstream with: sent for the engine to keep, or given to the relay (one
    choice) for the gateway to keep; a ``thinking_token_budget`` nobody upstream keeps is
    removed. Raises ``InvalidRequest`` for an unknown effort or a bad budget: call it before
    admission."""
    settings = state.settings
    limit = call.max_tokens or settings.default_max_tokens
    rule = settings.reasoning_for(call.model).effort
    ceiling = settings.reasoning_ceiling(key.key_id)
    budget = plan(rule, params, limit, ceiling, thinking=relay.policy.thinking)
    if budget is not None and call.n == 1:
        relay.policy = dataclasses.replace(relay.policy, budget=budget, max_tokens=limit)
    if budget is None and UPSTREAM_FIELD not in params:
        return call
    body = orjson.loads(call.upstream_body)
    body = budget.upstream_fields(body) if budget is not None else _without_budget(body)
    return dataclasses.replace(call, upstream_body=orjson.dumps(body))  # type: ignore[type-var]


def _without_budget(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != UPSTREAM_FIELD}


class _Call(Forwarded, _Budgeted, Protocol):
    """A parsed request of any completion API, as the rest of the recipe needs it."""


K = TypeVar("K", bound=_Call)


async def forward(
    state: AppState, request: Request, key: KeyInfo, call: _Call, route: tuple[str, str],
    rewriter: Rewriter, started: tuple[float, float], *, tokens: int | None = None,
    after: Callable[[CompletionRecord], Awaitable[None]] | None = None,
    notes: tuple[tuple[str, str], ...] = (),
) -> Response:  # fmt: skip
    """The rest of every completion route's recipe, once its request is parsed and its
    rewriter built: admit (``tokens``, by default OpenAI's reservation rule), then the
    exchange, forwarded (``route``: endpoint and upstream path); ``notes`` are response
    headers the parse decided (``unknown_fields``)."""
    ex, candidates = await admitted(state, request, key, call, route, rewriter, started,
                                    tokens=tokens, after=after, notes=notes)  # fmt: skip
    return await state.forwarder.run(ex, candidates, request.receive)


async def admitted(
    state: AppState, request: Request, key: KeyInfo, call: _Call, route: tuple[str, str],
    rewriter: Rewriter, started: tuple[float, float], *, tokens: int | None = None,
    after: Callable[[CompletionRecord], Awaitable[None]] | None = None,
    notes: tuple[tuple[str, str], ...] = (),
) -> tuple[Exchange, list[Upstream]]:  # fmt: skip
    """``forward``'s first half: the admitted exchange and its candidates, for the caller to
    run (a background response runs it detached); its owner must finish it."""
    try:  # no byte of an answer goes out unless its record can be written
        check_recordable(call.messages, call.params)
        call, prompt_acts = guard_prompt(state, key, call, route[0])
        prompt_acts += await judge_the_prompt(state, key, call, route[0])
        call, clamped = await with_room(state, call)
    except GatewayError as exc:
        refused(state, request, key, exc, call.model, call.stream)
        raise
    notes = (*notes, *clamped)
    if tokens is None:
        tokens = reservation(state, call.upstream_body, call.n, call.max_tokens)
    admitting = time.time()
    ticket, candidates = await admit(state, request, key, call.model, call.stream, tokens)
    ex = exchange(state, request, key, call, route, rewriter, ticket, started, after)
    if ex.span is not None:
        ex.span.admission(admitting, time.time())
    ex.notes = notes
    ex.prompt_acts = prompt_acts
    ex.screen = screen_plan(state, key, call, route)
    return ex, candidates


def guard_prompt(
    state: AppState, key: KeyInfo, call: K, endpoint: str
) -> tuple[K, tuple[GuardAct, ...]]:
    """The request as the guardrail policies whose scope has ``prompt`` leave it (redacted
    for the engine, and for the record where ``targets`` has ``ledger``), and what they did;
    a ``block`` refuses it here, before any engine is asked (docs/guardrails.md)."""
    policies = [p for p in state.guardrails.select(key.tenant, call.model)
                if "prompt" in p.channels]  # fmt: skip
    if not policies or endpoint == "embeddings":
        return call, ()
    try:
        screened = screen_prompt(policies, orjson.loads(call.upstream_body), call.messages)
    except PromptBlocked as exc:
        raise _prompt_refused(state, exc) from None
    if not screened.acts:
        return call, ()
    changed = dataclasses.replace(call, upstream_body=orjson.dumps(screened.body),  # type: ignore[type-var]
                                  messages=screened.messages)  # fmt: skip
    return changed, screened.acts


def _prompt_refused(state: AppState, exc: PromptBlocked) -> InvalidRequest:
    state.metrics.guardrail_acted(exc.policy, "block", "prompt")
    found = (f"a guard model ({exc.detector.removeprefix('model:')}) judged it unsafe"
             if exc.detector.startswith("model:")
             else f"it holds a match of the {exc.detector} detector")  # fmt: skip
    return InvalidRequest(f"The guardrail policy {exc.policy!r} refused this request's prompt: "
                          f"{found}.", param="messages", code="guardrail_blocked")  # fmt: skip


def _judges(state: AppState, key: KeyInfo, model: str, endpoint: str,
            channels: frozenset[str]) -> tuple[Rule, ...]:  # fmt: skip
    """The guard models of the policies over ``channels`` that apply to this request."""
    if state.guard_models is None or endpoint == "embeddings":
        return ()
    return tuple((p, judge) for p in state.guardrails.select(key.tenant, model)
                 if p.channels & channels for judge in p.judges)  # fmt: skip


async def judge_the_prompt(
    state: AppState, key: KeyInfo, call: Forwarded, endpoint: str
) -> tuple[GuardAct, ...]:
    """What the guard models of policies over the prompt did; a ``block`` refuses it."""
    rules = _judges(state, key, call.model, endpoint, frozenset({"prompt"}))
    if not rules:
        return ()
    assert state.guard_models is not None
    try:
        return await judge_prompt(rules, prompt_texts(orjson.loads(call.upstream_body)),
                                  state.guard_models)  # fmt: skip
    except PromptBlocked as exc:
        raise _prompt_refused(state, exc) from None


def screen_plan(state: AppState, key: KeyInfo, call: Forwarded, route: tuple[str, str]
                ) -> ScreenPlan | None:  # fmt: skip
    """The guard models over this request's reasoning and answer, if any apply."""
    rules = _judges(state, key, call.model, route[0], frozenset({"reasoning", "answer"}))
    if not rules:
        return None
    assert state.guard_models is not None
    prompt = prompt_text(orjson.loads(call.upstream_body))
    return ScreenPlan(rules, prompt, state.guard_models, route[1] == "/completions")


async def with_room(state: AppState, call: C) -> tuple[C, tuple[tuple[str, str], ...]]:
    """The request with its ``max_tokens`` clamped to the room the engine's context leaves
    after its prompt (``gateway.api.room``), and the header that says so; refused instead in
    strict mode (``UNKNOWN_FIELDS=refuse``)."""
    asked = call.max_tokens
    if asked is None:
        return call, ()
    context = await state.upstreams.context_length(call.model)
    room = room_for(context, call.upstream_body)
    if room is None or context is None or asked <= room:
        return call, ()
    strict = state.settings.unknown_fields == "refuse"
    body = clamp(call.upstream_body, asked, room, strict=strict)
    changed = dataclasses.replace(call, upstream_body=body, max_tokens=room)  # type: ignore[type-var]
    return changed, (clamped_header(asked, room, context),)


def unknown_fields(state: AppState, endpoint: str, names: tuple[str, ...]) -> tuple[
        tuple[str, str], ...]:  # fmt: skip
    """Report the fields no reference names that a request sent (``UNKNOWN_FIELDS=ignore``):
    counted by name, each name logged the first time this process sees it, named in the
    response's ``x-thinkgate-ignored`` header (returned)."""
    if not names:
        return ()
    for name in state.metrics.unknown(endpoint, names):
        log.info("unknown request field %r on %s accepted (UNKNOWN_FIELDS=ignore): named in "
                 "x-thinkgate-ignored; counted in thinkgate_unknown_fields_total", name,
                 endpoint)  # fmt: skip
    return ignored_header(names)


def guard_for(state: AppState, key: KeyInfo, model: str) -> Callable[[], TextGuard] | None:
    """A new guard per choice when ``GUARDRAILS_FILE``'s policies select this key's tenant
    and ``model``; ``None`` (no guard, the relay's fast paths) otherwise."""
    policies = [p for p in state.guardrails.select(key.tenant, model)
                if p.channels & {"reasoning", "answer"}]  # fmt: skip
    return functools.partial(ChoiceGuard, policies) if policies else None


def claimed_model(raw: bytes) -> str:
    """The model a refused body names, for the log line that says what was refused (the
    metrics label stays ``unknown``: it is not a model an upstream serves)."""
    try:
        model = orjson.loads(raw).get("model")
    except (orjson.JSONDecodeError, AttributeError):
        return "unknown"
    return model[:256] if isinstance(model, str) and model else "unknown"


def reservation(state: AppState, upstream_body: bytes, n: int, max_tokens: int | None) -> int:
    """OpenAI's reservation rule: prompt estimate (bytes / 4) + max_tokens, per choice."""
    return len(upstream_body) // 4 + n * (max_tokens or state.settings.default_max_tokens)


def exchange(
    state: AppState, request: Request, key: KeyInfo, call: Forwarded, route: tuple[str, str],
    rewriter: Rewriter, ticket: Ticket, started: tuple[float, float],
    after: Callable[[CompletionRecord], Awaitable[None]] | None = None,
) -> Exchange:  # fmt: skip
    """The exchange of an admitted request: ``route`` is (endpoint, upstream path), ``started``
    (wall clock, perf counter) when the request arrived."""
    endpoint, path = route
    traceparent = parse_traceparent(request.headers.get("traceparent"))
    span = None
    if state.tracing is not None:
        span = state.tracing.start(request_id=request.state.request_id, operation=endpoint,
                                   model=call.model, started_at=started[0],
                                   traceparent=traceparent)  # fmt: skip
    return Exchange(request.state.request_id, key, call, endpoint, path, rewriter, ticket,
                    state.gate, state.sink, started_at=started[0], t0=started[1],
                    metrics=state.metrics if state.instrument else None,
                    traceparent=traceparent, after=after, span=span)  # fmt: skip


def refused(
    state: AppState, request: Request, key: KeyInfo | None, error: GatewayError, model: str,
    stream: bool, *, served: bool = False,
) -> None:  # fmt: skip
    """Count and log a refusal. The log line names the model asked for; the metrics label
    only one an upstream serves (``unknown`` otherwise)."""
    tenant, key_id = (key.tenant, key.key_id) if key is not None else ("unknown", "")
    endpoint = ENDPOINTS.get(request.url.path, "other")
    state.metrics.refused(error, model if served else "unknown", tenant, stream, endpoint)
    traceparent = parse_traceparent(request.headers.get("traceparent"))
    log_refusal(request.state.request_id, tenant, key_id, model, error.outcome, error.code,
                traceparent, endpoint=endpoint, param=error.param)  # fmt: skip
