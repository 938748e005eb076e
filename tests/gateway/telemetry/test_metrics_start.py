"""Metrics a fresh gateway exports before any traffic: every known label value at zero
(rejection kinds, each configured upstream's failure kinds), and no ``_created`` series."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.metrics import FAILURE_KINDS, REJECTION_KINDS, Metrics


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip


def test_known_label_values_start_at_zero() -> None:
    metrics = Metrics()
    metrics.know_upstreams(["http://a:8000/v1", "http://b:8000/v1"])
    got = scrape(metrics)
    for kind in REJECTION_KINDS:
        assert got[("thinkgate_ratelimit_rejections_total", (("kind", kind),))] == 0
    for url in ("http://a:8000/v1", "http://b:8000/v1"):
        for kind in FAILURE_KINDS:
            labels = (("kind", kind), ("upstream", url))
            assert got[("thinkgate_upstream_errors_total", labels)] == 0


def test_no_created_series() -> None:
    got = scrape(Metrics())
    assert got and not [name for name, _ in got if name.endswith("_created")]
