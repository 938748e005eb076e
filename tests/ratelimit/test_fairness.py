"""Fair share, priority and routing: the exact weighted-share rule (``within_share``,
``weight_of``), each rule of ``decide``, the wake-up order, and ``route`` over several engines."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratelimit.fairness import (
    MAX_WEIGHT,
    SHEDDABLE_SHARE,
    Decision,
    EngineBook,
    Priority,
    Request,
    decide,
    queue_order,
    route,
    weight_of,
    within_share,
)

LIMIT = 1000
PRIORITIES: tuple[Priority, ...] = ("critical", "standard", "sheddable")
TENANTS = "abcd"


def ask(
    tenant: str,
    tokens: int,
    priority: Priority = "standard",
    *,
    held: dict[str, int] | None = None,
    waiting: tuple[str, ...] = (),
    weights: dict[str, int] | None = None,
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


def fits_share(
    tenant: str,
    tokens: int,
    *,
    held: dict[str, int] | None = None,
    active: tuple[str, ...] = (),
    weights: dict[str, int] | None = None,
) -> bool:
    return within_share(tenant, tokens, LIMIT, held or {}, active, weights or {})


# --- weights -------------------------------------------------------------------------------------


def test_an_unlisted_tenant_weighs_one() -> None:
    assert weight_of({}, "a") == 1
    assert weight_of({"b": 7}, "a") == 1
    assert weight_of({"a": 7}, "a") == 7
    assert weight_of({"a": MAX_WEIGHT}, "a") == MAX_WEIGHT


@pytest.mark.parametrize("weight", [0, -1, MAX_WEIGHT + 1, 1.0, 2.5, True, False, "2", None])
def test_a_weight_is_a_whole_number_in_range(weight: object) -> None:
    weights: dict[str, Any] = {"a": weight}  # what a careless caller might pass
    with pytest.raises(ValueError, match="weight"):
        weight_of(weights, "a")
    with pytest.raises(ValueError, match="weight"):
        within_share("b", 1, LIMIT, {}, ["a"], weights)  # an active tenant's weight is checked
    with pytest.raises(ValueError, match="weight"):
        ask("b", 1, held={"a": 1}, waiting=("c",), weights=weights)


# --- within_share --------------------------------------------------------------------------------


def test_the_share_is_exact_at_its_boundary() -> None:
    assert fits_share("a", 500, active=("b",))
    assert not fits_share("a", 501, active=("b",))
    # a third of 1000 is 333.33…: 333 fits, 334 does not (no rounding up, no float error)
    assert fits_share("a", 333, active=("b", "c"))
    assert not fits_share("a", 334, active=("b", "c"))


def test_what_a_tenant_holds_counts_towards_its_share() -> None:
    assert fits_share("a", 100, held={"a": 400, "b": 900}, active=("a", "b"))
    assert not fits_share("a", 101, held={"a": 400, "b": 900}, active=("a", "b"))


def test_the_requester_is_counted_once_whether_or_not_listed_active() -> None:
    assert fits_share("a", 500, active=("b",)) == fits_share("a", 500, active=("a", "b", "a"))
    assert fits_share("a", 1000)  # alone: the whole limit
    assert not fits_share("a", 1001)


def test_weights_are_proportional_and_default_to_one() -> None:
    assert fits_share("a", 750, active=("b",), weights={"a": 3})
    assert not fits_share("a", 751, active=("b",), weights={"a": 3})
    assert fits_share("b", 250, active=("a",), weights={"a": 3})
    assert not fits_share("b", 251, active=("a",), weights={"a": 3})
    # an inactive tenant's weight changes nothing
    assert fits_share("a", 500, active=("b",), weights={"z": 9})
    assert not fits_share("a", 501, active=("b",), weights={"z": 9})


@given(
    st.integers(0, 10**9),
    st.dictionaries(st.text(min_size=1, max_size=4), st.integers(1, MAX_WEIGHT), min_size=1,
                    max_size=12),
)  # fmt: skip
def test_shares_are_proportional_to_weights_and_never_oversubscribe(
    limit: int, weights: dict[str, int]
) -> None:
    active = list(weights)
    total = sum(weights.values())
    caps = {}
    for tenant, weight in weights.items():
        cap = math.floor(Fraction(limit * weight, total))  # the exact share, in rationals
        assert within_share(tenant, cap, limit, {}, active, weights)
        assert not within_share(tenant, cap + 1, limit, {}, active, weights)
        caps[tenant] = cap
    assert limit - len(weights) < sum(caps.values()) <= limit
    ordered = sorted(weights, key=lambda t: weights[t])
    assert all(caps[a] <= caps[b] for a, b in itertools.pairwise(ordered))


# --- fit and fairness ----------------------------------------------------------------------------


def test_admits_what_fits_when_nobody_else_waits() -> None:
    assert ask("a", 300, held={"a": 500}) == "admit"  # above its share, but nobody is waiting
    assert ask("a", 300, held={"a": 500}, waiting=("a",)) == "admit"  # only itself waits


def test_within_its_share_a_tenant_is_admitted_while_others_wait() -> None:
    assert ask("a", 400, held={"a": 100}, waiting=("b",)) == "admit"  # 500 of a 500 share
    assert ask("a", 401, held={"a": 100}, waiting=("b",)) == "wait"


def test_above_its_share_a_tenant_waits_while_others_wait() -> None:
    assert ask("a", 200, held={"a": 400}, waiting=("b",)) == "wait"


def test_active_tenants_are_those_holding_or_waiting() -> None:
    held = {"a": 100, "b": 200, "idle": 0}  # "idle" holds nothing: not active
    assert ask("a", 233, held=held, waiting=("c",)) == "admit"  # 333 of 1000/3
    assert ask("a", 234, held=held, waiting=("c",)) == "wait"


def test_weights_set_the_share() -> None:
    assert ask("a", 700, waiting=("b",), weights={"a": 3}) == "admit"  # 750 of 1000
    assert ask("a", 751, waiting=("b",), weights={"a": 3}) == "wait"
    assert ask("a", 700, waiting=("b",)) == "wait"  # 500 of 1000
    assert ask("a", 300, waiting=("b",), weights={"b": 3}) == "wait"  # 250 of 1000


def test_what_does_not_fit_waits() -> None:
    assert ask("a", 200, "critical", held={"b": 900}) == "wait"
    assert ask("a", 1001, "critical") == "wait"  # never fits: the caller decides to refuse


# --- priority under pressure ---------------------------------------------------------------------


def test_below_the_pressure_threshold_every_priority_is_admitted() -> None:
    for priority in PRIORITIES:
        assert ask("a", 100, priority, held={"b": 575}) == "admit"  # 675: 3/4 of 90 %
    for priority in ("standard", "critical"):
        assert ask("a", 100, priority, held={"b": 800}) == "admit"  # 900: not above 90 %


def test_sheddable_work_stops_short_of_where_standard_work_would_wait() -> None:
    """Sheddable work (batch lines) fills at most 3/4 of the pressure line: the rest is for
    the interactive work that would otherwise wait behind it."""
    assert ask("a", 100, "sheddable", held={"b": 576}) == "reject"  # 676 > 675
    assert ask("a", 100, "standard", held={"b": 576}) == "admit"


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
    assert decide(request, limit=LIMIT, reserved=650, by_tenant={}, pressure_threshold=1.0) == (
        "admit"  # 750: 3/4 of the whole limit
    )
    for nonsense in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="pressure_threshold"):
            decide(request, limit=LIMIT, reserved=0, by_tenant={}, pressure_threshold=nonsense)


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
        assert priority == "sheddable" and reserved + tokens > LIMIT * 0.9 * SHEDDABLE_SHARE


# --- route ---------------------------------------------------------------------------------------


def book(
    limit: int, tokens: int, held: dict[str, int] | None = None, waiting: str = ""
) -> EngineBook:
    return EngineBook(limit, tokens, held or {}, tuple(waiting))


def test_route_picks_the_engine_with_the_most_free_budget() -> None:
    engines = [book(100, 10, {"x": 60}), book(100, 10, {"x": 20}), book(50, 10)]  # free 40, 80, 50
    assert route("a", "standard", engines) == ("admit", 1)
    assert route("a", "standard", engines[::2]) == ("admit", 1)  # 50 free beats 40


def test_route_keeps_the_given_order_between_equally_free_engines() -> None:
    assert route("a", "standard", [book(100, 10), book(100, 10)]) == ("admit", 0)
    equal = [book(100, 10, {"x": 50}), book(50, 10)]  # both have 50 free
    assert route("a", "standard", equal) == ("admit", 0)
    assert route("a", "standard", equal[::-1]) == ("admit", 0)


def test_route_skips_an_engine_that_does_not_admit() -> None:
    # the freest engine is under pressure for this request (its block size makes it 100 there)
    pressured, roomy = book(1000, 100, {"x": 850}), book(100, 10)  # free 150 and 100
    assert route("a", "sheddable", [pressured, roomy]) == ("admit", 1)
    assert route("a", "sheddable", [pressured]) == ("reject", None)
    assert route("a", "standard", [roomy, pressured]) == ("admit", 0)


def test_route_waits_if_any_engine_would_let_it_wait() -> None:
    pressured = book(100, 20, {"x": 80})  # sheddable: rejected
    unfair = book(1000, 200, {"a": 400}, waiting="b")  # a is above its share while b waits
    assert route("a", "sheddable", [pressured, unfair]) == ("wait", None)
    assert route("a", "sheddable", [unfair, pressured]) == ("wait", None)
    assert route("a", "sheddable", [pressured, pressured]) == ("reject", None)
    assert route("a", "standard", [pressured, unfair]) == ("wait", None)
    assert route("a", "critical", [pressured, unfair]) == ("admit", 0)  # the headroom is its own


def test_route_passes_weights_and_threshold_on() -> None:
    unfair = book(1000, 200, {"a": 400}, waiting="b")  # 600 of 1000: a needs weight 2 or more
    assert route("a", "standard", [unfair], weights={"a": 2}) == ("admit", 0)
    pressured = book(100, 20, {"x": 55})  # 75: 3/4 of the whole limit
    assert route("a", "sheddable", [pressured], pressure_threshold=1.0) == ("admit", 0)


def test_route_needs_an_engine() -> None:
    with pytest.raises(ValueError, match="at least one engine"):
        route("a", "standard", [])


engine_books = st.builds(
    EngineBook,
    limit=st.integers(0, 300),
    tokens=st.integers(1, 200),
    by_tenant=st.dictionaries(st.sampled_from(TENANTS), st.integers(1, 150), max_size=3),
    waiting=st.lists(st.sampled_from(TENANTS), max_size=3),
)


@given(
    st.sampled_from(TENANTS),
    st.sampled_from(PRIORITIES),
    st.lists(engine_books, min_size=1, max_size=4),
    st.dictionaries(st.sampled_from(TENANTS), st.integers(1, 5)),
    st.sampled_from([0.5, 0.9, 1.0]),
)
def test_route_admits_only_where_decide_admits_and_the_request_fits(
    tenant: str,
    priority: Priority,
    engines: list[EngineBook],
    weights: dict[str, int],
    threshold: float,
) -> None:
    def verdict(e: EngineBook) -> Decision:
        return decide(Request(tenant, e.tokens, priority), limit=e.limit, reserved=e.reserved,
                      by_tenant=e.by_tenant, waiting=e.waiting, weights=weights,
                      pressure_threshold=threshold)  # fmt: skip

    decision, index = route(tenant, priority, engines, weights=weights,
                            pressure_threshold=threshold)  # fmt: skip
    verdicts = [verdict(e) for e in engines]
    if decision == "admit":
        assert index is not None
        chosen = engines[index]
        assert chosen.reserved + chosen.tokens <= chosen.limit
        assert verdicts[index] == "admit"
        free = chosen.limit - chosen.reserved
        for i, (e, v) in enumerate(zip(engines, verdicts, strict=True)):
            if v == "admit":  # no admitting engine is freer, nor as free and listed earlier
                assert e.limit - e.reserved < free or (e.limit - e.reserved == free and i >= index)
    else:
        assert index is None
        assert "admit" not in verdicts
        assert decision == ("wait" if "wait" in verdicts else "reject")


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
