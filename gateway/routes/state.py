"""The dependencies one app owns, created in its lifespan and reached through ``app.state.tg``."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
from starlette.requests import Request
from starlette.types import ASGIApp

from audit.ledger import Ledger
from audit.sqlasync import AsyncEngine
from gateway.admission.budget import KVAdmission
from gateway.admission.gate import Gate
from gateway.admission.limiter import Limiter
from gateway.admission.spending import Spending
from gateway.auth.keystore import KeyStore
from gateway.batch.files import FileStore
from gateway.batch.runner import BatchRunner
from gateway.batch.store import BatchStore
from gateway.conversation.background import BackgroundStore
from gateway.conversation.conversations import ConversationStore
from gateway.conversation.sealing import ReasoningSealer
from gateway.conversation.store import ResponseStore
from gateway.exchange.background import Runner
from gateway.exchange.forward import Forwarder
from gateway.guard.policy import NONE as NO_GUARDRAILS
from gateway.guard.policy import Guardrails
from gateway.ledger.record import RecordSink
from gateway.pipeline.steps import Pipeline
from gateway.settings import Settings
from gateway.spend.prices import Prices
from gateway.telemetry.metrics import Metrics
from gateway.upstream.judge import GuardModels
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.router import Router

if TYPE_CHECKING:  # redis-py, the OpenTelemetry SDK: only where configured
    from gateway.telemetry.spans import Tracing
    from ratelimit.autopipe import AutoPipeline


@dataclass(frozen=True, slots=True)
class AppState:
    settings: Settings
    transport: httpx.AsyncBaseTransport
    upstreams: UpstreamPool
    engine: AsyncEngine
    keys: KeyStore
    limiter: Limiter
    kv: KVAdmission
    sink: RecordSink
    ledger: Ledger | None  # None when the app was given another sink
    metrics: Metrics
    redis: AutoPipeline | None = None  # the process's one Redis client, when configured
    instrument: bool = True  # measure each request (off only in benchmarks of the metrics)
    sealer: ReasoningSealer | None = None  # reasoning tokens; None without ledger keys
    stored: ResponseStore | None = None  # stored responses; None without ledger keys
    conversations: ConversationStore | None = None  # None without ledger keys
    # background responses' state and events; None without ledger keys
    background_store: BackgroundStore | None = None
    replica: str = field(default_factory=lambda: secrets.token_hex(8))  # this process's id
    guardrails: Guardrails = NO_GUARDRAILS  # GUARDRAILS_FILE's policies
    guard_models: GuardModels | None = None  # their guard models' client, when they have any
    tracing: Tracing | None = None  # OpenTelemetry, when OTEL_* configures it
    router: Router | None = None  # which engine first (ROUTING, the engines' KV events)
    prices: Prices | None = None  # PRICES_FILE's, when set
    spending: Spending | None = None  # budgets in money (with prices)
    files: FileStore | None = None  # uploaded and batch output files; None without ledger keys
    batches: BatchStore | None = None  # batches and their lines; None without ledger keys

    gate: Gate = field(init=False)  # the limiter and the KV budget, asked at once
    forwarder: Forwarder = field(init=False)  # the forward loop over the upstream pool
    background: Runner | None = field(init=False)  # runs background responses
    pipeline: Pipeline = field(init=False)  # the steps the completion routes share
    batch_runner: BatchRunner | None = field(init=False)  # runs batch lines (the app starts it)

    def __post_init__(self) -> None:
        s = self.settings
        object.__setattr__(self, "gate", Gate(self.limiter, self.kv))
        forwarder = Forwarder(self.upstreams, s.max_sse_event_bytes, s.keepalive_s)
        object.__setattr__(self, "forwarder", forwarder)
        runner = None
        if self.background_store is not None:
            beat_s = min(1.0, self.background_store.stale_s / 4)
            runner = Runner(self.background_store, forwarder, self.replica, beat_s=beat_s)
        object.__setattr__(self, "background", runner)
        pipeline = Pipeline(s.pipeline, self.keys, self.sink, self.upstreams, self.gate,
                            forwarder, self.metrics, self.instrument, self.guardrails,
                            self.guard_models, self.tracing, router=self.router,
                            prices=self.prices, spending=self.spending,
                            refuse_unpriced=s.unpriced_models == "refuse")  # fmt: skip
        object.__setattr__(self, "pipeline", pipeline)
        lines = None
        if self.batches is not None and s.batch_max_concurrency > 0:
            lines = BatchRunner(self.batches, _no_app, self.replica, s.batch_max_concurrency,
                                self.metrics if self.instrument else None)  # fmt: skip
        object.__setattr__(self, "batch_runner", lines)


def _no_app() -> ASGIApp:
    raise RuntimeError("the batch runner runs once the app has started")


def app_state(request: Request) -> AppState:
    """The app's state, as the lifespan made it."""
    state: AppState = request.app.state.tg
    return state
