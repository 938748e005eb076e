"""Records management: retention per tenant and legal holds, as records of the ledger itself.

Rules:

- **Everything is a record.** Placing a hold (kind ``hold``), releasing one (``release``),
  setting a tenant's retention (``retention-set``) and each retention run that destroyed
  something (``retention``) is a ledger record like any other: in the Merkle tree, under the
  signed checkpoints, its header readable without keys. Its ``terms`` say what it did and its
  ``statement`` is a note signed with the log's key (as a shred's is), so the act can be shown
  to a third party on its own. The holds and settings in force are read back from these
  records (``ledger_entries_kind`` index): there is no other table to keep in step.
- **Granularity: a tenant's UTC day.** A tenant's records are sealed under the data key of
  the UTC day of their ``created_at`` (``audit.datakeys``), so retention makes a tenant's
  records unreadable a day at a time: the key of day D is destroyed once D ended ``days``
  days before the run, i.e. a record becomes unreadable between ``days`` and ``days + 1`` days
  after it was made (plus the run interval). Everything else sealed under the tenant's keys
  that day goes with it (stored responses, conversations, sealed reasoning). Keys made before
  days existed have none: they end when the tenant's first key with a day was made, so a
  tenant that sealed nothing since the upgrade keeps those records until it does.
- **Races.** A hold is in force once its record is committed (``place_hold`` waits for
  that); retention reads a tenant's holds again right before destroying its keys, and a
  shred right before shredding, so a hold placed meanwhile counts unless it commits in the
  milliseconds between that read and the destruction (no lock spans the two: documented).
- **A hold keeps whole days.** A hold names a tenant, optionally a key and a time range
  (``since``/``until``, open when absent); it keeps readable every day of the tenant that
  overlaps its range, key or not (the day is the unit a key covers): other keys' records of
  those days survive with the held ones. A tenant with a hold in force cannot be shredded.
- The tree, the checkpoints and ``ledger verify`` are untouched by all of it: destroying a key
  changes no byte of any record.
"""

from __future__ import annotations

import calendar
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import select

from audit.errors import AuditError
from audit.schema import data_keys, entries
from audit.sqlasync import AsyncConnection

DAY_S = 86400
KINDS = ("hold", "release", "retention-set")
_REASON = re.compile(r"[^\x00-\x1f\x7f]{1,500}")


class ShredBlocked(AuditError):
    """A tenant under legal hold cannot be shredded; ``holds`` are the ones in the way."""

    def __init__(self, tenant: str, holds: Sequence[Hold]) -> None:
        names = ", ".join(f"{h.id} ({h.reason})" for h in holds)
        super().__init__(f"tenant {tenant!r} is under legal hold: {names}")
        self.holds = tuple(holds)


class HoldNotFound(AuditError):
    pass


class RecordsNotInForce(AuditError):
    """A records-management act's record is not committed yet (the database is away)."""


@dataclass(frozen=True, slots=True)
class Hold:
    id: str
    tenant: str
    reason: str
    placed_at: float
    key_id: str | None = None
    since: float | None = None
    until: float | None = None
    released_at: float | None = None

    def terms(self) -> dict[str, Any]:
        return {"hold": self.id, "key_id": self.key_id, "since": self.since,
                "until": self.until, "reason": self.reason}  # fmt: skip

    def covers_time(self, when: float, key_id: str | None = None) -> bool:
        """Whether a record of this tenant made at ``when`` (by ``key_id``) is held."""
        in_range = (self.since is None or when >= self.since) and (
            self.until is None or when <= self.until
        )
        return in_range and (self.key_id is None or key_id is None or key_id == self.key_id)

    def covers_span(self, start: float, end: float) -> bool:
        """Whether the hold's range overlaps ``[start, end)`` (a data key's days)."""
        return (self.since is None or self.since < end) and (
            self.until is None or self.until >= start
        )

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "key_id": self.key_id,
                "since": self.since, "until": self.until, "reason": self.reason,
                "placed_at": self.placed_at, "released_at": self.released_at}  # fmt: skip


def new_hold(tenant: str, reason: str, key_id: str | None, since: float | None,
             until: float | None, now: float) -> Hold:  # fmt: skip
    if not _REASON.fullmatch(reason):
        raise ValueError("a hold's reason is one line of 1 to 500 printable characters")
    if not tenant or tenant == "*":
        raise ValueError("a hold names one tenant (not '*': hold each tenant)")
    if since is not None and until is not None and until < since:
        raise ValueError("a hold's until is before its since")
    return Hold(f"hold-{secrets.token_hex(6)}", tenant, reason, now, key_id, since, until)


def check_reason(reason: str) -> str:
    if reason and not _REASON.fullmatch(reason):
        raise ValueError("a reason is one line of at most 500 printable characters")
    return reason


def statement(kind: str, origin: str, tenant: str, terms: dict[str, Any], now: float) -> str:
    """The text a records-management act's signed note carries (one line per field)."""
    said = orjson.dumps(terms, option=orjson.OPT_SORT_KEYS).decode()
    return f"thinkgate {kind}\n{origin}\n{tenant}\n{said}\n{int(now)}\n"


@dataclass(slots=True)
class Register:
    """The holds and retention settings the ledger's records put in force."""

    holds: dict[str, Hold] = field(default_factory=dict)  # every hold, released ones too
    retention: dict[str, int | None] = field(default_factory=dict)  # per tenant (None: forever)

    def active(self, tenant: str | None = None) -> list[Hold]:
        return [h for h in self.holds.values() if h.released_at is None
                and (tenant is None or h.tenant == tenant or tenant == "*")]  # fmt: skip

    def days(self, tenant: str, default: int | None) -> int | None:
        return self.retention.get(tenant, default)


async def read_register(conn: AsyncConnection, tenant: str | None = None) -> Register:
    """Replay the records-management records (of ``tenant``, or all) in ledger order."""
    query = select(entries.c.header).where(entries.c.kind.in_(KINDS)).order_by(entries.c.idx)
    if tenant is not None and tenant != "*":
        query = query.where(entries.c.tenant == tenant)
    register = Register()
    for (header,) in await conn.execute(query):
        raw = orjson.loads(header)
        terms, kind = raw.get("terms") or {}, raw["kind"]
        if kind == "hold":
            register.holds[terms["hold"]] = Hold(
                terms["hold"], raw["tenant"], terms["reason"], float(raw["created_at"]),
                terms.get("key_id"), terms.get("since"), terms.get("until"),
            )  # fmt: skip
        elif kind == "release" and terms.get("hold") in register.holds:
            held = register.holds[terms["hold"]]
            register.holds[held.id] = Hold(held.id, held.tenant, held.reason, held.placed_at,
                                           held.key_id, held.since, held.until,
                                           float(raw["created_at"]))  # fmt: skip
        elif kind == "retention-set":
            register.retention[raw["tenant"]] = terms.get("days")
    return register


def day_start(period: str) -> float:
    return float(calendar.timegm(time.strptime(period, "%Y-%m-%d")))


@dataclass(frozen=True, slots=True)
class Expiry:
    """What a retention run over one tenant found: the keys to destroy, the days they sealed
    (``legacy`` for keys made before days), and the holds that kept others."""

    tenant: str
    days: int
    before: float  # records sealed before this are past retention
    dek_ids: tuple[str, ...]
    periods: tuple[str, ...]
    kept_by: tuple[str, ...]
    dek_periods: tuple[str, ...] = ()  # the day of each of ``dek_ids``


async def expiring(conn: AsyncConnection, tenant: str, days: int, now: float,
                   holds: Sequence[Hold]) -> Expiry:  # fmt: skip
    """The live data keys of ``tenant`` whose records are all past ``days``, minus the held."""
    before = now - days * DAY_S
    rows = (await conn.execute(
        select(data_keys.c.dek_id, data_keys.c.period, data_keys.c.created_at,
               data_keys.c.wrapped.is_not(None).label("live"))
        .where(data_keys.c.tenant == tenant)
    )).all()  # fmt: skip
    dated = [r.created_at for r in rows if r.period is not None]
    legacy_end = min(dated) if dated else None  # keys without a day sealed until then
    dek_ids, periods, kept_by = [], [], set()
    for row in rows:
        if not row.live:
            continue
        if row.period is None:
            if legacy_end is None:
                continue
            start, end = 0.0, legacy_end
        else:
            start = day_start(row.period)
            end = start + DAY_S
        if end > before:
            continue
        holding = [h.id for h in holds if h.covers_span(start, end)]
        if holding:
            kept_by.update(holding)
            continue
        dek_ids.append(row.dek_id)
        periods.append(row.period or "legacy")
    return Expiry(tenant, days, before, tuple(dek_ids), tuple(sorted(set(periods))),
                  tuple(sorted(kept_by)), tuple(periods))  # fmt: skip


async def tenants_with_keys(conn: AsyncConnection) -> list[str]:
    query = select(data_keys.c.tenant).where(data_keys.c.wrapped.is_not(None)).distinct()
    return sorted(str(t) for t in (await conn.execute(query)).scalars())
