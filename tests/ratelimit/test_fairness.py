"""Fair share and priority: each rule of ``decide``, the wake-up order, and the properties of
``share`` (whole tokens summing to the limit, proportional to the weights)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratelimit.fairness import Decision, Priority, Request, decide, queue_order, share

LIMIT = 1000
PRIORITIES: tuple[Priority, ...] = ("critical", "standard", "sheddable")


def ask(
    tenant: str,
    tokens: int,
    priority: Priority = "standard",
    *,
    held: dict[str, int] | None = None,
    waiting: tuple[str, ...] = (),
    weights: dict[str, float] | None = None,
) -> Decision:
    by_tenant = held or {}
    return decide(
        Request(tenant, tokens, priority),
        limit=LIMIT,
        reserved=sum(by_tenant.values()),
        by_tenant=by_tenant,
        waiting=waiting,
        weights=weights,
    )


# --- share --------------------------------------------------------------------------------------


def test_equal_weights_split_evenly() -> None:
    assert share(1000, {}, ["a", "b"]) == {"a": 500, "b": 500}
    assert share(1000, {}, ["a", "b", "c"]) == {"a": 334, "b": 333, "c": 333}  # a sorts first


def test_weights_are_proportional_and_default_to_one() -> None:
    assert share(1000, {"a": 3}, ["a", "b"]) == {"a": 750, "b": 250}
    assert share(1000, {"a": 0.5, "z": 9}, ["a", "b", "c"]) == {"a": 200, "b": 400, "c": 400}


def test_no_active_tenant_no_shares() -> None:
    assert share(1000, {"a": 2}, []) == {}


@pytest.mark.parametrize("weight", [0.0, -1.0, float("inf"), float("nan")])
def test_weights_must_be_positive_and_finite(weight: float) -> None:
    with pytest.raises(ValueError, match="weight"):
        share(1000, {"a": weight}, ["a", "b"])


@given(
    st.integers(0, 10**9),
    st.dictionaries(
        st.text(min_size=1, max_size=4),
        st.floats(min_value=0.01, max_value=1000, allow_nan=False),
        min_size=1,
        max_size=12,
    ),
)
def test_shares_sum_to_the_limit_in_proportion_to_weights(
    limit: int, weights: dict[str, float]
) -> None:
    shares = share(limit, weights, weights)
    assert set(shares) == set(weights)
    assert sum(shares.values()) <= limit
    assert sum(shares.values()) == limit  # largest remainder: nothing is left unassigned
    total = sum(Fraction(w) for w in weights.values())
    for tenant, weight in weights.items():
        assert abs(shares[tenant] - limit * Fraction(weight) / total) < 1
    ordered = sorted(weights, key=lambda t: weights[t])
    assert all(shares[a] <= shares[b] + 1 for a, b in itertools.pairwise(ordered))


# --- fit and fairness ----------------------------------------------------------------------------


def test_admits_what_fits_when_nobody_else_waits() -> None:
    assert ask("a", 300, held={"a": 500}) == "admit"  # above its share, but nobody is waiting
    assert ask("a", 300, held={"a": 500}, waiting=("a",)) == "admit"  # only itself waits


def test_within_its_share_a_tenant_is_admitted_while_others_wait() -> None:
    assert ask("a", 400, held={"a": 100}, waiting=("b",)) == "admit"  # 500 of a 500 share


def test_above_its_share_a_tenant_waits_while_others_wait() -> None:
    assert ask("a", 200, held={"a": 400}, waiting=("b",)) == "wait"


def test_active_tenants_are_those_holding_or_waiting() -> None:
    held = {"a": 100, "b": 200, "idle": 0}  # "idle" holds nothing: not active
    assert ask("a", 234, held=held, waiting=("c",)) == "admit"  # a third of 1000: 334 for a
    assert ask("a", 235, held=held, waiting=("c",)) == "wait"


def test_weights_set_the_share() -> None:
    assert ask("a", 700, waiting=("b",), weights={"a": 3}) == "admit"  # 750 of 1000
    assert ask("a", 700, waiting=("b",)) == "wait"  # 500 of 1000


def test_what_does_not_fit_waits() -> None:
    assert ask("a", 200, "critical", held={"b": 900}) == "wait"
    assert ask("a", 1001, "critical") == "wait"  # never fits: the caller decides to refuse


# --- priority under pressure ---------------------------------------------------------------------


def test_below_the_pressure_threshold_every_priority_is_admitted() -> None:
    for priority in PRIORITIES:
        assert ask("a", 100, priority, held={"b": 800}) == "admit"  # 900: not above 90 %


def test_under_pressure_sheddable_is_rejected_standard_waits_critical_is_admitted() -> None:
    held = {"b": 850}  # + 100 = 950: fits, but above 90 % of the limit
    assert ask("a", 100, "sheddable", held=held) == "reject"
    assert ask("a", 100, "standard", held=held) == "wait"
    assert ask("a", 100, "critical", held=held) == "admit"


def test_sheddable_that_does_not_fit_is_rejected_not_queued() -> None:
    assert ask("a", 300, "sheddable", held={"b": 800}) == "reject"


def test_critical_work_still_respects_fair_share() -> None:
    assert ask("a", 150, "critical", held={"a": 800}, waiting=("b",)) == "wait"


def test_pressure_threshold_is_a_fraction_of_the_limit() -> None:
    request = Request("a", 100, "sheddable")
    assert decide(request, limit=LIMIT, reserved=850, by_tenant={}, pressure_threshold=1.0) == (
        "admit"
    )
    with pytest.raises(ValueError, match="pressure_threshold"):
        decide(request, limit=LIMIT, reserved=0, by_tenant={}, pressure_threshold=1.5)


@given(
    st.integers(0, 2000),
    st.integers(1, 1500),
    st.sampled_from(PRIORITIES),
    st.lists(st.sampled_from("abc"), max_size=3),
)
def test_never_admits_beyond_the_limit_and_rejects_only_sheddable(
    reserved: int, tokens: int, priority: Priority, waiting: list[str]
) -> None:
    verdict = ask("a", tokens, priority, held={"b": reserved}, waiting=tuple(waiting))
    if verdict == "admit":
        assert reserved + tokens <= LIMIT
    if verdict == "reject":
        assert priority == "sheddable" and reserved + tokens > LIMIT * 0.9


# --- wake-up order -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiter:
    name: str
    priority: Priority
    arrived: float


def test_queue_order_puts_critical_first_then_arrival() -> None:
    waiters = [
        Waiter("s1", "standard", 1),
        Waiter("x1", "sheddable", 0),
        Waiter("c2", "critical", 5),
        Waiter("s0", "standard", 0.5),
        Waiter("c1", "critical", 3),
    ]
    assert [w.name for w in queue_order(waiters)] == ["c1", "c2", "s0", "s1", "x1"]


def test_queue_order_keeps_ties_in_given_order() -> None:
    waiters = [Waiter(str(i), "standard", 7) for i in range(5)]
    assert queue_order(waiters) == waiters
