"""``/healthz`` (the process answers), ``/readyz`` (its dependencies answer, and the ledger
takes records), ``/metrics``.

Redis counts against readiness only with ``RATELIMIT_FAIL=closed``: with ``open`` a replica
without Redis still serves (limits per replica), so taking it out of a load balancer would turn
a degraded service into none; ``/readyz`` still says so in its body."""

from __future__ import annotations

import asyncio
import hmac

import orjson
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from sqlalchemy import text
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import AuthError, GatewayError
from gateway.routes.state import AppState


async def healthz(_request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


async def readyz(request: Request) -> Response:
    state: AppState = request.app.state.tg
    checks = dict(
        zip(
            ("upstream", "database"),
            await asyncio.gather(_upstream_ready(state), _database_ready(state)),
            strict=True,
        )
    )
    checks["ledger"] = "ok" if state.sink.accepting() else "refusing records"
    ok = all(v == "ok" for v in checks.values())
    if state.redis is not None:
        checks["redis"] = await _redis_ready(state)
        ok = ok and (checks["redis"] == "ok" or state.settings.ratelimit_fail == "open")
    body = orjson.dumps({"status": "ok" if ok else "unavailable", "checks": checks})
    return Response(body, status_code=200 if ok else 503, media_type="application/json")


async def metrics(request: Request) -> Response:
    """With ``METRICS_TOKEN`` set, only ``Authorization: Bearer <token>`` may read them (a
    scraper's credential, compared in constant time); ``METRICS_PORT`` serves them open on a
    second listener (``metrics_app``) for a scraper inside the cluster."""
    state: AppState = request.app.state.tg
    token = state.settings.metrics_token.get_secret_value()
    if token and not _bearer(request.headers.get("authorization"), token):
        raise AuthError("/metrics needs the metrics bearer token.", code="invalid_api_key")
    return exposition(state, request.headers.get("accept", ""))


def exposition(state: AppState, accept: str) -> Response:
    """The metrics in Prometheus' text format, or in OpenMetrics (which carries the latency
    histograms' exemplars: trace ids of traced requests) when the scraper asks for it."""
    registry = state.metrics.exposition_registry()
    if "application/openmetrics-text" in accept:
        return Response(openmetrics.generate_latest(registry),  # type: ignore[no-untyped-call]
                        media_type=openmetrics.CONTENT_TYPE_LATEST)  # fmt: skip
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def metrics_app(state: AppState) -> Starlette:
    """``GET /metrics`` alone, without authentication: for ``METRICS_PORT``."""

    async def open_metrics(request: Request) -> Response:
        return exposition(state, request.headers.get("accept", ""))

    return Starlette(routes=[Route("/metrics", open_metrics, methods=["GET"])])


def _bearer(header: str | None, token: str) -> bool:
    presented = header[7:] if header is not None and header[:7].lower() == "bearer " else ""
    return hmac.compare_digest(presented.encode(), token.encode())


async def _upstream_ready(state: AppState) -> str:
    try:
        return "ok" if await state.upstreams.model_cards() else "no models"
    except GatewayError as exc:
        return exc.message


async def _database_ready(state: AppState) -> str:
    try:
        async with asyncio.timeout(2), state.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception:  # any failure means "not ready"; the reason goes to logs, not clients
        return "unreachable"
    return "ok"


async def _redis_ready(state: AppState) -> str:
    assert state.redis is not None
    try:
        async with asyncio.timeout(1):
            await state.redis.ping()
    except Exception:
        return "unreachable"
    return "ok"


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/healthz", healthz, methods=["GET"], include_in_schema=False)
    # vLLM's liveness path: tools made for vLLM (guidellm) probe it before their load
    app.add_api_route("/health", healthz, methods=["GET"], include_in_schema=False)
    app.add_api_route("/readyz", readyz, methods=["GET"], include_in_schema=False)
    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
