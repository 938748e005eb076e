"""Admin API (role ``admin``) under ``/admin/v1/``: create, list and revoke keys.

``POST /admin/v1/keys`` returns the secret once, in ``key``; only its hash is stored.
``DELETE /admin/v1/keys/{key_id}`` revokes (the row stays, for the record).
``GET /admin/v1/tenants`` lists the configured tenant and key policies (read-only).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from gateway.auth import keys
from gateway.auth.bearer import authenticate
from gateway.auth.keys import KeyInfo, ReasoningPolicy, Role
from gateway.edge.body import read_body
from gateway.errors import InvalidRequest, NotFound
from gateway.routes.state import AppState


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tenant: str = Field(min_length=1, max_length=64)
    role: Role = "client"
    reasoning: ReasoningPolicy = "hidden"
    rpm: int | None = Field(None, ge=1, le=2**31 - 1)  # an INTEGER column on PostgreSQL
    tpm: int | None = Field(None, ge=1, le=2**31 - 1)


def key_view(info: KeyInfo) -> dict[str, Any]:
    return {
        "id": info.key_id,
        "object": "api_key",
        "tenant": info.tenant,
        "role": info.role,
        "reasoning": info.reasoning,
        "rpm": info.rpm,
        "tpm": info.tpm,
        "created_at": int(info.created_at.timestamp()),
        "revoked_at": int(info.revoked_at.timestamp()) if info.revoked_at else None,
    }


async def create_key(request: Request) -> Response:
    state = await _admin(request)
    try:
        raw = await read_body(request, 64 * 1024, state.settings.body_timeout_s)
        spec = KeyCreate.model_validate_json(raw)
    except ValidationError as exc:
        loc = ".".join(str(p) for p in exc.errors()[0]["loc"]) or None
        raise InvalidRequest(f"Invalid value for '{loc}'.", param=loc) from None
    if not keys.valid_tenant(spec.tenant, spec.role):
        raise InvalidRequest("Tenant names are letters, digits, '.', '_' and '-'.", param="tenant")
    new, info = await state.keys.create(**spec.model_dump())
    body = {**key_view(info), "key": new.secret}
    return Response(orjson.dumps(body), status_code=201, media_type="application/json")


async def list_keys(request: Request) -> Response:
    state = await _admin(request)
    infos = await state.keys.list(request.query_params.get("tenant"))
    body = {"object": "list", "data": [key_view(i) for i in infos]}
    return Response(orjson.dumps(body), media_type="application/json")


async def revoke_key(request: Request) -> Response:
    state = await _admin(request)
    key_id = request.path_params["key_id"]
    if not await state.keys.revoke(key_id):
        raise NotFound(f"No active key '{key_id[:32]}'.", param="key_id")
    return Response(orjson.dumps({"id": key_id, "revoked": True}), media_type="application/json")


async def list_tenants(request: Request) -> Response:
    """The tenants' policies (operator configuration: ``tenants`` in the settings) and the
    per-key policies (``keys``), read-only."""
    state = await _admin(request)
    tenants = [{"tenant": name, **policy.model_dump()}
               for name, policy in sorted(state.settings.tenants.items())]  # fmt: skip
    key_policies = {key_id: policy.model_dump(exclude_none=True)
                    for key_id, policy in sorted(state.settings.keys.items())}  # fmt: skip
    body = {"object": "list", "data": tenants, "key_policies": key_policies}
    return Response(orjson.dumps(body), media_type="application/json")


async def _admin(request: Request) -> AppState:
    state: AppState = request.app.state.tg
    await authenticate(state.keys, request.headers.get("authorization"), "admin")
    return state


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/admin/v1/keys", create_key, methods=["POST"], response_model=None)
    app.add_api_route("/admin/v1/keys", list_keys, methods=["GET"], response_model=None)
    app.add_api_route(
        "/admin/v1/keys/{key_id}", revoke_key, methods=["DELETE"], response_model=None
    )
    app.add_api_route("/admin/v1/tenants", list_tenants, methods=["GET"], response_model=None)
