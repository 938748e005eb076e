"""Retention and legal holds on a clock the test controls (``audit.retention``, on SQLite and
PostgreSQL): a tenant's days past retention become unreadable a day at a time, held days stay
readable, each act is a signed record in the tree, and the tree still verifies."""

from __future__ import annotations

import orjson
import pytest

from audit.retention import HoldNotFound, ShredBlocked, new_hold
from tests.audit.conftest import BASE_TIME, ORIGIN, LedgerFactory, body, completion

DAY = 86400.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def seal_days(factory: LedgerFactory, url: str, clock: Clock, days: int) -> list[int]:
    """One record per tenant per day for ``days`` days from BASE_TIME; their indexes."""
    ledger = await factory.open(url, wall=clock)
    made = []
    for day in range(days):
        clock.now = BASE_TIME + day * DAY + 3600
        for tenant in ("acme", "globex"):
            await ledger.append(completion(len(made), tenant=tenant, created_at=clock.now),
                                body(len(made)))  # fmt: skip
            made.append(len(made))
    return made


async def readable(factory: LedgerFactory, url: str, count: int) -> dict[tuple[str, int], bool]:
    """(tenant, day) -> whether that record's body can still be read."""
    ledger = await factory.open(url)
    found = {}
    for index in range(count):
        opened = await ledger.read(index)
        assert opened is not None
        if opened.header["kind"] == "completion":
            day = int((opened.header["created_at"] - BASE_TIME) // DAY)
            found[(opened.header["tenant"], day)] = opened.body is not None
    return found


async def test_days_past_retention_become_unreadable_and_held_days_do_not(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    clock = Clock(BASE_TIME)
    made = await seal_days(ledger_factory, database_url, clock, 6)
    ledger = await ledger_factory.open(database_url, wall=clock)
    # globex's day 1 is under investigation; acme keeps 3 days, globex the default (2)
    hold = await ledger.place_hold("globex", "case 7", since=BASE_TIME + DAY,
                                   until=BASE_TIME + DAY + 7200,
                                   now=BASE_TIME + 6 * DAY)  # fmt: skip
    await ledger.set_retention("acme", 3, now=BASE_TIME + 6 * DAY)
    runs = await ledger.apply_retention(2, now=BASE_TIME + 6 * DAY + 60)
    by_tenant = {r.tenant: r for r in runs}
    # the days that ended 3 (acme) or 2 (globex) days before the run; globex's day 1 is held
    assert by_tenant["acme"].periods == ("2026-01-01", "2026-01-02", "2026-01-03")
    assert by_tenant["globex"].periods == ("2026-01-01", "2026-01-03", "2026-01-04")
    assert by_tenant["globex"].kept_by == (hold.id,)
    state = await readable(ledger_factory, database_url, len(made))
    assert [d for d in range(6) if not state[("acme", d)]] == [0, 1, 2]
    assert [d for d in range(6) if not state[("globex", d)]] == [0, 2, 3]
    # a second run finds nothing more; the tree still verifies, records and keys alike
    assert await ledger.apply_retention(2, now=BASE_TIME + 6 * DAY + 120) == []
    report = await ledger_factory.verify(database_url)  # raises on any fault
    assert report.size == 12 + 4 and report.pending == 0  # records, hold, setting, two runs


async def test_every_act_is_a_signed_record_of_the_tree(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    clock = Clock(BASE_TIME)
    await seal_days(ledger_factory, database_url, clock, 3)
    ledger = await ledger_factory.open(database_url, wall=clock)
    hold = await ledger.place_hold("acme", "audit 2026", key_id="key-a", now=BASE_TIME + 3 * DAY)
    await ledger.set_retention("acme", 1, now=BASE_TIME + 3 * DAY)
    await ledger.apply_retention(None, now=BASE_TIME + 3 * DAY)
    await ledger.release_hold(hold.id, "case closed", now=BASE_TIME + 3 * DAY + 1)
    verifier = ledger_factory.verifier()
    kinds = []
    for index in range(6, 9):
        opened = await ledger.read(index)
        assert opened is not None
        header = opened.header
        kinds.append(header["kind"])
        signed = verifier.open(header["statement"])  # the log's key signed it
        assert signed.split("\n")[:3] == [f"thinkgate {header['kind']}", ORIGIN, "acme"]
        assert orjson.loads(signed.split("\n")[3]) == header["terms"]
    # the hold kept every day (no since/until): retention of acme destroyed nothing
    assert kinds == ["hold", "retention-set", "release"]
    assert await ledger.read(9) is None
    register = await ledger.register("acme")
    assert (
        register.active() == [] and register.holds[hold.id].released_at == BASE_TIME + 3 * DAY + 1
    )
    assert register.retention == {"acme": 1}
    with pytest.raises(HoldNotFound):
        await ledger.release_hold(hold.id)


async def test_a_shred_is_refused_while_a_hold_is_in_force(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    clock = Clock(BASE_TIME)
    await seal_days(ledger_factory, database_url, clock, 1)
    ledger = await ledger_factory.open(database_url, wall=clock)
    hold = await ledger.place_hold("globex", "litigation 12")
    with pytest.raises(ShredBlocked, match=f"{hold.id} \\(litigation 12\\)"):
        await ledger.shred("globex")
    assert (await ledger.read(1)).body is not None  # type: ignore[union-attr]
    await ledger.release_hold(hold.id)
    assert await ledger.shred("globex") == 1
    assert (await ledger.read(1)).body is None  # type: ignore[union-attr]


def test_a_hold_needs_a_one_line_reason_and_an_ordered_range() -> None:
    with pytest.raises(ValueError, match="one line"):
        new_hold("t", "two\nlines", None, None, None, 0)
    with pytest.raises(ValueError, match="before its since"):
        new_hold("t", "r", None, 10.0, 5.0, 0)


async def test_a_record_is_kept_by_its_own_day_whenever_it_is_sealed(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    """A request made a moment before midnight and sealed after it is under its own day's
    key, so a hold up to that moment keeps it (the review's case: sealed by the wall clock's
    day, it went with the next day's key)."""
    clock = Clock(BASE_TIME + DAY + 1)  # sealed just after the midnight that ends day 0
    ledger = await ledger_factory.open(database_url, wall=clock)
    made = BASE_TIME + DAY - 0.1
    await ledger.append(completion(0, tenant="acme", created_at=made), body(0))
    await ledger.append(completion(1, tenant="acme", created_at=BASE_TIME + DAY + 1), body(1))
    await ledger.place_hold("acme", "case 9", until=made + 0.05, now=BASE_TIME + 5 * DAY)
    runs = await ledger.apply_retention(1, now=BASE_TIME + 5 * DAY)
    assert [r.periods for r in runs] == [("2026-01-02",)]  # day 0 held, day 1 gone
    assert (await ledger.read(0)).body is not None  # type: ignore[union-attr]
    assert (await ledger.read(1)).body is None  # type: ignore[union-attr]


def test_a_hold_names_one_tenant() -> None:
    with pytest.raises(ValueError, match="one tenant"):
        new_hold("*", "all of them", None, None, None, 0)
