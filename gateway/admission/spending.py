"""Budgets in money, enforced before admission on every surface (docs/spend.md).

- **Definitions** (``BudgetBook``): ``gateway_budgets`` in the gateway's database, one row per
  (scope, subject, period); every replica reads them at most ``BOOK_TTL_S`` old (at once on the
  replica that set one).
- **Counters**: what each budget's subject spent in its current UTC window, in nano-units, kept
  by the rate limits' backend (``ratelimit.money``): in Redis when configured, shared by every
  replica and reserved in the rate limits' own script (one round trip, all or nothing), else in
  this process; Redis away: ``RATELIMIT_FAIL`` decides, as for the rate limits
  (``gateway.admission.circuit``).
- **Reserve, then settle**: ``Spending.ask`` prices a request's most expensive outcome
  (``gateway.spend.budgets.reservation``) against the hard budgets of its key and tenant
  (``SpendAsk``); the limiter reserves it with the request's rate limits
  (``gateway.admission.ratelimits``). Over one: 429 ``budget_exceeded`` naming the budget and
  when it resets. When the exchange ends, the reservation is settled to what the engine
  produced (``SpendAsk.cost``), with the tokens' refund: a request overshoots a budget by
  nothing; several at once by at most what they reserved beyond what they then cost. Soft
  budgets count and never refuse; passing one is logged and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import Boolean, Column, Float, String, Table, delete, select

from audit.record import Usage
from audit.sqlasync import AsyncEngine
from gateway.admission.circuit import Circuit
from gateway.auth.keys import KeyInfo
from gateway.db import metadata
from gateway.errors import RateLimited
from gateway.spend.budgets import (
    MoneyBudget,
    Period,
    Scope,
    reservation,
    resets_at,
    spent,
    units,
)
from gateway.spend.budgets import window as window_of
from gateway.spend.prices import Price, Prices
from ratelimit.limits import RateLimitBackend
from ratelimit.money import SOFT, Money, Spent

log = logging.getLogger("thinkgate")
BOOK_TTL_S = 5.0
budgets_table = Table(
    "gateway_budgets",
    metadata,
    Column("scope", String(8), primary_key=True),
    Column("subject", String(64), primary_key=True),
    Column("period", String(8), primary_key=True),
    Column("amount", String(40), nullable=False),  # a decimal, in the prices' currency
    Column("soft", Boolean, nullable=False, default=False),
    Column("updated_at", Float, nullable=False),
)


_Found = tuple[list[MoneyBudget], dict[tuple[str, str], list[MoneyBudget]]]  # all, by subject


class BudgetBook:
    """The budgets, in the database; read through a short cache: one read at a time, whatever
    the requests waiting for it, and an expired cache served while it is read again (a budget
    set here is in force at once: the cache is dropped, not served stale)."""

    def __init__(self, engine: AsyncEngine, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self._engine = engine
        self._clock = clock
        self._cached: tuple[float, _Found] | None = None
        self._generation = 0  # bumped by every change made here: older reads are not kept
        self._loading: tuple[int, asyncio.Future[_Found]] | None = None

    async def set(self, budget: MoneyBudget) -> None:
        row = {"scope": budget.scope, "subject": budget.subject, "period": budget.period,
               "amount": str(budget.amount), "soft": budget.soft,
               "updated_at": time.time()}  # fmt: skip
        where = self._where(budget.scope, budget.subject, budget.period)
        async with self._engine.begin() as conn:
            await conn.execute(delete(budgets_table).where(*where))
            await conn.execute(budgets_table.insert().values(**row))
        self._changed()

    async def remove(self, scope: Scope, subject: str, period: Period) -> bool:
        async with self._engine.begin() as conn:
            gone = await conn.execute(delete(budgets_table).where(
                *self._where(scope, subject, period)))  # fmt: skip
        self._changed()
        return bool(gone.rowcount)

    def _changed(self) -> None:
        self._cached = None
        self._generation += 1

    @staticmethod
    def _where(scope: str, subject: str, period: str) -> tuple[Any, ...]:
        t = budgets_table.c
        return (t.scope == scope, t.subject == subject, t.period == period)

    async def all(self) -> list[MoneyBudget]:
        return (await self._found())[0]

    async def of(self, key: KeyInfo) -> list[MoneyBudget]:
        """The budgets of the key and of its tenant (none: nothing to reserve)."""
        by = await self.by_subject()
        return [*by.get(("key", key.key_id), ()), *by.get(("tenant", key.tenant), ())]

    async def by_subject(self) -> dict[tuple[str, str], list[MoneyBudget]]:
        """Every budget by ``(scope, subject)``: the same object until the book changes."""
        return (await self._found())[1]

    async def _found(self) -> _Found:
        cached = self._cached
        if cached is not None and self._clock() - cached[0] < BOOK_TTL_S:
            return cached[1]
        loading = self._loading
        if loading is None or loading[0] != self._generation:
            task = asyncio.ensure_future(self._load(self._generation))
            task.add_done_callback(_retrieved)  # a failed read in the background is logged
            loading = self._loading = (self._generation, task)
        if cached is not None:
            return cached[1]  # expired: served while it is read again
        return await asyncio.shield(loading[1])

    async def _load(self, generation: int) -> _Found:
        try:
            async with self._engine.connect() as conn:
                t = budgets_table.c
                query = select(budgets_table).order_by(t.scope, t.subject, t.period)
                rows = (await conn.execute(query)).all()
        finally:
            if self._loading is not None and self._loading[0] == generation:
                self._loading = None
        found = [MoneyBudget(cast(Scope, r.scope), r.subject, cast(Period, r.period),
                        Decimal(r.amount), bool(r.soft)) for r in rows]  # fmt: skip
        by: dict[tuple[str, str], list[MoneyBudget]] = {}
        for b in found:
            by.setdefault((b.scope, b.subject), []).append(b)
        if generation == self._generation:  # nothing changed here meanwhile
            self._cached = (self._clock(), (found, by))
        return found, by


@dataclass(frozen=True, slots=True)
class _Plan:
    """A key's budgets in their current windows, as the book last said (kept until a window
    ends or the book changes)."""

    by: dict[tuple[str, str], list[MoneyBudget]]  # the book's answer it was made from
    tenant: str
    until: float  # the first of its windows' ends
    budgets: tuple[MoneyBudget, ...]
    ends: tuple[float, ...]
    counters: tuple[str, ...]
    limits: tuple[int, ...]


@dataclass(slots=True)
class SpendAsk:
    """A request's reservation against its budgets (``money``), as the limiter asks it."""

    spending: Spending
    budgets: tuple[MoneyBudget, ...]
    ends: tuple[float, ...]  # when each budget's window ends
    money: Money
    price: Price
    now: float

    def refusal(self, spent: Spent) -> RateLimited:
        """429 ``budget_exceeded``: the budget that refused, what it holds, when it resets."""
        budget, ends = self.budgets[spent.refused - 1], self.ends[spent.refused - 1]
        spending, currency = self.spending, self.spending.prices.currency
        if spending.observe is not None:  # it refuses: spent, as far as requests can tell
            spending.observe(budget, max(spent.values[0] / budget.limit, 1.0))
        return RateLimited(
            f"This request would pass {budget.describe(currency)}: {units(spent.values[0]):f} "
            f"{currency} spent; it resets at {resets_at(ends)}.",
            retry_after=max(ends - self.now, 1.0), code="budget_exceeded",
        )  # fmt: skip

    def granted(self, spent: Spent) -> None:
        """Reserved: each budget's share used, and a soft one passed, told."""
        spending = self.spending
        for budget, name, after in zip(self.budgets, self.money.counters, spent.values,
                                       strict=True):  # fmt: skip
            if spending.observe is not None:
                spending.observe(budget, after / budget.limit if budget.limit else 0.0)
            if budget.soft and after > budget.limit and name not in spending.told:
                spending.told.add(name)  # said once per window and replica
                currency = spending.prices.currency
                log.warning("%s is passed (soft: not enforced): %s %s reserved or spent",
                            budget.describe(currency), f"{units(after):f}", currency)  # fmt: skip

    def cost(self, usage: Usage | None) -> int:
        """What the request cost by its usage, in nano-units (nothing produced: nothing)."""
        return spent(self.price, usage)


class Spending:
    def __init__(
        self, prices: Prices, book: BudgetBook, limits: Circuit[RateLimitBackend],
        clock: Callable[[], float] = time.time,
        observe: Callable[[MoneyBudget, float], None] | None = None,
    ) -> None:  # fmt: skip
        self.prices = prices
        self.book = book
        self.limits = limits  # the rate limits' backends: they keep the counters
        self.clock = clock
        self.observe = observe  # told each budget's share used, as reservations see it
        self.told: set[str] = set()  # the soft budgets' counters already said to be passed
        self._plans: dict[str, _Plan] = {}  # by key id

    async def spent(self, budget: MoneyBudget, tenant: str) -> tuple[Decimal, float]:
        """What the budget's subject (of ``tenant``) spent and reserved in its current window;
        when the window ends."""
        counter, ends = self.counter(budget, self.clock())
        found = await self.limits.call(lambda b: b.spent(tenant, [counter]))
        return units(found[0]), ends

    @staticmethod
    def counter(budget: MoneyBudget, now: float) -> tuple[str, float]:
        name, ends = window_of(budget.period, now)
        return f"{budget.scope}:{budget.subject}:{name}", ends

    async def ask(self, key: KeyInfo, model: str, prompt_tokens: int, max_tokens: int
                  ) -> SpendAsk | None:  # fmt: skip
        """The request's most expensive outcome, to reserve against the budgets of its key
        and tenant. ``None``: no budget applies, or the model has no price (nothing to
        count)."""
        by = await self.book.by_subject()
        now = self.clock()
        plan = self._plans.get(key.key_id)
        if plan is None or plan.by is not by or plan.tenant != key.tenant or now >= plan.until:
            plan = self._plan(by, key, now)
        price = self.prices.of(model)
        if not plan.budgets or price is None:
            return None
        money = Money(plan.counters, plan.limits, reservation(price, prompt_tokens, max_tokens))
        return SpendAsk(self, plan.budgets, plan.ends, money, price, now)

    def _plan(self, by: dict[tuple[str, str], list[MoneyBudget]], key: KeyInfo,
              now: float) -> _Plan:  # fmt: skip
        budgets = (*by.get(("key", key.key_id), ()), *by.get(("tenant", key.tenant), ()))
        counters = [self.counter(b, now) for b in budgets]
        ends = tuple(ends for _, ends in counters)
        plan = _Plan(by, key.tenant, min(ends, default=now + BOOK_TTL_S), budgets, ends,
                     tuple(name for name, _ in counters),
                     tuple(SOFT if b.soft else b.limit for b in budgets))  # fmt: skip
        if len(self._plans) >= 10_000:  # keys come and go: the cache stays bounded
            self._plans.clear()
        self._plans[key.key_id] = plan
        return plan


def _retrieved(task: asyncio.Future[_Found]) -> None:
    if not task.cancelled() and (failure := task.exception()) is not None:
        log.warning("reading the budgets failed (%s); the last ones read stay in force",
                    type(failure).__name__)  # fmt: skip
