"""The dependencies one app owns, created in its lifespan and reached through ``app.state.tg``."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.ledger import Ledger
from gateway.admission import KVAdmission
from gateway.keystore import KeyStore
from gateway.metrics import Metrics
from gateway.ports import Limiter, RecordSink
from gateway.settings import Settings
from gateway.upstream import UpstreamPool
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
