"""GCRA against a naive token bucket (continuous refill, capacity = limit), plus the rules the
module docstring states: burst = limit, exact bursts despite float rounding, unlimited, too
large, refunds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratelimit.gcra import SLACK, UNLIMITED, WINDOW_S, Decision, decide, refund

# Float error of the two models over a whole sequence stays far below this (times <= 1e5 s,
# intervals >= 6 ms: ~1e-9 units per step); closer to a boundary, either answer is right.
TOLERANCE = 1e-6


@dataclass
class TokenBucket:
    """The reference: a float of tokens, refilled continuously at limit/60 per second."""

    limit: int
    tokens: float

    def wait(self, seconds: float) -> None:
        self.tokens = min(self.limit, self.tokens + seconds * self.limit / WINDOW_S)

    def seconds_to(self, tokens: float) -> float:
        return (tokens - self.tokens) * WINDOW_S / self.limit


Step = tuple[float, str, int]  # (seconds since the previous step, "take" | "refund", amount)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, float, list[Step]]:
    limit = draw(st.one_of(st.sampled_from([1, 3, 7, 60, 1000]), st.integers(1, 10_000)))
    start = draw(st.floats(0, 1e5))
    dt = st.one_of(st.just(0.0), st.floats(0, 90), st.sampled_from([0.5, 1.0, 60.0]))
    amount = st.one_of(st.integers(0, limit + 2), st.sampled_from([1, limit]))
    op = st.sampled_from(["take", "take", "take", "refund"])
    return limit, start, draw(st.lists(st.tuples(dt, op, amount), max_size=60))


def near_whole(x: float) -> bool:
    return abs(x - round(x)) < TOLERANCE


@given(scenarios())
def test_gcra_is_the_token_bucket(scenario: tuple[int, float, list[Step]]) -> None:
    limit, now, steps = scenario
    tat, bucket = now, TokenBucket(limit, float(limit))  # a new bucket is full
    for dt, op, amount in steps:
        now += dt
        bucket.wait(dt)
        if op == "refund":
            tat = refund(tat, now, limit, amount)
            bucket.tokens = min(limit, bucket.tokens + amount)
            continue
        tat, decision = decide(tat, now, limit, amount)
        fits = amount <= limit and bucket.tokens + SLACK >= amount
        if abs(bucket.tokens + SLACK - amount) >= TOLERANCE or amount > limit:
            assert decision.allowed == fits
        if decision.allowed:  # at a boundary the reference follows the decision
            bucket.tokens -= amount
        assert_consistent(decision, bucket, amount)


def assert_consistent(decision: Decision, bucket: TokenBucket, amount: int) -> None:
    assert decision.limit == bucket.limit
    assert decision.exceeds_limit == (amount > bucket.limit)
    whole = bucket.tokens + SLACK
    if near_whole(whole):
        assert decision.remaining in {max(0, math.floor(whole + d)) for d in (-1e-5, 1e-5)}
    else:
        assert decision.remaining == max(0, math.floor(whole))
    assert decision.reset_s == pytest.approx(bucket.seconds_to(bucket.limit), abs=TOLERANCE)
    if decision.allowed:
        assert decision.retry_after_s == 0.0
    elif decision.exceeds_limit:
        assert decision.retry_after_s == WINDOW_S
    else:
        assert decision.retry_after_s > 0
        assert decision.retry_after_s == pytest.approx(bucket.seconds_to(amount), abs=TOLERANCE)


tats_and_times = st.tuples(st.floats(-120, 120), st.floats(0, 1e5))  # (tat - now, now)


@given(st.integers(1, 100_000), tats_and_times, st.integers(0, 100_000))
def test_a_refund_allows_again_what_it_gave_back(
    limit: int, at: tuple[float, float], n: int
) -> None:
    offset, now = at
    cost = min(n, limit)
    tat, taken = decide(now + offset, now, limit, cost)
    if taken.allowed:
        tat, again = decide(refund(tat, now, limit, cost), now, limit, cost)
        assert again.allowed
        assert again.remaining == taken.remaining


@given(st.integers(1, 100_000), tats_and_times, st.integers(1, 100_000))
def test_after_retry_after_the_same_cost_fits(limit: int, at: tuple[float, float], n: int) -> None:
    offset, now = at
    cost = min(n, limit)
    tat, denied = decide(now + offset, now, limit, cost)
    if not denied.allowed:
        assert tat == now + offset  # a refusal takes nothing
        assert decide(tat, now + denied.retry_after_s, limit, cost)[1].allowed


@given(st.integers(1, 100_000), tats_and_times, st.integers(0, 100_000))
def test_remaining_and_reset_say_what_fits(limit: int, at: tuple[float, float], n: int) -> None:
    offset, now = at
    tat, decision = decide(now + offset, now, limit, min(n, limit))
    if decision.remaining:  # (0 may not fit either: a TAT beyond now + tau is in debt)
        assert decide(tat, now, limit, decision.remaining)[1].allowed
    if decision.remaining < limit:
        assert not decide(tat, now, limit, decision.remaining + 1)[1].allowed
    assert decide(tat, now + decision.reset_s, limit, 0)[1].remaining == limit


@pytest.mark.parametrize(
    ("limit", "cost"), [(1, 1), (3, 1), (7, 1), (60, 1), (997, 1), (10**6, 997)]
)
def test_a_burst_of_exactly_the_limit_fits(limit: int, cost: int) -> None:
    """``limit * (60 / limit)`` need not be exactly 60 in floats (7 is such a limit)."""
    tat = now = 1234.5
    taken = 0
    while taken + cost <= limit:
        tat, decision = decide(tat, now, limit, cost)
        taken += cost
        assert decision.allowed
        assert decision.remaining == limit - taken
    assert not decide(tat, now, limit, limit - taken + 1)[1].allowed


def test_sixty_rpm_is_sixty_at_once_then_one_per_second() -> None:
    tat = now = 100.0
    for _ in range(60):
        tat, decision = decide(tat, now, 60, 1)
    assert decision == Decision(True, 60, 0, 60.0, 0.0)
    assert decide(tat, now, 60, 1) == (tat, Decision(False, 60, 0, 60.0, 1.0))
    assert decide(tat, now + 0.5, 60, 1)[1].retry_after_s == 0.5
    tat, decision = decide(tat, now + 1.0, 60, 1)
    assert decision == Decision(True, 60, 0, 60.0, 0.0)
    assert decide(tat, now + 61.0, 60, 0)[1] == Decision(True, 60, 60, 0.0, 0.0)


def test_a_new_bucket_is_full() -> None:
    tat, decision = decide(float("-inf"), 5.0, 10, 10)
    assert decision == Decision(True, 10, 0, 60.0, 0.0)
    assert tat == 65.0


def test_zero_is_unlimited() -> None:
    assert decide(50.0, 10.0, 0, 10**9) == (50.0, Decision(True, 0, UNLIMITED, 0.0, 0.0))
    assert refund(50.0, 10.0, 0, 10**9) == 50.0


def test_more_than_the_limit_never_fits() -> None:
    assert decide(0.0, 10.0, 100, 101) == (0.0, Decision(False, 100, 100, 0.0, 60.0, True))
    assert decide(0.0, 10.0, 100, 100)[1].allowed


def test_a_refund_never_fills_beyond_the_limit_nor_takes() -> None:
    tat, _ = decide(0.0, 10.0, 60, 30)
    assert tat == 40.0
    assert refund(tat, 10.0, 60, 10) == 30.0
    assert refund(tat, 10.0, 60, 1000) == 10.0  # full, not fuller
    assert refund(5.0, 10.0, 60, 1) == 5.0  # already full: the TAT never moves forward


@pytest.mark.parametrize(("limit", "amount"), [(-1, 1), (60, -1)])
def test_negative_values_are_refused(limit: int, amount: int) -> None:
    with pytest.raises(ValueError, match="negative"):
        decide(0.0, 0.0, limit, amount)
    with pytest.raises(ValueError, match="negative"):
        refund(0.0, 0.0, limit, amount)
