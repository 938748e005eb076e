"""Tracing is configured by the OTEL_* variables alone: off without an endpoint or when the
SDK is disabled, on (with the sampler the variables name) otherwise."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

from gateway.telemetry.tracing import open_tracing

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}


def test_off_without_an_endpoint_or_when_disabled() -> None:
    assert open_tracing({}) is None
    assert open_tracing({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}) is None


def test_on_with_an_endpoint_the_sampler_and_metrics_as_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the SDK reads the sampler from the process environment itself
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.01")
    tracing = open_tracing({**ENDPOINT, "OTEL_METRICS_EXPORTER": "none"})
    assert tracing is not None and tracing.metrics is None
    sampler = tracing.providers[0].sampler
    assert isinstance(sampler, ParentBasedTraceIdRatio)
    assert "0.01" in sampler.get_description()
    tracing.shutdown()
