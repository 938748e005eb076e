"""``Pipeline.refused`` (``gateway/pipeline/steps.py``): every refusal is counted in
``thinkgate_requests_total`` with the error's outcome as its status (and by kind for limits), and
logged on ``thinkgate.access``, never with the key that was presented; ``Pipeline.receive`` refuses
a caller without a key before reading its body."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from starlette.requests import Request
from starlette.types import Message

from gateway.admission.budget import open_admission
from gateway.admission.limiter import Unlimited
from gateway.auth import keys
from gateway.auth.keys import KeyInfo
from gateway.auth.keystore import KeyStore
from gateway.db import create_engine
from gateway.errors import (
    AuthError,
    ClientClosedRequest,
    GatewayError,
    LedgerUnavailable,
    RateLimited,
    ServiceUnavailable,
)
from gateway.routes.state import AppState
from gateway.settings import Settings
from gateway.telemetry.logs import JsonFormatter
from gateway.telemetry.metrics import Metrics
from gateway.upstream.pool import UpstreamPool
from tests.e2e.conftest import RecordingSink

PRESENTED = keys.generate().secret  # the key in the request's Authorization header
KEY = KeyInfo(PRESENTED.split("-")[2], "acme", "client", "hidden", None, None,
              datetime.now(UTC), None, b"")  # fmt: skip
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
async def state(sqlite_url: str) -> AsyncIterator[AppState]:
    settings = Settings()
    transport = httpx.AsyncHTTPTransport()
    engine = create_engine(sqlite_url)
    try:
        yield AppState(settings=settings, transport=transport,
                       upstreams=UpstreamPool(transport, settings.upstream), engine=engine,
                       keys=KeyStore(engine), limiter=Unlimited(),
                       kv=open_admission(settings.admission, None), sink=RecordingSink(),
                       ledger=None, metrics=Metrics())  # fmt: skip
    finally:
        await engine.dispose()


def request(authorization: str | None = f"Bearer {PRESENTED}") -> tuple[Request, list[int]]:
    """A chat request, and how often its body was asked for."""
    headers = [(b"traceparent", TRACEPARENT.encode())]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers,
             "query_string": b"", "state": {"request_id": "req_refused"}}  # fmt: skip
    reads: list[int] = []

    async def receive() -> Message:
        reads.append(1)
        return {"type": "http.request", "body": b"{}", "more_body": False}

    return Request(scope, receive), reads


def requests_total(state: AppState, model: str, tenant: str, status: str, stream: str) -> float:
    labels = {
        "model": model,
        "tenant": tenant,
        "status": status,
        "stream": stream,
        "endpoint": "chat.completions",
    }
    return state.metrics.registry.get_sample_value("thinkgate_requests_total", labels) or 0.0


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (AuthError("no"), "invalid"),
        (RateLimited("slow", retry_after=1), "rate_limited"),
        (ClientClosedRequest("gone"), "client_disconnected"),
        (ServiceUnavailable("no engine"), "upstream_error"),
        (LedgerUnavailable("down"), "error"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v,
)
async def test_a_refusal_is_counted_with_its_outcome_as_status(
    state: AppState, error: GatewayError, status: str
) -> None:
    state.pipeline.refused(request()[0], KEY, error, "m1", True, served=True)
    state.pipeline.refused(request()[0], None, error, "m1", False)
    assert requests_total(state, "m1", "acme", status, "true") == 1
    assert requests_total(state, "unknown", "unknown", status, "false") == 1  # no key, unserved


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (RateLimited("kv", retry_after=1, code="kv_budget_exhausted"), "kv_budget"),
        (RateLimited("tpm", retry_after=1, limit_type="tokens"), "tokens"),
        (RateLimited("rpm", retry_after=1, limit_type="requests"), "requests"),
    ],
)
async def test_a_limits_refusal_is_counted_by_kind(
    state: AppState, error: RateLimited, kind: str
) -> None:
    state.pipeline.refused(request()[0], KEY, error, "m1", False, served=True)
    rejections = state.metrics.registry.get_sample_value(
        "thinkgate_ratelimit_rejections_total", {"kind": kind}
    )
    assert rejections == 1


async def test_a_refusal_is_logged_without_the_key(
    state: AppState, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="thinkgate.access"):
        state.pipeline.refused(request()[0], KEY, RateLimited("slow", retry_after=1), "m-x", True)
    [record] = [r for r in caplog.records if r.name == "thinkgate.access"]
    fields = record.fields  # type: ignore[attr-defined]
    assert record.getMessage() == "request refused"
    assert fields == {"request_id": "req_refused", "tenant": "acme", "key_id": KEY.key_id,
                      "model": "m-x", "status": "rate_limited", "error_code": "rate_limit_exceeded",
                      "trace_id": "0af7651916cd43dd8448eb211c80319c",
                      "endpoint": "chat.completions", "param": None}  # fmt: skip
    line = JsonFormatter().format(record)
    assert PRESENTED not in line and PRESENTED.split("-", 3)[3] not in line  # nor its secret


async def test_a_caller_without_a_key_is_refused_before_its_body_is_read(
    state: AppState, caplog: pytest.LogCaptureFixture
) -> None:
    http, reads = request(authorization=None)
    with caplog.at_level(logging.INFO, logger="thinkgate.access"), pytest.raises(AuthError):
        await state.pipeline.receive(http, "client")
    assert reads == []  # not a byte of the body was read
    assert requests_total(state, "unknown", "unknown", "invalid", "false") == 1
    [record] = [r for r in caplog.records if r.name == "thinkgate.access"]
    assert record.fields["error_code"] == "missing_api_key"  # type: ignore[attr-defined]
