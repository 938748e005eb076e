"""``GET /v1/models``: the union of the upstreams' catalogues (cached by the pool)."""

from __future__ import annotations

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.auth.bearer import authenticate
from gateway.routes.state import app_state


async def models(request: Request) -> Response:
    state = app_state(request)
    await authenticate(state.keys, request.headers.get("authorization"), "client")
    cards = await state.upstreams.model_cards()
    return Response(orjson.dumps({"object": "list", "data": cards}), media_type="application/json")


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/models", models, methods=["GET"], response_model=None)
