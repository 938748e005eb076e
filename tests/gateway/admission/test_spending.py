"""``Spending`` (``gateway.admission.spending``) through the rate limiter that keeps its counters
(``KeyLimiter``, in-process and on real Redis), the budgets in a real database (SQLite): a
request reserved against every budget of its key and tenant with its rate limits, all or
nothing; refused over a hard one naming it and its reset, with the limits' headers; settled to
what it cost with the tokens' refund; soft budgets never refuse; the UTC window turns; the
book read through its cache."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from audit.record import Usage
from gateway.admission.circuit import Circuit, redis_errors
from gateway.admission.limiter import Admission
from gateway.admission.ratelimits import KeyLimiter
from gateway.admission.redisconn import open_redis
from gateway.admission.spending import BOOK_TTL_S, BudgetBook, Spending
from gateway.auth.keys import KeyInfo
from gateway.db import create_engine, upgrade_schema
from gateway.errors import RateLimited
from gateway.settings import Settings
from gateway.spend.budgets import MoneyBudget
from gateway.spend.prices import parse_prices
from ratelimit.limits import MemoryBackend, RateLimitBackend, RedisBackend
from tests.clock import FakeClock
from tests.waiting import eventually

PRICES = parse_prices(b"currency: USD\nmodels: {m: {input: 1000, output: 1000}}\n")
NOON = datetime(2026, 12, 5, 12, tzinfo=UTC).timestamp()


def key(key_id: str = "k1", tenant: str = "acme", rpm: int | None = None) -> KeyInfo:
    return KeyInfo(key_id, tenant, "client", "visible", rpm, None, datetime.now(UTC), None, b"")


class Budgeted:
    """What the pipeline does with a request: ask its budgets, admit it with its limits."""

    def __init__(self, spending: Spending, limiter: KeyLimiter) -> None:
        self.spending, self.limiter = spending, limiter

    async def reserve(self, who: KeyInfo, model: str, prompt: int, most: int) -> Admission | None:
        ask = await self.spending.ask(who, model, prompt, most)
        admission = await self.limiter.admit(who, prompt + most, ask)
        return None if ask is None else admission

    async def settle(self, admission: Admission, usage: Usage | None) -> None:
        await self.limiter.settle(admission, 0 if usage is None else usage.total_tokens, usage)


@pytest.fixture
async def spending(redis_at: tuple[str, str] | None, tmp_path: Path) -> AsyncIterator[Any]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    await upgrade_schema(engine)
    redis = open_redis(Settings(redis_url=redis_at[0])) if redis_at else None
    backend: RateLimitBackend = MemoryBackend()
    if redis is not None:
        backend = RedisBackend(redis, key_prefix=redis_at[1])  # type: ignore[index]
    circuit: Circuit[RateLimitBackend] = Circuit("rate limits", backend, MemoryBackend(),
                                                 fail="closed", errors=redis_errors())  # fmt: skip
    clock = FakeClock(NOON)
    book = BudgetBook(engine, clock=FakeClock(0.0))
    spend = Spending(PRICES, book, circuit, clock=clock)
    yield Budgeted(spend, KeyLimiter(circuit, Settings().admission)), book, clock
    if redis is not None:
        await redis.aclose()
    await engine.dispose()


async def test_reserved_against_key_and_tenant_refused_past_either_and_settled(
    spending: Any,
) -> None:
    spend, book, _ = spending
    await book.set(MoneyBudget("key", "k1", "day", Decimal("0.25")))
    await book.set(MoneyBudget("tenant", "acme", "month", Decimal("0.30")))
    # each reserves 100 tokens at $0.001: 0.1
    first = await spend.reserve(key(), "m", 0, 100)
    second = await spend.reserve(key(), "m", 0, 100)
    with pytest.raises(RateLimited) as refused:
        await spend.reserve(key(), "m", 0, 100)
    assert refused.value.code == "budget_exceeded"
    assert "daily budget of key k1, 0.25 USD" in str(refused.value)
    assert "0.200000000 USD spent; it resets at 2026-12-06T00:00:00Z" in str(refused.value)
    assert 43_000 <= refused.value.retry_after <= 43_200
    await spend.settle(first, Usage(0, 30, 0, 30))  # it cost 0.03, not 0.1: 0.07 back
    await spend.settle(second, None)  # it produced nothing
    third = await spend.reserve(key(), "m", 0, 100)
    assert third is not None
    views = {b.scope: (await spend.spending.spent(b, "acme"))[0] for b in await book.all()}
    assert views == {"key": Decimal("0.13"), "tenant": Decimal("0.13")}
    with pytest.raises(RateLimited) as tenant_wide:  # another key of the tenant: its budget
        await spend.reserve(key("k2"), "m", 0, 200)
    assert "monthly budget of tenant acme" in str(tenant_wide.value)


async def test_soft_budgets_count_and_never_refuse_and_the_day_turns(spending: Any) -> None:
    spend, book, clock = spending
    await book.set(MoneyBudget("key", "k1", "day", Decimal("0.1"), soft=True))
    for _ in range(3):
        assert await spend.reserve(key(), "m", 0, 100) is not None
    [soft] = await book.all()
    assert (await spend.spending.spent(soft, "acme"))[0] == Decimal("0.3")
    await book.set(MoneyBudget("key", "k1", "day", Decimal("0.35")))  # now hard, the same day
    with pytest.raises(RateLimited):
        await spend.reserve(key(), "m", 0, 100)  # what the day spent counts: 0.3 + 0.1 > 0.35
    clock.now += 12 * 3600  # midnight UTC: a new day, a new counter
    assert await spend.reserve(key(), "m", 0, 100) is not None


async def test_no_budget_or_no_price_reserves_nothing(spending: Any) -> None:
    spend, book, _ = spending
    assert await spend.reserve(key(), "m", 0, 100) is None
    await book.set(MoneyBudget("key", "k1", "day", Decimal("1")))
    assert await spend.reserve(key(), "unpriced", 0, 100) is None


async def test_a_budget_refusal_carries_the_limits_headers_and_takes_nothing(
    spending: Any,
) -> None:
    spend, book, _ = spending
    await book.set(MoneyBudget("key", "k1", "day", Decimal("0.15")))
    limited = key(rpm=10)
    admitted = await spend.reserve(limited, "m", 0, 100)
    assert dict(admitted.headers)["x-ratelimit-remaining-requests"] == "9"
    with pytest.raises(RateLimited) as refused:
        await spend.reserve(limited, "m", 0, 100)
    assert refused.value.code == "budget_exceeded"
    assert refused.value.headers()["x-ratelimit-remaining-requests"] == "9"  # not taken
    assert (await spend.reserve(key(rpm=10), "m", 0, 50)) is not None  # 0.15: it fits


async def test_the_book_reads_once_for_many_and_serves_what_it_had_meanwhile(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")
    await upgrade_schema(engine)
    reads: list[str] = []

    def counted(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("SELECT") and "FROM gateway_budgets" in statement:
            reads.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", counted)
    clock = FakeClock(0.0)
    book = BudgetBook(engine, clock=clock)
    await book.set(MoneyBudget("tenant", "acme", "day", Decimal("1")))
    found = await asyncio.gather(*(book.of(key()) for _ in range(50)))
    assert len(reads) == 1 and all(len(f) == 1 for f in found)  # one read for fifty
    await book.set(MoneyBudget("key", "k1", "day", Decimal("2")))  # set here: in force at once
    assert len(await book.of(key())) == 2 and len(reads) == 2
    other = BudgetBook(engine, clock=FakeClock(0.0))  # another replica changes the book
    await other.remove("tenant", "acme", "day")
    clock.now += BOOK_TTL_S  # expired: what it had is served while it reads again
    assert len(await book.of(key())) == 2

    async def read_again() -> bool:
        return [b.scope for b in await book.of(key())] == ["key"]

    await eventually(read_again)
    assert len(reads) == 3  # the one read again, however often it was asked meanwhile
    await engine.dispose()
