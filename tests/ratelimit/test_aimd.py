"""The adaptive admitted limit: each health rule, the floor and the cap, convergence, stale
metrics, preemption counter resets and capacity discovery."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratelimit.aimd import AdmissionController, Tuning
from ratelimit.engine_metrics import EngineSnapshot

CAPACITY = 1000  # target 850, floor 100, step 50, decrease × 0.7


def snap(
    usage: float | None = 0.5,
    waiting: float | None = 0,
    preemptions: float | None = 0,
    capacity: int | None = None,
) -> EngineSnapshot:
    return EngineSnapshot(
        kv_capacity_tokens=capacity,
        block_size=16,
        kv_usage=usage,
        requests_running=3,
        requests_waiting=waiting,
        preemptions_total=preemptions,
    )


HEALTHY = snap()


def test_starts_at_the_target_utilization() -> None:
    controller = AdmissionController(CAPACITY)
    assert controller.limit == 850
    assert controller.healthy
    assert controller.capacity == CAPACITY


@pytest.mark.parametrize(
    ("snapshot", "healthy"),
    [
        (snap(usage=0.85), True),  # at the threshold is fine, above is not
        (snap(usage=0.86), False),
        (snap(waiting=5), True),
        (snap(waiting=6), False),
        (snap(usage=None, waiting=None, preemptions=None), True),  # no signal, no verdict
        (None, False),  # the scrape failed
    ],
)
def test_each_health_rule(snapshot: EngineSnapshot | None, healthy: bool) -> None:
    controller = AdmissionController(CAPACITY)
    controller.observe(HEALTHY, at=0)
    expected = 850 if healthy else 595
    assert controller.observe(snapshot, at=1) == expected == controller.limit
    assert controller.healthy is healthy


def test_a_preemption_is_unhealthy_and_a_lower_counter_is_a_restart() -> None:
    controller = AdmissionController(CAPACITY)
    assert controller.observe(snap(preemptions=10), at=0) == 850  # the first is only a baseline
    assert controller.observe(snap(preemptions=10), at=1) == 850
    assert controller.observe(snap(preemptions=11), at=2) == 595
    assert not controller.healthy
    assert controller.observe(snap(preemptions=2), at=3) == 645  # restarted: a new baseline
    assert controller.observe(snap(preemptions=2), at=4) == 695
    assert controller.observe(snap(preemptions=3), at=5) == 486  # 0.695 × 0.7 = 0.4865


def test_the_preemption_baseline_survives_failed_and_partial_scrapes() -> None:
    controller = AdmissionController(CAPACITY)
    controller.observe(snap(preemptions=10), at=0)
    controller.observe(None, at=1)
    controller.observe(snap(preemptions=None), at=2)
    controller.observe(snap(preemptions=10), at=3)
    assert controller.healthy  # 10 again: no rise
    controller.observe(snap(preemptions=12), at=4)
    assert not controller.healthy


def test_never_below_the_floor() -> None:
    controller = AdmissionController(CAPACITY)
    limits = [controller.observe(None, at=t) for t in range(20)]
    assert limits[:3] == [595, 416, 291]  # back off fast
    assert min(limits) == limits[-1] == 100


def test_never_above_the_cap() -> None:
    controller = AdmissionController(CAPACITY)
    assert [controller.observe(HEALTHY, at=t) for t in range(5)] == [850] * 5


def test_converges_monotonically_under_healthy_metrics() -> None:
    controller = AdmissionController(CAPACITY)
    for t in range(20):
        controller.observe(None, at=t)
    limits = [controller.observe(HEALTHY, at=20 + t) for t in range(20)]
    assert limits[:3] == [150, 200, 250]  # recover slowly: + capacity × 5 % per observation
    assert all(a <= b for a, b in itertools.pairwise(limits))
    assert limits.index(850) == 14  # from 10 % to 85 % in 15 steps of 5 %
    assert limits[-1] == 850


@given(st.lists(st.booleans(), max_size=60), st.integers(1, 10**7))
def test_any_history_stays_within_floor_and_cap(verdicts: list[bool], capacity: int) -> None:
    controller = AdmissionController(capacity)
    low, high = -(-capacity // 10), max(-(-capacity // 10), capacity * 85 // 100)
    for t, healthy in enumerate(verdicts):
        before = controller.limit
        after = controller.observe(HEALTHY if healthy else None, at=t)
        assert low <= after <= high
        assert after >= before if healthy else after <= before


def test_stale_metrics_back_off_once_per_silent_interval() -> None:
    controller = AdmissionController(CAPACITY)
    controller.observe(HEALTHY, at=0)
    assert [controller.tick(now=t) for t in (1, 2, 3)] == [850] * 3  # 3 s old: not yet stale
    assert controller.healthy
    assert controller.tick(now=4) == 595
    assert not controller.healthy
    assert controller.tick(now=5) == 416
    assert controller.observe(HEALTHY, at=5.5) == 466  # metrics are back
    assert controller.tick(now=6) == 466


def test_a_failed_scrape_is_not_counted_twice_by_tick() -> None:
    controller = AdmissionController(CAPACITY)
    controller.observe(HEALTHY, at=0)
    for t in range(1, 6):  # stale from t = 4 on, but each interval had its verdict already
        controller.observe(None, at=t)
        controller.tick(now=t)
    assert controller.limit == 142  # five failures, five decreases: 850 × 0.7⁵


def test_staleness_counts_from_the_first_tick_when_nothing_ever_arrived() -> None:
    controller = AdmissionController(CAPACITY)
    assert controller.tick(now=100) == 850
    assert controller.tick(now=103) == 850
    assert controller.tick(now=103.5) == 595


def test_capacity_is_discovered_from_the_engine() -> None:
    controller = AdmissionController(CAPACITY)
    controller.observe(None, at=0)  # fraction 0.595
    assert controller.observe(snap(capacity=4000), at=1) == 2580  # (0.595 + 0.05) × 4000
    assert controller.capacity == 4000
    assert controller.observe(snap(capacity=None), at=2) == 2780  # None: keep what we know


def test_configured_capacity_is_not_overridden() -> None:
    controller = AdmissionController(CAPACITY, capacity_fixed=True)
    assert controller.capacity_fixed
    assert controller.observe(snap(capacity=4000), at=0) == 850
    assert controller.capacity == CAPACITY


def test_custom_tuning() -> None:
    tuning = Tuning(target_utilization=1.0, usage_high=0.95, waiting_high=0, decrease=0.5,
                    increase_fraction=0.25, min_fraction=0.25, stale_after_s=1.0)  # fmt: skip
    controller = AdmissionController(100, tuning)
    assert controller.limit == 100
    assert controller.observe(snap(waiting=1), at=0) == 50
    assert controller.observe(None, at=1) == 25
    assert controller.observe(None, at=2) == 25
    assert controller.observe(snap(usage=0.95, waiting=0), at=3) == 50


@pytest.mark.parametrize(
    "bad",
    [
        {"min_fraction": 0},
        {"min_fraction": 0.9},  # above the target
        {"target_utilization": 1.1},
        {"decrease": 1.0},
        {"decrease": 0},
        {"increase_fraction": 0},
        {"stale_after_s": 0},
    ],
)
def test_nonsense_tuning_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must|need"):
        Tuning(**bad)


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        AdmissionController(0)
