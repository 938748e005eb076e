"""Budgets in money (sans-I/O): what one is, its UTC window, what a request reserves.

- A budget caps what a key or a tenant (``scope``) spends per UTC day or month (``period``), in
  the prices' currency; ``soft`` ones only alert. Amounts are counted in nano-units (10⁻⁹ of
  the currency, ``QUANTUM``), integers, so a shared counter adds them exactly.
- ``window(period, now)``: the window's name (``d2026-12-05``, ``m2026-12``) and when it ends.
- ``reservation(price, prompt_tokens, max_tokens)``: the request's most expensive outcome, its
  prompt at ``input`` and every token it may produce at the dearer of ``output`` and
  ``reasoning``, plus ``per_request``: reserved before admission, settled to what the engine
  produced when it ends (as TPM is).
- ``spent(price, usage)``: what the exchange cost in nano-units, exactly ``nano`` of
  ``gateway.spend.prices.cost`` (what its record says), with integers where the prices allow.
"""

from __future__ import annotations

import calendar
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from typing import Literal, TypeVar, cast

from audit.record import Usage
from gateway.spend.prices import MILLION, QUANTUM, Price, cost

Scope = Literal["tenant", "key"]
Period = Literal["day", "month"]
NANO = Decimal(1) / QUANTUM  # nano-units per unit


@dataclass(frozen=True, slots=True)
class MoneyBudget:
    scope: Scope
    subject: str  # the tenant's name or the key's id
    period: Period
    amount: Decimal
    soft: bool = False

    @property
    def limit(self) -> int:
        return nano(self.amount)

    def describe(self, currency: str) -> str:
        kind = "daily" if self.period == "day" else "monthly"
        owner = f"tenant {self.subject}" if self.scope == "tenant" else f"key {self.subject}"
        return f"the {kind} budget of {owner}, {self.amount} {currency}"


def nano(amount: Decimal) -> int:
    return int((amount * NANO).to_integral_value())


def units(nanos: int) -> Decimal:
    return (Decimal(nanos) / NANO).quantize(QUANTUM)


def window(period: Period, now: float) -> tuple[str, float]:
    """The UTC window ``now`` falls in: its name and the time it ends (the budget resets)."""
    known = _windows.get(period)
    if known is None or not known[1] <= now < known[2]:
        known = _windows[period] = _window(period, now)
    return known[0], known[2]


_windows: dict[str, tuple[str, float, float]] = {}  # per period, the last window found


def _window(period: Period, now: float) -> tuple[str, float, float]:
    """The window's name, start and end."""
    at = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = datetime(at.year, at.month, at.day, tzinfo=UTC)
        return f"d{start:%Y-%m-%d}", start.timestamp(), start.timestamp() + 86400
    days = calendar.monthrange(at.year, at.month)[1]
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    return f"m{start:%Y-%m}", start.timestamp(), start.timestamp() + days * 86400


def reservation(price: Price, prompt_tokens: int, max_tokens: int) -> int:
    """The most a request may cost, in nano-units (rounded up: a reservation never falls
    short of the cost it stands for)."""
    rates = _by_price(_RATES, price, _rates)
    if rates is not None:  # integers: what every admission pays for, kept cheap
        per_input, per_output, per_request = rates
        pico = prompt_tokens * per_input + max_tokens * per_output
        return -(-pico // 1000) + per_request
    dearest = max(price.output, price.reasoning)
    most = (prompt_tokens * price.input + max_tokens * dearest) / MILLION + price.per_request
    return nano(most.quantize(QUANTUM, rounding=ROUND_CEILING))


def _by_price(cache: dict[int, tuple[Price, _T]], price: Price, compute: Callable[[Price], _T]
              ) -> _T:  # fmt: skip
    """``compute(price)``, kept per price object: a ``Price`` hashes its five decimals, too
    slow for every admission; the cache holds the price, so its id stays its own."""
    found = cache.get(id(price))
    if found is None or found[0] is not price:
        if len(cache) >= 1024:
            cache.clear()
        found = cache[id(price)] = (price, compute(price))
    return found[1]


def _rates(price: Price) -> tuple[int, int, int] | None:
    """Per token in pico-units (a price per million × 10⁶) and per request in nano-units, when
    they are whole there (prices of up to six decimals); ``None`` otherwise."""
    per_input = price.input * MILLION
    per_output = max(price.output, price.reasoning) * MILLION
    per_request = price.per_request * NANO
    found = (per_input, per_output, per_request)
    if any(x != x.to_integral_value() for x in found):
        return None
    return int(per_input), int(per_output), int(per_request)


def spent(price: Price, usage: Usage | None) -> int:
    """What the exchange cost, in nano-units: ``nano(cost(price, usage))``, computed in
    integers (pico-units, rounded half to even as ``Decimal.quantize``) when the prices have at
    most six decimals per million tokens."""
    usage = usage or _NOTHING
    rates = _by_price(_COST_RATES, price, _cost_rates)
    if rates is None:
        return nano(cost(price, usage))
    per_input, per_cached, per_output, per_reasoning, per_request = rates
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    reasoning = min(usage.reasoning_tokens, usage.completion_tokens)
    prompt, completion = usage.prompt_tokens - cached, usage.completion_tokens - reasoning
    pico = prompt * per_input + cached * per_cached
    pico += completion * per_output + reasoning * per_reasoning
    whole, rest = divmod(pico, 1000)
    if rest > 500 or (rest == 500 and whole % 2):
        whole += 1
    return whole + per_request


_NOTHING = Usage()
_T = TypeVar("_T")
_RATES: dict[int, tuple[Price, tuple[int, int, int] | None]] = {}
_COST_RATES: dict[int, tuple[Price, tuple[int, int, int, int, int] | None]] = {}


def _cost_rates(price: Price) -> tuple[int, int, int, int, int] | None:
    """Each rate per token in pico-units and per request in nano-units, when whole there."""
    found = (price.input * MILLION, price.cached_input * MILLION, price.output * MILLION,
             price.reasoning * MILLION, price.per_request * NANO)  # fmt: skip
    if any(x != x.to_integral_value() for x in found):
        return None
    return cast(tuple[int, int, int, int, int], tuple(int(x) for x in found))


def resets_at(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")
