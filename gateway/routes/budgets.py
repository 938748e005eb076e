"""``/admin/v1/budgets``: budgets in money per key or tenant, for admin keys (docs/spend.md).

- ``PUT /admin/v1/budgets/{tenant|key}/{subject}/{day|month}`` ``{"amount": "5.00", "soft":
  false}``: set it (in force at once here, within seconds on every replica);
- ``GET /admin/v1/budgets``: every budget, and what its subject spent in its current window;
- ``DELETE /admin/v1/budgets/{scope}/{subject}/{period}``: remove it;
- ``GET /admin/v1/spend`` (``tenant``, ``key``, ``since``, ``until``): what the ledger says
  was spent, as ``thinkgate spend report`` sums it.

Without ``PRICES_FILE`` nothing is priced, so budgets cannot be kept: 400.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.admission.spending import Spending
from gateway.auth.bearer import authenticate
from gateway.errors import InvalidRequest, NotFound
from gateway.ledger.spending import spend_rows, totals
from gateway.routes.auditor import parse_time
from gateway.routes.state import AppState, app_state
from gateway.spend.budgets import MoneyBudget, resets_at


async def _admin(request: Request) -> tuple[AppState, Spending]:
    state = app_state(request)
    await authenticate(state.keys, request.headers.get("authorization"), "admin")
    if state.spending is None:
        raise InvalidRequest("Budgets need PRICES_FILE: without prices nothing is priced.")
    return state, state.spending


def _path(request: Request) -> tuple[Any, str, Any]:
    scope, subject, period = (request.path_params[n] for n in ("scope", "subject", "period"))
    if scope not in ("tenant", "key"):
        raise InvalidRequest("The scope is 'tenant' or 'key'.", param="scope")
    if period not in ("day", "month"):
        raise InvalidRequest("The period is 'day' or 'month'.", param="period")
    return scope, subject, period


async def put_budget(request: Request) -> Response:
    state, spending = await _admin(request)
    scope, subject, period = _path(request)
    try:
        body = orjson.loads(await request.body())
        amount = Decimal(str(body["amount"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, InvalidOperation):
        raise InvalidRequest("The body is {\"amount\": N, \"soft\": false}.", param="amount"
                             ) from None  # fmt: skip
    if not amount.is_finite() or amount <= 0:
        raise InvalidRequest("'amount' must be more than 0.", param="amount")
    if scope == "key" and await state.keys.get(subject) is None:
        raise NotFound(f"No key '{subject[:32]}'.", param="subject")
    budget = MoneyBudget(scope, subject, period, amount, bool(body.get("soft", False)))
    await spending.book.set(budget)
    _changed(state)
    return _json(await _view(state, spending, budget))


async def list_budgets(request: Request) -> Response:
    state, spending = await _admin(request)
    budgets = await spending.book.all()
    return _json({"object": "list", "data": [await _view(state, spending, b) for b in budgets]})


async def delete_budget(request: Request) -> Response:
    state, spending = await _admin(request)
    scope, subject, period = _path(request)
    if not await spending.book.remove(scope, subject, period):
        raise NotFound("No such budget.")
    _changed(state)
    return _json({"scope": scope, "subject": subject, "period": period, "deleted": True})


def _changed(state: AppState) -> None:
    """Batches a budget held here ask again now (elsewhere within ``HOLD_MAX_S``)."""
    if state.batch_runner is not None:
        state.batch_runner.unhold()


async def _view(state: AppState, spending: Spending, budget: MoneyBudget) -> dict[str, Any]:
    """The budget, and what its subject spent in its window (a key's counter is kept under
    its tenant: a key since deleted spent nothing)."""
    tenant = budget.subject
    if budget.scope == "key":
        key = await state.keys.get(budget.subject)
        tenant = "" if key is None else key.tenant
    spent, ends = await spending.spent(budget, tenant)
    return {"scope": budget.scope, "subject": budget.subject, "period": budget.period,
            "amount": str(budget.amount), "soft": budget.soft,
            "currency": spending.prices.currency, "spent": f"{spent:f}",
            "remaining": f"{max(budget.amount - spent, Decimal(0)):f}",
            "resets_at": resets_at(ends)}  # fmt: skip


async def get_spend(request: Request) -> Response:
    """``GET /admin/v1/spend?tenant=&key=&since=&until=``: ``thinkgate spend report``'s rows
    and totals, from the ledger."""
    state = app_state(request)
    await authenticate(state.keys, request.headers.get("authorization"), "admin")
    q = request.query_params
    times: dict[str, float | None] = {}
    for name in ("since", "until"):
        try:
            times[name] = parse_time(q[name]) if q.get(name) else None
        except ValueError as exc:
            raise InvalidRequest(str(exc), param=name) from None
    rows, unpriced = await spend_rows(state.engine, state.prices, tenant=q.get("tenant"),
                                      key_id=q.get("key"), **times)  # fmt: skip
    return _json({"object": "list", "data": [r.to_json() for r in rows],
                  "totals": totals(rows), "unpriced": unpriced})  # fmt: skip


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def add_routes(app: FastAPI) -> None:
    path = "/admin/v1/budgets/{scope}/{subject}/{period}"
    app.add_api_route(path, put_budget, methods=["PUT"], response_model=None)
    app.add_api_route(path, delete_budget, methods=["DELETE"], response_model=None)
    app.add_api_route("/admin/v1/budgets", list_budgets, methods=["GET"], response_model=None)
    app.add_api_route("/admin/v1/spend", get_spend, methods=["GET"], response_model=None)
