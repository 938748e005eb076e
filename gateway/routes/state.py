"""The dependencies one app owns, created in its lifespan and reached through ``app.state.tg``."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.ledger import Ledger
from gateway.admission.budget import KVAdmission
from gateway.admission.limiter import Limiter
from gateway.auth.keystore import KeyStore
from gateway.ledger.record import RecordSink
from gateway.settings import Settings
from gateway.telemetry.metrics import Metrics
from gateway.upstream.pool import UpstreamPool
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
