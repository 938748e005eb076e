"""Budgets' windows and reservations (``gateway.spend.budgets``): UTC days and months, the most
expensive outcome at the dearer of the output prices, amounts as exact nano-units."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from audit.record import Usage
from gateway.spend.budgets import MoneyBudget, nano, reservation, resets_at, spent, units, window
from gateway.spend.prices import Price, cost


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_utc_windows_and_their_ends() -> None:
    assert window("day", at("2026-12-05T23:59:59")) == ("d2026-12-05", at("2026-12-06T00:00:00"))
    assert window("day", at("2026-12-06T00:00:00"))[0] == "d2026-12-06"
    assert window("month", at("2026-02-14T12:00:00")) == ("m2026-02", at("2026-03-01T00:00:00"))
    assert window("month", at("2026-12-31T23:00:00"))[1] == at("2027-01-01T00:00:00")
    assert resets_at(at("2027-01-01T00:00:00")) == "2027-01-01T00:00:00Z"


def test_a_reservation_is_the_most_expensive_outcome() -> None:
    price = Price(Decimal("0.55"), Decimal("0.14"), Decimal("2.19"), Decimal("3"), Decimal("0.01"))
    # 1,000 prompt tokens at 0.55, 500 tokens at the dearer of output and reasoning (3), per
    # million, plus the request's own 0.01
    assert units(reservation(price, 1_000, 500)) == Decimal("0.012050000")


def test_amounts_are_exact_nano_units() -> None:
    assert nano(Decimal("0.000000001")) == 1 and units(3) == Decimal("0.000000003")
    budget = MoneyBudget("key", "k1", "day", Decimal("5.25"))
    assert budget.limit == 5_250_000_000
    assert budget.describe("EUR") == "the daily budget of key k1, 5.25 EUR"


def test_a_price_of_many_decimals_is_reserved_exactly_and_rounded_up() -> None:
    fine = Price(Decimal("0.1234567"), Decimal(0), Decimal("1.0000001"), Decimal(0))
    # 3 × 0.1234567 + 7 × 1.0000001 = 7.3703708 per million tokens: 7,370.3708 nano-units
    assert reservation(fine, 3, 7) == 7_371  # rounded up
    whole = Price(Decimal("0.5"), Decimal(0), Decimal("1"), Decimal(0))
    assert reservation(whole, 3, 7) == 8_500  # 1.5 + 7 per million: 8,500 nano-units


_decimals = st.integers(0, 10**8).flatmap(
    lambda n: st.sampled_from([Decimal(n).scaleb(-e) for e in (0, 2, 6, 9)])
)
_usages = st.builds(
    Usage, prompt_tokens=st.integers(0, 10**6), completion_tokens=st.integers(0, 10**6),
    reasoning_tokens=st.integers(0, 10**6), cached_tokens=st.integers(0, 10**6),
)  # fmt: skip


@given(input_=_decimals, cached=_decimals, output=_decimals, reasoning=_decimals,
       per_request=_decimals, usage=st.one_of(st.none(), _usages))  # fmt: skip
def test_a_settlement_is_exactly_what_the_record_says(
    input_: Decimal, cached: Decimal, output: Decimal, reasoning: Decimal,
    per_request: Decimal, usage: Usage | None,
) -> None:  # fmt: skip
    """``spent`` (integers where the prices allow) is ``nano`` of the record's cost, rounding
    included (half to even, as ``Decimal.quantize``)."""
    price = Price(input_, cached, output, reasoning, per_request)
    assert spent(price, usage) == nano(cost(price, usage or Usage()))


def test_a_half_nano_rounds_to_even() -> None:
    price = Price(Decimal("0.0005"), Decimal(0), Decimal(0), Decimal(0))  # half a nano per token
    for tokens in (1, 3, 5):
        assert spent(price, Usage(prompt_tokens=tokens)) == nano(
            cost(price, Usage(prompt_tokens=tokens))
        )
    assert [spent(price, Usage(prompt_tokens=t)) for t in (1, 3, 5)] == [0, 2, 2]
