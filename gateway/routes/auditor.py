"""The auditor API, ``/audit/v1/*`` (role ``auditor``), over ``audit.ledger``.

Scope: an auditor key sees the records of its own tenant; a key whose tenant is ``*`` sees all
tenants. Asking for another tenant explicitly is a 403; a record of another tenant read by
index is a 404, as if it did not exist. Checkpoints, the public key and proofs carry only sizes
and hashes, so every auditor gets them.

``records/{index}/raw`` gives one record's stored header and ciphertext bytes, so a single
leaf can be recomputed without an export (the console does it in the browser).

Every decrypted read (``records/{index}``) is first appended to the ledger as an ``access``
record (who, which index, when, under which request id) and only served once that record is as
durable as ``AUDIT_MODE`` makes any record: there are no unrecorded reads.

Wire shapes (base64 as in RFC 6962's JSON API) are fixed by the ledger issue so that
independent tools can check thinkgate; see docs/auditors.md.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from datetime import datetime
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from audit import export, store
from audit.crypto import DecryptionError
from audit.ledger import Ledger, Listed, Opened, ProofUnavailable
from audit.record import Body, Facts
from audit.retention import Hold
from gateway.auth.bearer import authenticate
from gateway.auth.keys import ALL_TENANTS, KeyInfo
from gateway.errors import (
    InvalidRequest,
    LedgerUnavailable,
    NotFound,
    PermissionDenied,
)
from gateway.ledger.translate import translate
from gateway.routes.state import AppState

MAX_PAGE = 1000


def add_routes(app: FastAPI) -> None:
    for path, handler in (
        ("/audit/v1/records", list_records),
        ("/audit/v1/records/{index}", read_record),
        ("/audit/v1/records/{index}/raw", raw_record),
        ("/audit/v1/checkpoint", checkpoint),
        ("/audit/v1/checkpoints", checkpoints),
        ("/audit/v1/timestamp", timestamp),
        ("/audit/v1/public-key", public_key),
        ("/audit/v1/proof/inclusion", inclusion),
        ("/audit/v1/proof/consistency", consistency),
        ("/audit/v1/export", export_records),
        ("/audit/v1/me", me),
    ):
        app.add_api_route(path, handler, methods=["GET"], response_model=None)


async def _auditor(request: Request) -> tuple[Ledger, KeyInfo]:
    state: AppState = request.app.state.tg
    key = await authenticate(state.keys, request.headers.get("authorization"), "auditor")
    if state.ledger is None:
        raise LedgerUnavailable("This gateway runs without a ledger.")
    return state.ledger, key


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


def _record_json(index: int, header: dict[str, Any], leaf: bytes) -> dict[str, Any]:
    names = ("request_id", "tenant", "key_id", "model", "status", "kind", "created_at")
    return {"index": index, **{n: header.get(n) for n in names}, "leaf_hash": _b64(leaf),
            "header": header}  # fmt: skip


def _scoped_tenant(key: KeyInfo, asked: str | None) -> str | None:
    if key.tenant == ALL_TENANTS:
        return asked
    if asked is not None and asked != key.tenant:
        raise PermissionDenied("This auditor key may only read its own tenant's records.")
    return key.tenant


def _given(request: Request) -> dict[str, str]:
    """The query's parameters with a value: an empty one (``?tenant=&since=``, as a form or a
    template leaves it) means no filter, as if it were not there."""
    return {name: value for name, value in request.query_params.items() if value != ""}


async def me(request: Request) -> Response:
    """The calling auditor key: its id and tenant (``*``: every tenant), what the console
    needs to offer a tenant filter only where it can be used."""
    _, key = await _auditor(request)
    return _json({"key_id": key.key_id, "tenant": key.tenant, "role": key.role})


async def list_records(request: Request) -> Response:
    ledger, key = await _auditor(request)
    q = _given(request)
    limit = _int(q, "limit", default=100, low=1, high=MAX_PAGE)
    where = store.Filter(
        tenant=_scoped_tenant(key, q.get("tenant")),
        key_id=q.get("key_id"),
        request_id=q.get("request_id"),
        model=q.get("model"),
        status=q.get("status"),
        kind=q.get("kind"),
        since=_time(q, "since"),
        until=_time(q, "until"),
        after=_cursor(q.get("cursor")),
    )
    guardrail = q.get("guardrail")
    if guardrail is None:
        page = await ledger.find(where, limit + 1)
        more = len(page) > limit
        page = page[:limit]
        next_cursor = _b64(str(page[-1].index).encode()) if more else None
    else:
        page, last = await _guarded(ledger, where, limit, guardrail)
        next_cursor = _b64(str(last).encode()) if last is not None else None
    holds = (await ledger.register(where.tenant)).active(where.tenant)
    data = [{**_record_json(r.index, r.header, r.leaf_hash), "held_by": held_by(holds, r.header)}
            for r in page]  # fmt: skip
    return _json({"object": "list", "data": data, "next_cursor": next_cursor})


def held_by(holds: list[Hold], header: dict[str, Any]) -> list[str]:
    """The legal holds that keep a record (its tenant's, over its time and key)."""
    when, key_id = float(header.get("created_at") or 0), header.get("key_id")
    return [h.id for h in holds
            if h.tenant == header.get("tenant") and h.covers_time(when, key_id)]  # fmt: skip


GUARDRAIL_SCAN = 10_000  # records a guardrail filter reads per page at most


async def _guarded(
    ledger: Ledger, where: store.Filter, limit: int, guardrail: str
) -> tuple[list[Listed], int | None]:
    """Records whose header names a guardrail policy that acted (``guardrail``: a policy,
    ``policy:action``, or ``*`` for any), found by reading the other filters' matches in
    order: at most ``GUARDRAIL_SCAN`` per page, so a rare policy over a long ledger answers a
    short (even empty) page with a cursor to go on from; ``None`` at the end."""
    found: list[Listed] = []
    scanned = 0
    while scanned < GUARDRAIL_SCAN:
        batch = await ledger.find(where, min(500, GUARDRAIL_SCAN - scanned))
        if not batch:
            return found, None
        scanned += len(batch)
        for record in batch:
            if _acted(record.header, guardrail):
                found.append(record)
                if len(found) == limit:
                    return found, record.index
        where = dataclasses.replace(where, after=batch[-1].index)
    return found, where.after


def _acted(header: dict[str, Any], guardrail: str) -> bool:
    acted = header.get("guardrails") or ()
    if guardrail == "*":
        return bool(acted)
    return any(a == guardrail or a.split(":", 1)[0] == guardrail for a in acted)


async def read_record(request: Request) -> Response:
    ledger, key = await _auditor(request)
    index = _int(request.path_params, "index", low=0)
    try:
        record = await ledger.read(index)
    except DecryptionError as exc:
        raise translate(exc) from None
    tenant = None if record is None else record.header.get("tenant")
    if record is None or key.tenant not in (ALL_TENANTS, tenant):
        raise NotFound(f"No record {index}.", code="record_not_found")
    await ledger.append(_access_facts(request, key, index, str(tenant)), Body())
    holds = (await ledger.register(str(tenant))).active(str(tenant))
    # the access record this read appended: its request id finds it in ``records``
    return _json({**_opened_json(record), "access_request_id": request.state.request_id,
                  "held_by": held_by(holds, record.header)})  # fmt: skip


async def raw_record(request: Request) -> Response:
    """The exact stored bytes of one record (base64): the header and the ciphertext, from
    which anyone recomputes the leaf ``SHA-256(0x00 || len(header) || header || ciphertext)``
    (4-byte big-endian length). No decryption, so no access record."""
    ledger, key = await _auditor(request)
    index = _int(request.path_params, "index", low=0)
    only = store.Filter(after=index - 1 if index else None, up_to=index + 1)
    listed = await ledger.find(only, 1)
    tenant = listed[0].header.get("tenant") if listed else None
    if not listed or key.tenant not in (ALL_TENANTS, tenant):
        raise NotFound(f"No record {index}.", code="record_not_found")
    sealed = await ledger.sealed(index)
    return _json({"index": index, "header": _b64(sealed.header),
                  "ciphertext": _b64(sealed.ciphertext),
                  "leaf_hash": _b64(listed[0].leaf_hash)})  # fmt: skip


def _access_facts(request: Request, key: KeyInfo, index: int, tenant: str) -> Facts:
    now = time.time()
    return Facts(kind="access", tenant=tenant, key_id=key.key_id,
                 request_id=request.state.request_id, created_at=now, subject=index)  # fmt: skip


def _opened_json(record: Opened) -> dict[str, Any]:
    out = _record_json(record.index, record.header, record.leaf_hash)
    if record.destroyed:
        out["body"], out["body_status"] = None, "destroyed"
    elif record.body is None:
        out["body"], out["body_status"] = None, "none"
    else:
        b = record.body
        out["body"] = {"messages": b.messages, "params": b.params, "reasoning": b.reasoning,
                       "content": b.content, "tool_calls": b.tool_calls}  # fmt: skip
        out["body_status"] = "ok"
    return out


async def checkpoint(request: Request) -> Response:
    """The latest checkpoint; with ``size=N`` the one for that size, or the smallest stored
    above it (its size is line 2 of the note, and ``x-checkpoint-size``)."""
    ledger, _ = await _auditor(request)
    if "size" in _given(request):
        size = _int(_given(request), "size", low=1)
        found = await ledger.checkpoints(size, 1)
        if not found:
            raise NotFound(f"No checkpoint of size {size} or more yet.", code="no_checkpoint")
        at, _, sized = found[0]
        return Response(sized, media_type="text/plain; charset=utf-8",
                        headers={"x-checkpoint-size": str(at)})  # fmt: skip
    note = await ledger.checkpoint()
    if note is None:
        raise NotFound("The ledger is empty: no checkpoint yet.", code="no_checkpoint")
    return Response(note, media_type="text/plain; charset=utf-8")


async def checkpoints(request: Request) -> Response:
    """Every stored checkpoint from ``size`` (default 1) on, smallest first: ``{"data":
    [{"size", "created_at", "note"}], "next_size"}`` (``limit`` ≤ 1000, default 100;
    ``next_size`` continues the listing, null at the end)."""
    ledger, _ = await _auditor(request)
    q = _given(request)
    size = _int(q, "size", default=1, low=1)
    limit = _int(q, "limit", default=100, low=1, high=MAX_PAGE)
    found = await ledger.checkpoints(size, limit + 1)
    more = len(found) > limit
    stamps = await ledger.timestamps([s for s, _, _ in found[:limit]])
    data = [{"size": s, "created_at": at, "note": note,
             "rfc3161": _b64(stamps[s]) if s in stamps else None}
            for s, at, note in found[:limit]]  # fmt: skip
    return _json({"object": "list", "data": data,
                  "next_size": found[limit][0] if more else None})  # fmt: skip


async def timestamp(request: Request) -> Response:
    """The RFC 3161 TimeStampResp (DER) of the checkpoint of ``size``, 404 if it has none."""
    ledger, _ = await _auditor(request)
    size = _int(_given(request), "size", low=1)
    found = (await ledger.timestamps([size])).get(size)
    if found is None:
        raise NotFound(f"The checkpoint of size {size} has no timestamp.", code="no_timestamp")
    return Response(found, media_type="application/timestamp-reply")


async def public_key(request: Request) -> Response:
    """The verifier key, with no trailing newline (strict base64 decoders refuse one)."""
    ledger, _ = await _auditor(request)
    return Response(ledger.verifier_key(), media_type="text/plain; charset=utf-8")


async def inclusion(request: Request) -> Response:
    ledger, _ = await _auditor(request)
    index = _int(request.query_params, "index", low=0)
    size = _int(request.query_params, "tree_size", low=1)
    try:
        proof = await ledger.inclusion(index, size)
    except ProofUnavailable as exc:
        raise translate(exc, param="tree_size") from None
    return _json({"index": index, "tree_size": size, "leaf_hash": _b64(proof.leaf_hash),
                  "hashes": [_b64(h) for h in proof.hashes]})  # fmt: skip


async def consistency(request: Request) -> Response:
    ledger, _ = await _auditor(request)
    first = _int(request.query_params, "first", low=1)
    second = _int(request.query_params, "second", low=1)
    try:
        hashes = await ledger.consistency(first, second)
    except ProofUnavailable as exc:
        raise translate(exc, param="second") from None
    return _json({"first": first, "second": second, "hashes": [_b64(h) for h in hashes]})


async def export_records(request: Request) -> Response:
    ledger, key = await _auditor(request)
    q = _given(request)
    where = store.Filter(
        tenant=_scoped_tenant(key, q.get("tenant")),
        since=_time(q, "since"),
        until=_time(q, "until"),
    )
    return StreamingResponse(export.export_lines(ledger, where), media_type="application/jsonl")


MAX_INDEX = 2**63 - 1  # the database's BIGINT


def _int(params: Any, name: str, *, default: int | None = None, low: int = 0,
         high: int | None = None) -> int:  # fmt: skip
    raw = params.get(name)
    if raw is None and default is not None:
        return default
    if raw is None:
        raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
    text, top = str(raw), MAX_INDEX if high is None else min(high, MAX_INDEX)
    # at most 19 digits before int(): Python refuses past 4,300, and the database past 2**63
    if not (text.isascii() and text.isdigit() and len(text) <= 19) or not low <= int(text) <= top:
        raise InvalidRequest(f"'{name}' must be an integer between {low} and {top}.", param=name)
    return int(text)


def _time(params: Any, name: str) -> float | None:
    """Seconds since the epoch, or an ISO 8601 / RFC 3339 time with an offset."""
    raw = params.get(name)
    if raw is None:
        return None
    try:
        return parse_time(raw)
    except ValueError as exc:
        raise InvalidRequest(f"'{name}' {exc}.", param=name) from None


def parse_time(raw: str) -> float:
    """Epoch seconds, or an RFC 3339 time with its offset (``2026-12-01T10:00:00Z``);
    ``ValueError`` saying what is expected (the API and the CLI read times alike)."""
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError("must be a time (RFC 3339 or epoch seconds)") from None
    if parsed.tzinfo is None:
        raise ValueError("needs a UTC offset, e.g. 'Z'")
    return parsed.timestamp()


def _cursor(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(base64.b64decode(raw, validate=True).decode("ascii")) if len(raw) <= 64 else -1
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_INDEX:
        raise InvalidRequest("'cursor' is not a cursor this API returned.", param="cursor")
    return value
