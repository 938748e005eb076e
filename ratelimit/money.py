"""Money counters reserved in the rate limits' own call (budgets: ``gateway.admission.spending``).

A request's budgets are counters of what their subjects spent in their current windows, in
integer nano-units; ``Money`` asks to reserve ``amount`` on each, all or nothing, in the same
backend call that takes its rate-limit buckets (``ratelimit.limits``): with Redis, one script
and one round trip for both, and nothing taken anywhere unless both allow. Settlement adds the
difference between what the request cost and what it reserved, with the tokens' refund.

Rules:

- A counter's limit of ``SOFT`` (-1) never refuses: a soft budget counts, and only alerts.
- A refusal names the 1-based counter that would pass its limit and what that counter holds
  (``Spent(refused=i, values=(held,))``); the counters are checked in the order given.
- A settlement touches only counters that still exist: a window that ended (its counter
  expired in Redis, or was never made here) is not revived by a late refund.
- Counters outlive their window (``KEEP_S``: the longest month, and a day's margin) and then
  vanish; their names carry the window (``gateway.spend.budgets.window``), so a new window
  starts at 0.

``MemoryCounters`` is the same rule in this process (the backend of ``MemoryBackend``): without
Redis, or with Redis away and ``RATELIMIT_FAIL=open``. It keeps the windows it has seen; a
replica restarts long before that matters (a few counters per budget per day).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SOFT = -1
KEEP_S = 32 * 86400


@dataclass(frozen=True, slots=True)
class Money:
    """Reserve ``amount`` (>= 0) on every counter (``counters[i]`` under ``limits[i]``, one
    limit each: a nano-unit count, or ``SOFT``); made per request, on the admission's path, so
    its maker (``gateway.admission.spending``) keeps these rules rather than a check here."""

    counters: tuple[str, ...]
    limits: tuple[int, ...]
    amount: int


@dataclass(frozen=True, slots=True)
class Spent:
    """``refused`` 0: reserved, ``values`` each counter after; else the 1-based counter that
    refused and ``(what it holds,)``."""

    refused: int
    values: tuple[int, ...]

    @classmethod
    def of(cls, reply: Sequence[int]) -> Spent:
        """From the script's reply (Redis integers)."""
        return cls(reply[0], tuple(reply[1:]))


class MemoryCounters:
    """Each tenant's counters, by name."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], int] = {}

    def reserve(self, tenant: str, money: Money) -> Spent:
        held, amount = self.held, money.amount
        names = [(tenant, name) for name in money.counters]
        for i, (name, limit) in enumerate(zip(names, money.limits, strict=True), 1):
            spent = held.get(name, 0)
            if limit != SOFT and spent + amount > limit:
                return Spent(i, (spent,))
        after = []
        for name in names:
            held[name] = value = held.get(name, 0) + amount
            after.append(value)
        return Spent(0, tuple(after))

    def settle(self, tenant: str, counters: Sequence[str], delta: int) -> None:
        held = self.held
        for name in counters:
            if (tenant, name) in held:
                held[tenant, name] += delta

    def spent(self, tenant: str, counters: Sequence[str]) -> list[int]:
        return [self.held.get((tenant, name), 0) for name in counters]
