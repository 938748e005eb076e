"""The pipeline: the steps every completion route shares before and around its exchange
(sans the API's own parsing), as one object the lifespan builds from the components they use.

``receive(request, role)`` authenticates (before any body is read: a caller without a key
cannot make the gateway read one) and reads the body, bounded. ``admit(request, key, model,
stream, tokens)`` refuses what the ledger cannot record, applies the priority rules, routes the
model and passes the ``Gate``. ``forward`` runs the rest: the prompt's guardrails, the room the
context leaves, admission, the exchange. ``policy`` builds a request's rewriter policy, the one
way every API does. Every refusal on the way is counted (``thinkgate_requests_total``, and by
kind for limits) and logged, as ``refused`` does. A route (``gateway.routes``) is a short recipe
over these steps; the pipeline sees its settings section (``PipelineSettings``), never the
whole ``Settings``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.admission.budget import priority_of
from gateway.admission.gate import Gate, Ticket
from gateway.admission.spending import Spending
from gateway.api.room import clamp, clamped_header, room_for
from gateway.api.screen import ignored_header
from gateway.auth.bearer import authenticate
from gateway.auth.keys import KeyInfo, Role
from gateway.auth.keystore import KeyStore
from gateway.batch.lines import ORIGIN, BatchOrigin
from gateway.cache.salt import client_salt, salted
from gateway.edge.body import read_body
from gateway.errors import AuthError, GatewayError, InvalidRequest, LedgerUnavailable
from gateway.exchange.forward import Forwarder
from gateway.exchange.lifecycle import Exchange, Forwarded
from gateway.exchange.screening import ScreenPlan, judge_prompt
from gateway.guard.judging import Rule, prompt_text, prompt_texts
from gateway.guard.policy import NONE as NO_GUARDRAILS
from gateway.guard.policy import Guardrails
from gateway.guard.prompt import PromptBlocked, screen_prompt
from gateway.guard.stream import ChoiceGuard
from gateway.ledger.record import CompletionRecord, RecordSink, recordable
from gateway.relay.effort import UPSTREAM_FIELD, plan
from gateway.relay.formats import ReasoningFormat
from gateway.relay.guarding import GuardAct, TextGuard
from gateway.relay.rewrite import Policy, Rewriter
from gateway.settings import PipelineSettings
from gateway.spend.prices import Prices
from gateway.telemetry.logs import log_refusal
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.traceparent import parse_traceparent
from gateway.upstream.engine import Upstream
from gateway.upstream.judge import GuardModels
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.router import Router, session_of
from ratelimit.fairness import Priority

if TYPE_CHECKING:  # the OpenTelemetry SDK only where tracing is configured
    from gateway.telemetry.spans import Tracing

log = logging.getLogger("thinkgate")

# The API a path belongs to, as records and metrics name it (a fixed set: labels stay bounded).
ENDPOINTS = {
    "/v1/chat/completions": "chat.completions", "/v1/responses": "responses",
    "/v1/messages": "messages", "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}  # fmt: skip


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


def _without_budget(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != UPSTREAM_FIELD}


class _Call(Forwarded, _Budgeted, Protocol):
    """A parsed request of any completion API, as the rest of the recipe needs it."""


K = TypeVar("K", bound=_Call)


def claimed_model(raw: bytes) -> str:
    """The model a refused body names, for the log line that says what was refused (the
    metrics label stays ``unknown``: it is not a model an upstream serves)."""
    try:
        model = orjson.loads(raw).get("model")
    except (orjson.JSONDecodeError, AttributeError):
        return "unknown"
    return model[:256] if isinstance(model, str) and model else "unknown"


@dataclasses.dataclass(frozen=True, slots=True)
class Pipeline:
    """The shared steps, with what they use."""

    settings: PipelineSettings
    keys: KeyStore
    sink: RecordSink
    upstreams: UpstreamPool
    gate: Gate
    forwarder: Forwarder
    metrics: Metrics
    instrument: bool = True  # measure each request (off only in benchmarks of the metrics)
    guardrails: Guardrails = NO_GUARDRAILS  # GUARDRAILS_FILE's policies
    guard_models: GuardModels | None = None
    tracing: Tracing | None = None
    router: Router | None = None  # which engine first (ROUTING); None: the least loaded
    # PRICES_FILE's prices, and whether a model they do not price is refused (UNPRICED_MODELS)
    prices: Prices | None = None
    refuse_unpriced: bool = True
    spending: Spending | None = None  # budgets in money, with PRICES_FILE

    def policy(
        self, key: KeyInfo, model: str, *, thinking_params: Mapping[str, Any] | None = None,
        wants_reasoning: bool = True, include_usage: bool = False, repair_leak: bool = False,
        choices: int = 1, opened: ReasoningFormat | None = None, guarded: bool = True,
    ) -> Policy:  # fmt: skip
        """A request's rewriter policy: the model's reasoning format and source, thinking as
        the request's ``thinking_params`` switch it, reasoning shown only to a key allowed to
        see it that ``wants_reasoning``, the guardrail policies that select the key's tenant
        and the model. ``opened``: the format as a raw prompt leaves it (legacy completions:
        the gateway splits the text, thinking where the format splits)."""
        reasoning = self.settings.reasoning_for(model)
        fmt = reasoning.format if opened is None else opened
        return Policy(
            format=fmt,
            source=reasoning.source if opened is None else "text",
            thinking=fmt.thinking(thinking_params or {}) if opened is None else fmt.splits,
            show_reasoning=key.reasoning == "visible" and wants_reasoning,
            reasoning_field=self.settings.reasoning_field,
            include_usage=include_usage,
            repair_leak=repair_leak,
            guard=self.guard_for(key, model) if guarded else None,
            choices=choices,
        )

    async def receive(self, request: Request, role: Role) -> tuple[KeyInfo, bytes]:
        """The caller's key, then its body (a batch line's: its batch's key and its body)."""
        origin: BatchOrigin | None = request.scope.get(ORIGIN)
        if origin is not None:
            return await self._batch_key(request, origin), origin.body
        try:
            key = await authenticate(self.keys, authorization(request), role)
        except GatewayError as exc:  # counted and logged too: key guessing must leave a trace
            self.refused(request, None, exc, "unknown", stream=False)
            raise
        try:
            limits = self.settings
            raw = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
        except GatewayError as exc:  # a body too large or too slow: the key's tenant is known
            self.refused(request, key, exc, "unknown", stream=False)
            raise
        return key, raw

    async def _batch_key(self, request: Request, origin: BatchOrigin) -> KeyInfo:
        key = await self.keys.get(origin.key_id)
        if key is None or not key.active:
            exc = AuthError("The API key that created this batch was revoked.")
            self.refused(request, key, exc, "unknown", stream=False)
            raise exc
        return key

    async def admit(
        self, request: Request, key: KeyInfo, call: _Call, path: str, tokens: int
    ) -> tuple[Ticket, list[Upstream], tuple[tuple[str, str], ...]]:
        """Everything that may refuse the request before any upstream is asked (its budgets
        included), the engines to ask in the router's order (``path``: the upstream path), and
        the header that says why the first one (``x-thinkgate-route``)."""
        served = False  # a metrics label only for a model an upstream serves: labels stay bounded
        model = call.model
        try:
            if self.prices is not None and self.refuse_unpriced and not self.prices.of(model):
                raise InvalidRequest(f"The model '{model}' has no price here: PRICES_FILE "
                                     "names the models this gateway serves at a cost.",
                                     param="model", code="model_not_priced")  # fmt: skip
            if not self.sink.accepting():
                raise LedgerUnavailable("The audit ledger cannot store records; try again later.")
            await self.sink.prepare(key.tenant)  # a record that could not be sealed: refused now
            ceiling = self.settings.priority_ceiling(key.key_id, key.tenant)
            priority = priority_of(request.headers.get("x-thinkgate-priority"), ceiling)
            candidates = await self.upstreams.route(model)
            served = True
            preferred, said = 0, cast(tuple[tuple[str, str], ...], ())
            if self.router is not None:
                session = session_of(request.headers.get("x-session-id"), call.params)
                routed = await self.router.order(candidates, call.upstream_body, path, session)
                candidates, preferred = routed.candidates, routed.preferred
                said = (("x-thinkgate-route", routed.header()),)
                self.metrics.routing.labels(routed.reason).inc()
            ticket, ordered = await self._admitted(key, call, candidates, priority, tokens,
                                                   preferred)  # fmt: skip
            return ticket, ordered, said
        except GatewayError as exc:
            self.refused(request, key, exc, model, call.stream, served=served)
            raise

    async def _admitted(
        self, key: KeyInfo, call: _Call, candidates: list[Upstream], priority: Priority,
        tokens: int, preferred: int,
    ) -> tuple[Ticket, list[Upstream]]:  # fmt: skip
        """The gate's admission, with the request's most expensive outcome reserved against
        its key's and tenant's budgets in the rate limits' own call
        (``gateway.admission.spending``): 429 ``budget_exceeded`` over one."""
        spend = None
        if self.spending is not None:  # the TPM reservation's split: its prompt, the rest output
            prompt = len(call.upstream_body) // 4  # (an embedding reserves one output token)
            spend = await self.spending.ask(key, call.model, prompt, max(tokens - prompt, 0))
        return await self.gate.admit(key, candidates, priority, tokens, preferred, spend)

    def budgeted(self, key: KeyInfo, call: C, relay: Rewriter, params: Mapping[str, Any]) -> C:
        """The request with its reasoning budget (``gateway.relay.effort``) in place, from the chat
        ``params`` it asks upstream with: sent for the engine to keep, or given to the relay (one
        choice) for the gateway to keep; a ``thinking_token_budget`` nobody upstream keeps is
        removed. Raises ``InvalidRequest`` for an unknown effort or a bad budget: call it before
        admission."""
        settings = self.settings
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

    async def forward(
        self, request: Request, key: KeyInfo, call: _Call, route: tuple[str, str],
        rewriter: Rewriter, started: tuple[float, float], *, tokens: int | None = None,
        after: Callable[[CompletionRecord], Awaitable[None]] | None = None,
        notes: tuple[tuple[str, str], ...] = (),
    ) -> Response:  # fmt: skip
        """The rest of every completion route's recipe, once its request is parsed and its
        rewriter built: admit (``tokens``, by default OpenAI's reservation rule), then the
        exchange, forwarded (``route``: endpoint and upstream path); ``notes`` are response
        headers the parse decided (``unknown_fields``)."""
        ex, candidates = await self.admitted(request, key, call, route, rewriter, started,
                                        tokens=tokens, after=after, notes=notes)  # fmt: skip
        return await self.forwarder.run(ex, candidates, request.receive)

    async def admitted(
        self, request: Request, key: KeyInfo, call: _Call, route: tuple[str, str],
        rewriter: Rewriter, started: tuple[float, float], *, tokens: int | None = None,
        after: Callable[[CompletionRecord], Awaitable[None]] | None = None,
        notes: tuple[tuple[str, str], ...] = (),
    ) -> tuple[Exchange, list[Upstream]]:  # fmt: skip
        """``forward``'s first half: the admitted exchange and its candidates, for the caller to
        run (a background response runs it detached); its owner must finish it."""
        try:  # no byte of an answer goes out unless its record can be written
            part = recordable(call.messages, call.params)
            call, prompt_acts = self.guard_prompt(key, call, route[0])
            prompt_acts += await self.judge_the_prompt(key, call, route[0])
            call, clamped = await self.with_room(call)
            call = self.salted(key, call, route[0])
            part = part.of(call.messages, call.params)  # encoded again only if a step changed it
        except GatewayError as exc:
            self.refused(request, key, exc, call.model, call.stream)
            raise
        notes = (*notes, *clamped)
        if tokens is None:
            tokens = self.reservation(call.upstream_body, call.n, call.max_tokens)
        admitting = time.time()
        ticket, candidates, said = await self.admit(request, key, call, route[1], tokens)
        ex = self.exchange(request, key, call, route, rewriter, ticket, started, after)
        if ex.span is not None:
            ex.span.admission(admitting, time.time())
        ex.notes = (*notes, *said)
        ex.prompt_acts = prompt_acts
        ex.request_part = part
        ex.screen = self.screen_plan(key, call, route)
        return ex, candidates

    def salted(self, key: KeyInfo, call: K, endpoint: str) -> K:
        """The request with its tenant's ``cache_salt`` (``gateway.cache.salt``), so its
        prefix-cache entries are its tenant's alone; embeddings have no prefix to share."""
        if self.router is None or endpoint == "embeddings":
            return call
        body = call.upstream_body
        salt = self.router.salt(key.tenant, client_salt(body))
        return dataclasses.replace(call, upstream_body=salted(body, salt))  # type: ignore[type-var]

    def guard_prompt(self, key: KeyInfo, call: K, endpoint: str) -> tuple[K, tuple[GuardAct, ...]]:
        """The request as the guardrail policies whose scope has ``prompt`` leave it (redacted
        for the engine, and for the record where ``targets`` has ``ledger``), and what they did;
        a ``block`` refuses it here, before any engine is asked (docs/guardrails.md)."""
        policies = [p for p in self.guardrails.select(key.tenant, call.model)
                    if "prompt" in p.channels]  # fmt: skip
        if not policies or endpoint == "embeddings":
            return call, ()
        try:
            screened = screen_prompt(policies, orjson.loads(call.upstream_body), call.messages)
        except PromptBlocked as exc:
            raise self._prompt_refused(exc) from None
        if not screened.acts:
            return call, ()
        changed = dataclasses.replace(call, upstream_body=orjson.dumps(screened.body),  # type: ignore[type-var]
                                      messages=screened.messages)  # fmt: skip
        return changed, screened.acts

    def _prompt_refused(self, exc: PromptBlocked) -> InvalidRequest:
        self.metrics.guardrail_acted(exc.policy, "block", "prompt")
        found = (f"a guard model ({exc.detector.removeprefix('model:')}) judged it unsafe"
                 if exc.detector.startswith("model:")
                 else f"it holds a match of the {exc.detector} detector")  # fmt: skip
        return InvalidRequest(f"The guardrail policy {exc.policy!r} refused this request's prompt: "
                              f"{found}.", param="messages", code="guardrail_blocked")  # fmt: skip

    def _judges(self, key: KeyInfo, model: str, endpoint: str,
                channels: frozenset[str]) -> tuple[Rule, ...]:  # fmt: skip
        """The guard models of the policies over ``channels`` that apply to this request."""
        if self.guard_models is None or endpoint == "embeddings":
            return ()
        return tuple((p, judge) for p in self.guardrails.select(key.tenant, model)
                     if p.channels & channels for judge in p.judges)  # fmt: skip

    async def judge_the_prompt(
        self, key: KeyInfo, call: Forwarded, endpoint: str
    ) -> tuple[GuardAct, ...]:
        """What the guard models of policies over the prompt did; a ``block`` refuses it."""
        rules = self._judges(key, call.model, endpoint, frozenset({"prompt"}))
        if not rules:
            return ()
        assert self.guard_models is not None
        try:
            return await judge_prompt(rules, prompt_texts(orjson.loads(call.upstream_body)),
                                      self.guard_models)  # fmt: skip
        except PromptBlocked as exc:
            raise self._prompt_refused(exc) from None

    def screen_plan(self, key: KeyInfo, call: Forwarded, route: tuple[str, str]
                    ) -> ScreenPlan | None:  # fmt: skip
        """The guard models over this request's reasoning and answer, if any apply."""
        rules = self._judges(key, call.model, route[0], frozenset({"reasoning", "answer"}))
        if not rules:
            return None
        assert self.guard_models is not None
        prompt = prompt_text(orjson.loads(call.upstream_body))
        return ScreenPlan(rules, prompt, self.guard_models, route[1] == "/completions")

    async def with_room(self, call: C) -> tuple[C, tuple[tuple[str, str], ...]]:
        """The request with its ``max_tokens`` clamped to the room the engine's context leaves
        after its prompt (``gateway.api.room``), and the header that says so; refused instead in
        strict mode (``UNKNOWN_FIELDS=refuse``)."""
        asked = call.max_tokens
        if asked is None:
            return call, ()
        context = await self.upstreams.context_length(call.model)
        room = room_for(context, call.upstream_body)
        if room is None or context is None or asked <= room:
            return call, ()
        strict = self.settings.unknown_fields == "refuse"
        body = clamp(call.upstream_body, asked, room, strict=strict)
        changed = dataclasses.replace(call, upstream_body=body, max_tokens=room)  # type: ignore[type-var]
        return changed, (clamped_header(asked, room, context),)

    def unknown_fields(self, endpoint: str, names: tuple[str, ...]) -> tuple[
            tuple[str, str], ...]:  # fmt: skip
        """Report the fields no reference names that a request sent (``UNKNOWN_FIELDS=ignore``):
        counted by name, each name logged the first time this process sees it, named in the
        response's ``x-thinkgate-ignored`` header (returned)."""
        if not names:
            return ()
        for name in self.metrics.unknown(endpoint, names):
            log.info("unknown request field %r on %s accepted (UNKNOWN_FIELDS=ignore): named in "
                     "x-thinkgate-ignored; counted in thinkgate_unknown_fields_total", name,
                     endpoint)  # fmt: skip
        return ignored_header(names)

    def guard_for(self, key: KeyInfo, model: str) -> Callable[[], TextGuard] | None:
        """A new guard per choice when ``GUARDRAILS_FILE``'s policies select this key's tenant
        and ``model``; ``None`` (no guard, the relay's fast paths) otherwise."""
        policies = [p for p in self.guardrails.select(key.tenant, model)
                    if p.channels & {"reasoning", "answer"}]  # fmt: skip
        return functools.partial(ChoiceGuard, policies) if policies else None

    def reservation(self, upstream_body: bytes, n: int, max_tokens: int | None) -> int:
        """OpenAI's reservation rule: prompt estimate (bytes / 4) + max_tokens, per choice."""
        return len(upstream_body) // 4 + n * (max_tokens or self.settings.default_max_tokens)

    def exchange(
        self, request: Request, key: KeyInfo, call: Forwarded, route: tuple[str, str],
        rewriter: Rewriter, ticket: Ticket, started: tuple[float, float],
        after: Callable[[CompletionRecord], Awaitable[None]] | None = None,
    ) -> Exchange:  # fmt: skip
        """The exchange of an admitted request: ``route`` is (endpoint, upstream path), ``started``
        (wall clock, perf counter) when the request arrived."""
        endpoint, path = route
        traceparent = parse_traceparent(request.headers.get("traceparent"))
        span = None
        if self.tracing is not None:
            span = self.tracing.start(request_id=request.state.request_id, operation=endpoint,
                                       model=call.model, started_at=started[0],
                                       traceparent=traceparent)  # fmt: skip
        origin: BatchOrigin | None = request.scope.get(ORIGIN)
        return Exchange(request.state.request_id, key, call, endpoint, path, rewriter, ticket,
                        self.gate, self.sink, started_at=started[0], t0=started[1],
                        metrics=self.metrics if self.instrument else None,
                        traceparent=traceparent, after=after, span=span,
                        batch=None if origin is None else (origin.batch_id,
                                                           origin.custom_id),
                        prices=self.prices)  # fmt: skip

    def refused(
        self, request: Request, key: KeyInfo | None, error: GatewayError, model: str,
        stream: bool, *, served: bool = False,
    ) -> None:  # fmt: skip
        """Count and log a refusal. The log line names the model asked for; the metrics label
        only one an upstream serves (``unknown`` otherwise)."""
        tenant, key_id = (key.tenant, key.key_id) if key is not None else ("unknown", "")
        endpoint = ENDPOINTS.get(request.url.path, "other")
        self.metrics.refused(error, model if served else "unknown", tenant, stream, endpoint)
        traceparent = parse_traceparent(request.headers.get("traceparent"))
        log_refusal(request.state.request_id, tenant, key_id, model, error.outcome, error.code,
                    traceparent, endpoint=endpoint, param=error.param)  # fmt: skip
