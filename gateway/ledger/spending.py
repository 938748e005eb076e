"""What the ledger says was spent: its completion records' costs summed per tenant, key, model
and currency, from their clear headers (no decryption), for ``thinkgate spend report`` and
``GET /admin/v1/spend`` (docs/spend.md).

A record without a cost (made before prices were set, a model served unpriced, a
``replica_lost`` record swept by a replica) is priced from its usage when ``prices`` price its
model (counted in ``repriced``), else counted ``unpriced``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson
from sqlalchemy import select

from audit.record import Usage
from audit.schema import entries
from audit.sqlasync import AsyncEngine
from gateway.spend.prices import Prices


@dataclass(slots=True)
class Row:
    tenant: str
    key_id: str
    model: str
    currency: str
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    amount: Decimal = Decimal(0)
    repriced: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "key_id": self.key_id, "model": self.model,
                "currency": self.currency, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens, "amount": f"{self.amount:f}",
                "repriced": self.repriced}  # fmt: skip

    def add(self, usage: Usage, amount: Decimal, repriced: bool) -> None:
        self.requests += 1
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.amount += amount
        self.repriced += repriced


async def spend_rows(
    engine: AsyncEngine, prices: Prices | None, *, tenant: str | None = None,
    key_id: str | None = None, since: float | None = None, until: float | None = None,
) -> tuple[list[Row], int]:  # fmt: skip
    """The rows, by tenant, key, model and currency, and how many records had no price."""
    query = select(entries.c.header).where(entries.c.kind == "completion")
    for column, value in ((entries.c.tenant, tenant), (entries.c.key_id, key_id)):
        if value is not None:
            query = query.where(column == value)
    if since is not None:
        query = query.where(entries.c.created_at >= since)
    if until is not None:
        query = query.where(entries.c.created_at < until)
    async with engine.connect() as conn:
        headers = (await conn.execute(query.order_by(entries.c.idx))).scalars().all()
    rows: dict[tuple[str, str, str, str], Row] = {}
    unpriced = 0
    for raw in headers:
        header = orjson.loads(raw)
        counted = header.get("usage") or {}
        usage = Usage(counted.get("prompt_tokens", 0), counted.get("completion_tokens", 0),
                      counted.get("reasoning_tokens", 0), counted.get("total_tokens", 0),
                      cached_tokens=counted.get("cached_tokens", 0))  # fmt: skip
        cost, repriced = header.get("cost"), False
        if cost is None and prices is not None:
            amount = prices.cost(header.get("model", ""), usage)
            if amount is not None:
                cost, repriced = {"amount": f"{amount:f}", "currency": prices.currency}, True
        if cost is None:
            unpriced += 1
            continue
        key = (header["tenant"], header["key_id"], header.get("model", ""), cost["currency"])
        row = rows.setdefault(key, Row(*key))
        row.add(usage, Decimal(cost["amount"]), repriced)
    return [rows[k] for k in sorted(rows)], unpriced


def totals(rows: list[Row]) -> dict[str, str]:
    """The amounts per currency."""
    found: dict[str, Decimal] = {}
    for row in rows:
        found[row.currency] = found.get(row.currency, Decimal(0)) + row.amount
    return {c: f"{a:f}" for c, a in sorted(found.items())}
