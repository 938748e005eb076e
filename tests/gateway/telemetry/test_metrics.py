"""The metrics core: gap counting equals per-gap observation, bounded tenant labels, refusal
statuses, and what one completion or one ledger event does to the exposition."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from audit.writer import WriterEvent
from gateway.errors import (
    AuthError,
    GatewayError,
    InvalidRequest,
    LedgerUnavailable,
    NotFound,
    PermissionDenied,
    RateLimited,
    RequestTooLarge,
    ServiceUnavailable,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.ledger.record import parse_usage
from gateway.telemetry.metrics import (
    LATENCY_BUCKETS,
    OTHER,
    CompletedRequest,
    GapCounts,
    Metrics,
    TenantLabels,
    add_counts,
    refusal_status,
)
from tests.records import completion_record

EDGES = [*LATENCY_BUCKETS, 0.0, 60.000001, 1e9]
gap_values = st.one_of(
    st.sampled_from(EDGES),
    st.floats(min_value=0, max_value=120, allow_nan=False),
    st.floats(min_value=0, max_value=1e12, allow_nan=False),
)


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)


def histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    made = Histogram("gaps_seconds", "gaps", ["model"], buckets=LATENCY_BUCKETS, registry=registry)
    return registry, made


def exposition(registry: CollectorRegistry) -> str:
    """The text a scraper reads, minus ``_created`` (each child's creation time)."""
    text = generate_latest(registry).decode()
    return "\n".join(line for line in text.splitlines() if "_created" not in line)


def counted(times: list[float]) -> GapCounts:
    gaps = GapCounts()
    for now in times:
        gaps.tick(now)
    return gaps


def timeline(gaps: list[float]) -> list[float]:
    times = [0.0]
    for gap in gaps:
        times.append(times[-1] + gap)
    return times


@settings(max_examples=300, deadline=None)
@given(st.lists(gap_values, max_size=40))
def test_counted_gaps_expose_exactly_what_observing_each_gap_does(gaps: list[float]) -> None:
    times = timeline(gaps)
    expected_registry, expected = histogram()
    child = expected.labels("m")
    for earlier, later in itertools.pairwise(times):
        child.observe(later - earlier)  # the same subtraction as tick's
    actual_registry, actual = histogram()
    add_counts(actual.labels("m"), counted(times))
    assert exposition(actual_registry) == exposition(expected_registry)


@pytest.mark.parametrize("gap", EDGES)
def test_a_gap_on_a_bucket_edge_lands_in_that_bucket(gap: float) -> None:
    expected_registry, expected = histogram()
    expected.labels("m").observe(gap)
    actual_registry, actual = histogram()
    add_counts(actual.labels("m"), counted([0.0, gap]))  # gap - 0.0 is the gap, exactly
    assert exposition(actual_registry) == exposition(expected_registry)
    if gap in LATENCY_BUCKETS:
        le = str(gap)
        value = actual_registry.get_sample_value("gaps_seconds_bucket", {"model": "m", "le": le})
        below = [b for b in LATENCY_BUCKETS if b < gap]
        assert value == 1
        if below:
            labels = {"model": "m", "le": str(below[-1])}
            assert actual_registry.get_sample_value("gaps_seconds_bucket", labels) == 0


def test_the_inf_bucket_sum_and_count_of_a_huge_gap() -> None:
    registry, made = histogram()
    add_counts(made.labels("m"), counted([0.0, 1e9, 1e9 + 0.001]))
    sample = registry.get_sample_value
    assert sample("gaps_seconds_bucket", {"model": "m", "le": "60.0"}) == 1  # the 1 ms gap
    assert sample("gaps_seconds_bucket", {"model": "m", "le": "+Inf"}) == 2
    assert sample("gaps_seconds_count", {"model": "m"}) == 2
    assert sample("gaps_seconds_sum", {"model": "m"}) == pytest.approx(1e9 + 0.001)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(gap_values, max_size=10), max_size=8))
def test_many_requests_add_up_like_their_gaps_observed_one_by_one(
    requests: list[list[float]],
) -> None:
    """Bucket counts match exactly; the sum only up to rounding, because a request's gaps are
    added up before they join the histogram's sum."""
    expected_registry, expected = histogram()
    actual_registry, actual = histogram()
    want_child, got_child = expected.labels("m"), actual.labels("m")
    for gaps in requests:
        times = timeline(gaps)
        for earlier, later in itertools.pairwise(times):
            want_child.observe(later - earlier)
        add_counts(got_child, counted(times))
    want, got = samples(expected_registry), samples(actual_registry)
    assert want.keys() == got.keys()
    for key, value in want.items():
        if key[0] == "gaps_seconds_sum":
            assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12), key
        else:
            assert got[key] == value, key


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_a_first_read_alone_is_no_gap() -> None:
    gaps = counted([5.0])
    assert gaps.last == 5.0 and sum(gaps.counts) == 0 and gaps.total == 0.0


# -- tenant labels ---------------------------------------------------------------------------


def test_named_tenants_always_get_their_label_then_the_first_others_then_other() -> None:
    labels = TenantLabels(frozenset({"acme", "globex"}), limit=2)
    assert [labels(t) for t in ("x", "acme", "y", "z", "x", "globex", "w", "y")] == [
        "x", "acme", "y", OTHER, "x", "globex", OTHER, "y",
    ]  # fmt: skip


def test_no_others_at_all_with_a_limit_of_zero() -> None:
    labels = TenantLabels(frozenset({"acme"}), limit=0)
    assert [labels(t) for t in ("x", "acme", "y")] == [OTHER, "acme", OTHER]
    assert labels.seen == set()


def test_the_metrics_use_the_settings_tenants_and_limit() -> None:
    metrics = Metrics(tenants=("acme",), tenant_limit=1)
    for tenant in ("beta", "gamma", "acme"):
        metrics.refused(InvalidRequest("no"), "m", tenant, stream=False)
    labels = {"model": "m", "status": "invalid", "stream": "false", "endpoint": CHAT}
    sample = metrics.registry.get_sample_value
    assert sample("thinkgate_requests_total", {**labels, "tenant": "beta"}) == 1
    assert sample("thinkgate_requests_total", {**labels, "tenant": OTHER}) == 1
    assert sample("thinkgate_requests_total", {**labels, "tenant": "acme"}) == 1
    assert sample("thinkgate_requests_total", {**labels, "tenant": "gamma"}) is None


# -- refusals --------------------------------------------------------------------------------


def rate_limited(kind: str = "requests", code: str | None = None) -> RateLimited:
    return RateLimited("slow down", retry_after=1.0, limit_type=kind, code=code)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (rate_limited(), "rate_limited"),
        (rate_limited("tokens"), "rate_limited"),
        (rate_limited(code="kv_budget_exhausted"), "rate_limited"),
        (InvalidRequest("bad"), "invalid"),
        (RequestTooLarge("big"), "invalid"),
        (AuthError("who"), "invalid"),
        (PermissionDenied("no"), "invalid"),
        (NotFound("where", code="model_not_found"), "invalid"),
        (UpstreamConnectError("down"), "upstream_error"),
        (UpstreamTimeout("slow"), "upstream_error"),
        (UpstreamStatusError(500, "boom", param=None, code=None), "upstream_error"),
        (ServiceUnavailable("no engine", code="no_healthy_upstream"), "upstream_error"),
        (LedgerUnavailable("ledger away"), "error"),
        (GatewayError("bug"), "error"),
    ],
)
def test_refusal_status(error: GatewayError, status: str) -> None:
    assert refusal_status(error) == status


def test_refusals_count_requests_and_each_limit_by_kind() -> None:
    metrics = Metrics()
    for error in (rate_limited(), rate_limited(), rate_limited("tokens"),
                  rate_limited(code="kv_budget_exhausted"), NotFound("where")):  # fmt: skip
        metrics.refused(error, "m", "acme", stream=True)
    sample = metrics.registry.get_sample_value
    assert sample("thinkgate_ratelimit_rejections_total", {"kind": "requests"}) == 2
    assert sample("thinkgate_ratelimit_rejections_total", {"kind": "tokens"}) == 1
    assert sample("thinkgate_ratelimit_rejections_total", {"kind": "kv_budget"}) == 1
    labels = {"model": "m", "tenant": "acme", "stream": "true", "endpoint": CHAT}
    assert sample("thinkgate_requests_total", {**labels, "status": "rate_limited"}) == 4
    assert sample("thinkgate_requests_total", {**labels, "status": "invalid"}) == 1


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (UpstreamConnectError("down"), "connect"),
        (UpstreamTimeout("slow"), "timeout"),
        (UpstreamProtocolError("garbage"), "protocol"),
        (UpstreamStatusError(500, "boom", param=None, code=None), "status"),
        (UpstreamError("other"), "status"),
    ],
)
def test_upstream_failures_by_kind(error: UpstreamError, kind: str) -> None:
    metrics = Metrics()
    metrics.upstream_failed("http://engine/v1", error)
    labels = {"upstream": "http://engine/v1", "kind": kind}
    assert metrics.registry.get_sample_value("thinkgate_upstream_errors_total", labels) == 1


# -- one completion --------------------------------------------------------------------------


completion = completion_record


def reader(metrics: Metrics) -> Any:
    """A sample's value; a series never touched reads 0, whether it exists yet or not."""

    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return metrics.registry.get_sample_value(name, labels or {}) or 0.0

    return value


MT = {"model": "m", "tenant": "acme"}
CHAT = "chat.completions"


def test_a_completion_splits_its_tokens_and_times() -> None:
    metrics = Metrics()
    gaps = counted([100.5, 100.52, 100.6])
    metrics.observe_completion(CompletedRequest(completion(), "ok", 0.002, 101.25, gaps))
    value = reader(metrics)
    assert (
        value(
            "thinkgate_requests_total", {**MT, "status": "ok", "stream": "true", "endpoint": CHAT}
        )
        == 1
    )
    assert value("thinkgate_prompt_tokens_total", MT) == 7
    assert value("thinkgate_reasoning_tokens_total", MT) == 4
    assert value("thinkgate_content_tokens_total", MT) == 6
    assert value("thinkgate_reasoning_ratio_count", {"model": "m"}) == 1
    assert value("thinkgate_reasoning_ratio_sum", {"model": "m"}) == pytest.approx(0.4)
    assert value("thinkgate_reasoning_ratio_bucket", {"model": "m", "le": "0.3"}) == 0
    assert value("thinkgate_reasoning_ratio_bucket", {"model": "m", "le": "0.4"}) == 1
    assert value("thinkgate_time_to_first_token_seconds_count", MT) == 1
    assert value("thinkgate_time_to_first_token_seconds_sum", MT) == pytest.approx(0.5)
    assert value("thinkgate_time_to_first_content_token_seconds_count", MT) == 1
    assert value("thinkgate_time_to_first_content_token_seconds_sum", MT) == pytest.approx(1.25)
    duration = {**MT, "stream": "true"}
    assert value("thinkgate_request_duration_seconds_sum", duration) == pytest.approx(3.0)
    assert value("thinkgate_overhead_seconds_sum", {"stream": "true"}) == pytest.approx(0.002)
    assert value("thinkgate_inter_token_latency_seconds_count", {"model": "m"}) == 2
    itl_sum = value("thinkgate_inter_token_latency_seconds_sum", {"model": "m"})
    assert itl_sum == pytest.approx(0.1)
    assert value("thinkgate_client_disconnects_total", MT) == 0


def test_no_first_content_no_usage_and_a_disconnect() -> None:
    metrics = Metrics()
    record = completion(usage=None, first_token_at=None, client_disconnected=True,
                        status="client_disconnected", stream=False)  # fmt: skip
    metrics.observe_completion(CompletedRequest(record, "client_disconnected", 0.001))
    value = reader(metrics)
    assert value("thinkgate_client_disconnects_total", MT) == 1
    labels = {**MT, "status": "client_disconnected", "stream": "false", "endpoint": CHAT}
    assert value("thinkgate_requests_total", labels) == 1
    assert value("thinkgate_request_duration_seconds_count", {**MT, "stream": "false"}) == 1
    assert value("thinkgate_time_to_first_token_seconds_count", MT) == 0
    assert value("thinkgate_time_to_first_content_token_seconds_count", MT) == 0
    assert value("thinkgate_inter_token_latency_seconds_count", {"model": "m"}) == 0
    assert value("thinkgate_reasoning_ratio_count", {"model": "m"}) == 0
    for name in ("prompt", "reasoning", "content"):
        assert value(f"thinkgate_{name}_tokens_total", MT) == 0


def test_a_first_token_without_content_is_no_first_content() -> None:
    metrics = Metrics()
    gaps = counted([100.5])  # one read: no gap yet
    metrics.observe_completion(CompletedRequest(completion(), "ok", 0.0, None, gaps))
    value = reader(metrics)
    assert value("thinkgate_time_to_first_token_seconds_count", MT) == 1
    assert value("thinkgate_time_to_first_content_token_seconds_count", MT) == 0
    assert value("thinkgate_inter_token_latency_seconds_count", {"model": "m"}) == 0


@pytest.mark.parametrize(
    ("usage", "prompt", "reasoning", "content", "ratios"),
    [
        ({"prompt_tokens": 3, "completion_tokens": 5}, 3, 0, 5, [0.0]),
        ({"completion_tokens": 5, "completion_tokens_details": None}, 0, 0, 5, [0.0]),
        ({"completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": 9}},
         0, 5, 0, [1.0]),  # more reasoning than completion: capped
        ({"prompt_tokens": True, "completion_tokens": "5"}, 0, 0, 0, []),
        ({"prompt_tokens": -2, "completion_tokens": 0}, 0, 0, 0, []),
    ],
)  # fmt: skip
def test_odd_usage_figures(
    usage: dict[str, Any], prompt: int, reasoning: int, content: int, ratios: list[float]
) -> None:
    metrics = Metrics()
    record = completion(usage=parse_usage(usage))  # the engine's odd figures, read once
    metrics.observe_completion(CompletedRequest(record, "ok", 0.0))
    value = reader(metrics)
    assert value("thinkgate_prompt_tokens_total", MT) == prompt
    assert value("thinkgate_reasoning_tokens_total", MT) == reasoning
    assert value("thinkgate_content_tokens_total", MT) == content
    assert value("thinkgate_reasoning_ratio_count", {"model": "m"}) == len(ratios)
    assert value("thinkgate_reasoning_ratio_sum", {"model": "m"}) == sum(ratios)


def test_completions_of_one_kind_add_up() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.observe_completion(CompletedRequest(completion(), "ok", 0.001, 101.0))
    value = reader(metrics)
    assert (
        value(
            "thinkgate_requests_total", {**MT, "status": "ok", "stream": "true", "endpoint": CHAT}
        )
        == 3
    )
    assert value("thinkgate_prompt_tokens_total", MT) == 21
    assert value("thinkgate_reasoning_ratio_count", {"model": "m"}) == 3


# -- the ledger ------------------------------------------------------------------------------


def test_ledger_events_update_the_ledger_metrics() -> None:
    metrics = Metrics()
    sample = metrics.registry.get_sample_value
    metrics.ledger_event(WriterEvent(3, 0.004, 10, 2, 1_700_000_000.0))
    assert sample("thinkgate_ledger_records_total") == 3
    assert sample("thinkgate_ledger_commit_seconds_count") == 1
    assert sample("thinkgate_ledger_commit_seconds_sum") == pytest.approx(0.004)
    assert sample("thinkgate_ledger_tree_size") == 10
    assert sample("thinkgate_ledger_spool_records") == 2
    assert sample("thinkgate_ledger_last_checkpoint_timestamp_seconds") == 1_700_000_000.0
    # a spool change: nothing committed, no commit timed, the checkpoint time kept
    metrics.ledger_event(WriterEvent(0, None, 10, 0, None))
    assert sample("thinkgate_ledger_records_total") == 3
    assert sample("thinkgate_ledger_commit_seconds_count") == 1
    assert sample("thinkgate_ledger_spool_records") == 0
    assert sample("thinkgate_ledger_last_checkpoint_timestamp_seconds") == 1_700_000_000.0
    # a replay: records committed without a timed commit
    metrics.ledger_event(WriterEvent(2, None, 12, 0, 1_700_000_060.0))
    assert sample("thinkgate_ledger_records_total") == 5
    assert sample("thinkgate_ledger_commit_seconds_count") == 1
    assert sample("thinkgate_ledger_tree_size") == 12
    assert sample("thinkgate_ledger_last_checkpoint_timestamp_seconds") == 1_700_000_060.0


def test_two_apps_share_no_metrics() -> None:
    first, second = Metrics(), Metrics()
    first.refused(InvalidRequest("no"), "m", "acme", stream=False)
    labels = {
        "model": "m",
        "tenant": "acme",
        "status": "invalid",
        "stream": "false",
        "endpoint": CHAT,
    }
    assert reader(first)("thinkgate_requests_total", labels) == 1
    assert reader(second)("thinkgate_requests_total", labels) == 0
    assert first.exposition_registry() is first.registry
