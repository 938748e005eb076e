"""The app factory. ``create_app(settings)`` builds a FastAPI app whose lifespan owns every
dependency (upstream connection pool, database engine, key store, limiter, the audit ledger and
its sink, metrics registry, and in demo mode the embedded simulator). Nothing happens at import
time. A ``sink`` passed in replaces the ledger (tests that inspect records, relay benchmarks).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from audit import migrate as audit_migrate
from audit import timestamps as audit_timestamps
from audit.crypto import ReloadingKeyProvider
from audit.datakeys import DataKeys
from audit.ledger import Ledger
from audit.sqlasync import AsyncEngine
from gateway.admission.budget import KVAdmission, open_admission
from gateway.admission.circuit import Circuit
from gateway.admission.limiter import Limiter
from gateway.admission.ratelimits import KeyLimiter, open_limiter
from gateway.admission.redisconn import open_redis
from gateway.admission.spending import BudgetBook, Spending
from gateway.auth.keystore import KeyStore
from gateway.batch.files import FileStore
from gateway.batch.store import BatchStore
from gateway.conversation.background import BackgroundStore
from gateway.conversation.conversations import ConversationStore
from gateway.conversation.sealing import ReasoningSealer
from gateway.conversation.store import ResponseStore
from gateway.db import DatabaseHealth, create_engine, upgrade_schema
from gateway.edge.frontdoor import FrontDoor, internal_error, shaped
from gateway.edge.servers import BackgroundServer
from gateway.errors import GatewayError, InvalidRequest, NotFound, RouteError
from gateway.guard.policy import NONE as NO_GUARDRAILS
from gateway.guard.policy import Guardrails
from gateway.guard.policy import load as load_guardrails
from gateway.ledger.intents import keep_forever
from gateway.ledger.record import RecordSink
from gateway.ledger.retaining import retain_forever
from gateway.ledger.sink import LedgerSink, ensure_keys, open_ledger
from gateway.ledger.timestamping import Timestamping
from gateway.ledger.witnessing import Witnessing
from gateway.routes import (
    admin,
    auditor,
    batches,
    budgets,
    chat,
    completions,
    conversations,
    health,
    messages,
    models,
    records,
    responses,
    tlog,
)
from gateway.routes.health import metrics_app
from gateway.routes.state import AppState
from gateway.settings import ModelOverride, Settings
from gateway.side import console
from gateway.side.siem.exporter import create_exporter
from gateway.spend.budgets import MoneyBudget
from gateway.spend.prices import Prices, load_prices
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import open_tracing
from gateway.upstream.judge import GuardModels
from gateway.upstream.pool import UpstreamPool, create_transport
from gateway.upstream.router import Router
from ratelimit.limits import MemoryBackend, RateLimitBackend

if TYPE_CHECKING:  # redis-py only where a client is made (REDIS_URL)
    from ratelimit.autopipe import AutoPipeline

log = logging.getLogger("thinkgate")
# The young generation is collected once this many more container objects were made than freed
# (CPython's default is 700). A request frees what it made as it ends (no reference cycles:
# tests/e2e/test_garbage.py), so at 700 the collector ran every few milliseconds under load
# over the in-flight requests' live objects, finding nothing: 5 % of a busy process's CPU
# (bench/RESULTS.md). At this threshold it runs when garbage does pile up (an error's
# traceback cycle), a few MB at most.
GC_YOUNG_THRESHOLD = 10_000


def create_app(
    settings: Settings,
    *,
    limiter: Limiter | None = None,
    sink: RecordSink | None = None,
    freeze_gc: bool = False,
    instrument: bool = True,
) -> FrontDoor:
    """The gateway as an ASGI app. ``freeze_gc`` (for the process that serves, not for tests):
    after start-up, move every object alive into the GC's permanent generation, so the
    collector stops rescanning the framework's hundreds of thousands of long-lived objects,
    and collect the young generation less often (``GC_YOUNG_THRESHOLD``).
    ``instrument=False`` (benchmarks only, like ``sink``): requests are not measured, so the
    cost of metrics can be measured against the gateway without them."""

    database = DatabaseHealth()  # the key store's and the error handlers' view of it

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            redis = open_redis(settings.admission)
            if redis is not None:  # closed last, once nothing uses it any more
                stack.push_async_callback(redis.aclose)
            limits = limiter or open_limiter(settings.admission, redis)
            state = await _start(stack, settings, limits, sink, redis, database)
            app.state.tg = state = dataclasses.replace(state, instrument=instrument)
            _run_batches(stack, state, app)
            if settings.metrics_port:
                server = BackgroundServer(metrics_app(state), settings.host,
                                          settings.metrics_port, reuse_port=True)  # fmt: skip
                await stack.enter_async_context(server)
            if freeze_gc:
                gc.collect()
                gc.freeze()
                gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
            yield

    app = FastAPI(
        title="thinkgate",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    unexpected = _error_handlers(app, database)
    _routes(app, settings)
    lanes = {("POST", "/v1/chat/completions"): chat.chat_completions,
             ("POST", "/v1/completions"): completions.create_completion,
             ("POST", "/v1/responses"): responses.create_response,
             ("POST", "/v1/messages"): messages.create_message}  # fmt: skip
    return FrontDoor(app, lanes, settings.max_header_bytes, unexpected)


def _error_handlers(
    app: FastAPI, database: DatabaseHealth
) -> Callable[[Exception, str], GatewayError]:
    """Every error in its endpoint's shape; what the front door makes of an unexpected one."""
    app.add_exception_handler(GatewayError, _gateway_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]

    def unexpected(exc: Exception, request_id: str) -> GatewayError:
        return database.translate(exc) or internal_error(exc, request_id)

    async def database_error(request: Request, exc: Exception) -> Response:
        # here, not under ``Exception``: Starlette re-raises what that handler was given, and
        # the server would log a traceback per request of an outage
        return _shaped(request, unexpected(exc, request.state.request_id))

    for kind in (SQLAlchemyError, OSError, TimeoutError):
        app.add_exception_handler(kind, database_error)
    app.add_exception_handler(Exception, _internal_error)
    return unexpected


def _routes(app: FastAPI, settings: Settings) -> None:
    for module in (chat, models, responses, conversations, batches, messages, completions,
                   health, admin, budgets, auditor, records, tlog):  # fmt: skip
        module.add_routes(app)
    if settings.console_enabled:
        console.add_routes(app)


# How the demo's simulated models send their reasoning (gateway.side.sim.config): the separating
# one as vLLM with --reasoning-parser does, the others with their family's markers in the text.
DEMO_MODELS = {
    "deepseek-r1-parsed": ModelOverride(reasoning_source="upstream"),
    "qwq-32b": ModelOverride(reasoning_parser="think_tags"),
    "deepseek-v3": ModelOverride(reasoning_parser="none"),
    "qwen3": ModelOverride(reasoning_parser="qwen3"),
    "kimi-k3": ModelOverride(reasoning_parser="kimi_k3"),
    "minimax-m2": ModelOverride(reasoning_parser="minimax_m2"),
}


def _guardrails(stack: contextlib.AsyncExitStack, settings: Settings, metrics: Metrics
                ) -> tuple[Guardrails, GuardModels | None]:  # fmt: skip
    """``GUARDRAILS_FILE``'s policies, and a client for their guard models if they have any."""
    if settings.guardrails_file is None:
        return NO_GUARDRAILS, None
    guardrails = load_guardrails(settings.guardrails_file)
    if not any(policy.judges for policy in guardrails.policies):
        return guardrails, None
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=256))
    stack.push_async_callback(client.aclose)
    return guardrails, GuardModels(client, metrics)


def _siem(stack: contextlib.AsyncExitStack, settings: Settings, engine: AsyncEngine,
          metrics: Metrics, ledger: Ledger | None) -> None:  # fmt: skip
    """The SIEM export (``gateway.side.siem``) on a task of its own, when a sink is configured and
    this app writes the ledger; cancelled (releasing its lease) before its sinks close."""
    exporter = None if ledger is None else create_exporter(settings.siem, engine, metrics)
    if exporter is not None:
        stack.push_async_callback(exporter.aclose)
        task = asyncio.create_task(exporter.run())
        stack.push_async_callback(_cancel, task)


def _ledger_rounds(stack: contextlib.AsyncExitStack, settings: Settings, ledger: Ledger
                   ) -> list[Coroutine[Any, Any, None]]:  # fmt: skip
    """What a ledger does on an interval: retention, and timestamping and witnessing of its
    checkpoints when configured."""
    rounds = [retain_forever(ledger, settings.retention_days, settings.retention_interval_s)]
    every = settings.checkpoint_interval_ms > 0  # each checkpoint stamped and witnessed
    if settings.tsa_url:
        roots = (audit_timestamps.load_roots(settings.tsa_roots_file.read_bytes())
                 if settings.tsa_roots_file else [])  # fmt: skip
        tsa_client = httpx.AsyncClient(timeout=10)
        stack.push_async_callback(tsa_client.aclose)
        rounds.append(Timestamping(ledger, settings.tsa_url, roots, settings.tsa_interval_s,
                                   tsa_client, every_checkpoint=every).run())  # fmt: skip
    if settings.witnesses:
        witness_client = httpx.AsyncClient(timeout=10)
        stack.push_async_callback(witness_client.aclose)
        witnessing = Witnessing(ledger, settings.witnesses, settings.witness_interval_s,
                                witness_client, stamped=bool(settings.tsa_url),
                                every_checkpoint=every)  # fmt: skip
        rounds.append(witnessing.run())
    return rounds


def _intent_keeping(settings: Settings, sink: RecordSink | None,
                    metrics: Metrics) -> list[Coroutine[Any, Any, None]]:  # fmt: skip
    """The heartbeat, the running exchanges' progress and the sweep of lost intents
    (``gateway.ledger.intents``), with the ledger's sink; beats four times per stale time, at
    most a second apart, as background responses do."""
    if not isinstance(sink, LedgerSink):
        return []
    stale, lost = settings.background_stale_s, metrics.ledger_replica_lost.inc
    return [keep_forever(sink.ledger, sink.running, stale, min(1.0, stale / 4), lost)]


async def _start(
    stack: contextlib.AsyncExitStack,
    settings: Settings,
    limiter: Limiter,
    sink: RecordSink | None,
    redis: AutoPipeline | None,
    database: DatabaseHealth,
) -> AppState:
    if settings.demo and not settings.upstreams:
        settings = await _demo_upstream(stack, settings)
    transport = create_transport(settings.upstream)
    stack.push_async_callback(transport.aclose)
    engine = create_engine(settings.database_url)
    stack.push_async_callback(engine.dispose)
    await upgrade_schema(engine)
    ledger = None
    prices = None if settings.prices_file is None else load_prices(settings.prices_file)
    if sink is None:
        ledger = await _open_ledger(stack, settings, engine)
        sink = LedgerSink(ledger, settings.ledger, prices)
    keys = await _tenant_keys(settings, engine, ledger)
    if keys is not None:
        _reload_on_sighup(stack, keys)
    kept = _KeptState.open(engine, keys, settings)
    upstreams = UpstreamPool(transport, settings.upstream)
    stack.callback(upstreams.close)
    router = Router(settings.routing_section, upstreams)
    router.start()
    stack.push_async_callback(router.aclose)
    kv = open_admission(settings.admission, redis)
    metrics = observe(settings, upstreams, kv, limiter, ledger)
    _siem(stack, settings, engine, metrics, ledger)
    background = [kv.scrape_forever(upstreams.upstreams, upstreams.get), kv.renew_forever(),
                  upstreams.probe_forever()]  # fmt: skip
    background += kept.purges()
    if ledger is not None:
        background += _ledger_rounds(stack, settings, ledger)
    background += _intent_keeping(settings, sink, metrics)
    for work in background:
        task = asyncio.create_task(work)
        stack.push_async_callback(_cancel, task)
    guardrails, guard_models = _guardrails(stack, settings, metrics)
    tracing = open_tracing()
    if tracing is not None:  # flushed off the loop: the exporters' last posts block
        stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
    keystore = KeyStore(engine, ttl=settings.key_cache_ttl_s, stale_s=settings.key_cache_stale_s,
                        health=database)  # fmt: skip
    state = AppState(
        settings=settings, transport=transport, upstreams=upstreams, engine=engine,
        keys=keystore, limiter=limiter, kv=kv, sink=sink, ledger=ledger, metrics=metrics,
        redis=redis, sealer=kept.sealer, stored=kept.stored, conversations=kept.conversations,
        background_store=kept.background, guardrails=guardrails, guard_models=guard_models,
        tracing=tracing, router=router, files=kept.files, batches=kept.batches, prices=prices,
        spending=_spending(prices, engine, limiter, metrics),
    )  # fmt: skip
    if state.background is not None:  # stopped before the database goes (a LIFO stack)
        sweeping = asyncio.create_task(state.background.sweep_forever())
        stack.push_async_callback(state.background.stop_all)
        stack.push_async_callback(_cancel, sweeping)
    return state


async def _demo_upstream(stack: contextlib.AsyncExitStack, settings: Settings) -> Settings:
    """``--demo`` without upstreams: the simulator in this process, and its models."""
    from gateway.side.sim.app import SimConfig, create_sim_app

    demo_sim = create_sim_app(SimConfig(ttft_ms=300, itl_ms=15))
    sim = await stack.enter_async_context(BackgroundServer(demo_sim))
    settings = settings.model_copy(update={"upstreams": (f"{sim.url}/v1",)})
    log.info("demo simulator (the upstream) on %s/v1: thinkgate doctor --upstream %s/v1",
             sim.url, sim.url)  # fmt: skip
    return settings.with_default_models(DEMO_MODELS)


async def _open_ledger(stack: contextlib.AsyncExitStack, settings: Settings,
                       engine: AsyncEngine) -> Ledger:  # fmt: skip
    """The ledger, its key files made first in demo mode (said loudly: they must be kept)."""
    for path in ensure_keys(settings.ledger, create=settings.demo):
        if path == str(settings.signing_key_file):
            log.warning("created the checkpoint signing key %s (demo): keep it, or later "
                        "checkpoints are signed by another key than auditors pinned",
                        path)  # fmt: skip
        else:
            log.warning("created the ledger encryption key file %s (demo): keep it, or "
                        "records become unreadable", path)  # fmt: skip
    ledger = await open_ledger(settings.ledger, engine)
    stack.push_async_callback(ledger.aclose)
    return ledger


@dataclasses.dataclass(frozen=True, slots=True)
class _KeptState:
    """What the gateway keeps sealed with the ledger's tenant keys (none without them)."""

    sealer: ReasoningSealer | None = None
    stored: ResponseStore | None = None
    conversations: ConversationStore | None = None
    background: BackgroundStore | None = None
    files: FileStore | None = None
    batches: BatchStore | None = None

    @classmethod
    def open(cls, engine: AsyncEngine, keys: DataKeys | None, settings: Settings) -> _KeptState:
        if keys is None:
            return cls()
        kept, stale = settings.responses_retention_s, settings.background_stale_s
        b = settings.batches
        files, lease = FileStore(engine, keys, b.files_retention_s), b.batch_lease_s
        return cls(ReasoningSealer(keys, settings.reasoning_token_ttl_s),
                   ResponseStore(engine, keys, kept), ConversationStore(engine, keys, kept),
                   BackgroundStore(engine, keys, kept, stale), files,
                   BatchStore(engine, keys, b.files_retention_s, files, lease))  # fmt: skip

    def purges(self) -> list[Coroutine[Any, Any, None]]:
        stores = (self.stored, self.conversations, self.background, self.files, self.batches)
        return [store.purge_forever() for store in stores if store is not None]


def _spending(prices: Prices | None, engine: AsyncEngine, limiter: Limiter,
              metrics: Metrics) -> Spending | None:  # fmt: skip
    """Budgets in money: kept when there are prices to count them in, by the rate limits'
    backends (a limiter that keeps no limits keeps no budgets either)."""
    if prices is None:
        return None

    def observe(budget: MoneyBudget, used: float) -> None:
        metrics.budget_used.labels(budget.scope, budget.subject, budget.period).set(used)

    limits: Circuit[RateLimitBackend]
    if isinstance(limiter, KeyLimiter):
        limits = limiter.circuit
    else:
        local = MemoryBackend()
        limits = Circuit("rate limits", local, local, fail="open", errors=())
    return Spending(prices, BudgetBook(engine), limits, observe=observe)


def _run_batches(stack: contextlib.AsyncExitStack, state: AppState, app: FastAPI) -> None:
    """Batch lines run here, asked of the app itself (``gateway.batch.runner``); on shutdown
    (before the database and the ledger close: a LIFO stack) the lines running here go back
    to the queue."""
    runner = state.batch_runner
    if runner is None:
        return
    runner.app = lambda: app
    task = asyncio.create_task(runner.run_forever())
    stack.push_async_callback(runner.stop_all)
    stack.push_async_callback(_cancel, task)


def _reload_on_sighup(stack: contextlib.AsyncExitStack, keys: DataKeys) -> None:
    """``kill -HUP`` reads the key file again (a rotation is also noticed on its own, the
    first time a data key needs the new KEK). Only where signals can be had: the main
    thread of a process on a platform that has SIGHUP."""
    hup = getattr(signal, "SIGHUP", None)
    if hup is None:
        return
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(hup, keys.reload_keys)
    except (NotImplementedError, RuntimeError, ValueError):
        return  # not the main thread (tests run the app in one), or no signals here
    stack.callback(loop.remove_signal_handler, hup)


async def _tenant_keys(
    settings: Settings, engine: AsyncEngine, ledger: Ledger | None
) -> DataKeys | None:
    """Reasoning tokens and stored responses are sealed with the ledger's tenant keys: the
    ledger's own, or, when another sink replaced it (tests, benchmarks), the key file's if
    there is one (else neither is available)."""
    if ledger is not None:
        return ledger.keys
    if not settings.ledger_key_file.exists():
        return None
    await audit_migrate.upgrade(engine)
    return DataKeys(engine, ReloadingKeyProvider(settings.ledger_key_file))


def observe(
    settings: Settings, upstreams: UpstreamPool, kv: KVAdmission, limiter: Limiter,
    ledger: Ledger | None,
) -> Metrics:  # fmt: skip
    """The app's metrics, and every component told where to report."""
    metrics = Metrics(settings.tenants.keys(), settings.metrics_tenants,
                      multiprocess=bool(settings.prometheus_multiproc_dir))  # fmt: skip
    upstreams.on_failure = metrics.upstream_failed
    metrics.know_upstreams(u.base_url for u in upstreams.upstreams)
    kv.metrics = metrics
    kv.store.on_change = metrics.fallback.labels("kv_budget").set
    if isinstance(limiter, KeyLimiter):
        limiter.circuit.on_change = metrics.fallback.labels("rate_limits").set
    if ledger is not None:
        ledger.listener = metrics.ledger_event
    return metrics


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _shaped(request: Request, error: GatewayError) -> Response:
    """The error in the shape of the API the path belongs to (Anthropic's under /v1/messages)."""
    return shaped(request.url.path, error)


async def _gateway_error(request: Request, exc: GatewayError) -> Response:
    return _shaped(request, exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        return _shaped(request, NotFound("Unknown route.", code="unknown_route"))
    return _shaped(request, RouteError(exc.status_code, str(exc.detail)))


async def _internal_error(request: Request, _exc: Exception) -> Response:
    # Starlette logs the traceback; the client learns only that it was our fault.
    return _shaped(request, GatewayError("The gateway failed to handle the request."))


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
    param = ".".join(loc) or None
    return _shaped(request, InvalidRequest(f"Invalid value for '{param}'.", param=param))
