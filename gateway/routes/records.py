"""Records management over HTTP (``audit.retention``; docs/records.md): legal holds and
retention for admins, what is in force for auditors.

Admin (role ``admin``):

- ``POST /admin/v1/holds`` ``{"tenant", "reason", "key_id"?, "since"?, "until"?}`` (times as
  epoch seconds or RFC 3339): 201 and the hold, once its signed record is in the ledger.
- ``GET /admin/v1/holds[?tenant=T&all=true]``: the holds in force (``all``: released too).
- ``POST /admin/v1/holds/{id}/release`` ``{"reason"?}``: the released hold; 404 if none is
  in force by that id.
- ``PUT /admin/v1/retention/{tenant}`` ``{"days": N | null}`` (``null``: kept forever).
- ``GET /admin/v1/retention``: each tenant's own retention, and ``RETENTION_DAYS``.
- ``POST /admin/v1/shred/{tenant}`` ``{"confirm": tenant}``: crypto-shreds the tenant (every
  data key destroyed, a signed shred record), as ``thinkgate ledger shred``; 409 ``legal_hold``
  while a hold is in force. Answers once no replica can seal under a destroyed key again (about
  a second: ``audit.datakeys``), so a record of a request admitted after it is readable.

Auditor: ``GET /audit/v1/retention``: for the key's tenant (every tenant for ``*``), its
retention in force and its holds (released ones too, with when).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.requests import Request
from starlette.responses import Response

from audit.ledger import Ledger
from audit.retention import HoldNotFound, RecordsNotInForce, ShredBlocked
from gateway.auth.bearer import authenticate
from gateway.auth.keys import ALL_TENANTS, KeyInfo, Role
from gateway.edge.body import read_body
from gateway.errors import InvalidRequest, LedgerUnavailable, NotFound
from gateway.ledger.translate import translate
from gateway.routes.auditor import parse_time
from gateway.routes.state import AppState


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HoldCreate(_Strict):
    tenant: str = Field(min_length=1, max_length=64)
    reason: str = Field(min_length=1, max_length=500)
    key_id: str | None = Field(None, min_length=1, max_length=64)
    since: float | None = None
    until: float | None = None

    @field_validator("since", "until", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        return parse_time(value) if isinstance(value, str) else value


class HoldRelease(_Strict):
    reason: str = Field("", max_length=500)


class ShredOrder(_Strict):
    confirm: str = Field(min_length=1, max_length=64)  # the tenant again: it cannot be undone


class RetentionSet(_Strict):
    days: int | None = Field(ge=1, le=36500)


async def _ledger(request: Request, role: Role) -> tuple[Ledger, KeyInfo, AppState]:
    state: AppState = request.app.state.tg
    key = await authenticate(state.keys, request.headers.get("authorization"), role)
    if state.ledger is None:
        raise LedgerUnavailable("This gateway runs without a ledger.")
    return state.ledger, key, state


async def _body(request: Request, state: AppState, model: type[_Strict]) -> Any:
    raw = await read_body(request, 64 * 1024, state.settings.body_timeout_s)
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        loc = ".".join(str(p) for p in error["loc"]) or None
        raise InvalidRequest(f"Invalid value for '{loc}': {error['msg']}.", param=loc) from None


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


async def place_hold(request: Request) -> Response:
    ledger, _, state = await _ledger(request, "admin")
    spec: HoldCreate = await _body(request, state, HoldCreate)
    try:
        hold = await ledger.place_hold(spec.tenant, spec.reason, key_id=spec.key_id,
                                       since=spec.since, until=spec.until)  # fmt: skip
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="tenant" if "tenant" in str(exc) else "reason"
                             ) from None  # fmt: skip
    except RecordsNotInForce as exc:
        raise LedgerUnavailable(str(exc)) from None
    return _json({"object": "legal_hold", **hold.as_dict()}, 201)


async def list_holds(request: Request) -> Response:
    ledger, _, _ = await _ledger(request, "admin")
    tenant = request.query_params.get("tenant") or None
    register = await ledger.register(tenant)
    every = request.query_params.get("all") == "true"
    holds = list(register.holds.values()) if every else register.active()
    data = [{"object": "legal_hold", **h.as_dict()} for h in holds
            if tenant is None or h.tenant == tenant]  # fmt: skip
    return _json({"object": "list", "data": data})


async def release_hold(request: Request) -> Response:
    ledger, _, state = await _ledger(request, "admin")
    spec: HoldRelease = await _body(request, state, HoldRelease)
    hold_id = request.path_params["hold_id"]
    try:
        hold = await ledger.release_hold(hold_id, spec.reason)
    except RecordsNotInForce as exc:
        raise LedgerUnavailable(str(exc)) from None
    except HoldNotFound:
        raise NotFound(f"No hold '{hold_id[:32]}' is in force.", param="hold_id") from None
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="reason") from None
    return _json({"object": "legal_hold", **hold.as_dict()})


async def set_retention(request: Request) -> Response:
    ledger, _, state = await _ledger(request, "admin")
    spec: RetentionSet = await _body(request, state, RetentionSet)
    tenant = request.path_params["tenant"]
    try:
        await ledger.set_retention(tenant, spec.days)
    except RecordsNotInForce as exc:
        raise LedgerUnavailable(str(exc)) from None
    return _json({"object": "retention", "tenant": tenant, "days": spec.days})


async def shred_tenant(request: Request) -> Response:
    ledger, _, state = await _ledger(request, "admin")
    order: ShredOrder = await _body(request, state, ShredOrder)
    tenant = request.path_params["tenant"]
    if order.confirm != tenant:
        raise InvalidRequest("A shred cannot be undone: 'confirm' must repeat the tenant.",
                             param="confirm")  # fmt: skip
    try:
        destroyed = await ledger.shred(tenant)
    except ShredBlocked as exc:
        raise translate(exc) from None
    return _json({"object": "shred", "tenant": tenant, "destroyed_keys": destroyed})


async def list_retention(request: Request) -> Response:
    ledger, _, state = await _ledger(request, "admin")
    register = await ledger.register()
    data = [{"object": "retention", "tenant": t, "days": d}
            for t, d in sorted(register.retention.items())]  # fmt: skip
    return _json({"object": "list", "data": data, "default_days": state.settings.retention_days})


async def auditor_retention(request: Request) -> Response:
    """What an auditor may know of its tenant's records management (console: "Retention")."""
    ledger, key, state = await _ledger(request, "auditor")
    register = await ledger.register(key.tenant)
    default = state.settings.retention_days
    if key.tenant == ALL_TENANTS:
        tenants = sorted({*register.retention, *(h.tenant for h in register.holds.values())})
    else:
        tenants = [key.tenant]
    data = [{"tenant": tenant, "days": register.days(tenant, default),
             "own": tenant in register.retention,
             "holds": [h.as_dict() for h in register.holds.values() if h.tenant == tenant]}
            for tenant in tenants]  # fmt: skip
    return _json({"object": "list", "data": data, "default_days": default})


def add_routes(app: FastAPI) -> None:
    for path, handler, method in (
        ("/admin/v1/holds", place_hold, "POST"),
        ("/admin/v1/holds", list_holds, "GET"),
        ("/admin/v1/holds/{hold_id}/release", release_hold, "POST"),
        ("/admin/v1/retention/{tenant}", set_retention, "PUT"),
        ("/admin/v1/retention", list_retention, "GET"),
        ("/admin/v1/shred/{tenant}", shred_tenant, "POST"),
        ("/audit/v1/retention", auditor_retention, "GET"),
    ):
        app.add_api_route(path, handler, methods=[method], response_model=None)
