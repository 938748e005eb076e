"""The log's public read API, C2SP tlog-tiles (``audit.tiles``), under ``/tlog/``.

- ``GET /tlog/checkpoint``: the latest *published* checkpoint, to anyone (it holds a size and
  a hash: what a witness or a monitor needs to follow the log). Published: with witnesses
  configured, cosigned by ``WITNESS_QUORUM`` of them; with a TSA, stamped; with neither, the
  latest signed. So every checkpoint a follower sees carries what the deployment promises;
  the commits between two published ones stay in ``/audit/v1/checkpoints`` for auditors.
- ``GET /tlog/public-key``: the verifier key of the log's checkpoints (``<name>+<id>+<key>``),
  to anyone; a follower should still pin it from the operator, out of band.
- ``GET /tlog/tile/<L>/<N>[.p/<W>]``: hash tiles, to anyone (hashes only).
- ``GET /tlog/tile/entries/<N>[.p/<W>]``: entry bundles (every tenant's record headers and
  ciphertexts), to an auditor key of tenant ``*`` only, or to anyone with
  ``TLOG_PUBLIC_ENTRIES=true``.

Tiles are read with the latest checkpoint in one transaction and exist for its tree size.
Full tiles never change: ``Cache-Control: public, max-age=31536000, immutable``; partial tiles
and the checkpoint: ``no-cache``. A path that names no tile, or a tile that tree lacks, is 404.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from audit.tiles import EntryTooLarge, TileError, parse_tile_path
from gateway.auth.bearer import authenticate
from gateway.auth.keys import ALL_TENANTS
from gateway.errors import Conflict, LedgerUnavailable, NotFound, PermissionDenied
from gateway.routes.state import AppState

IMMUTABLE = "public, max-age=31536000, immutable"
TEXT = "text/plain; charset=utf-8"


def add_routes(app: FastAPI) -> None:
    for path, handler in (
        ("/tlog/checkpoint", checkpoint),
        ("/tlog/public-key", public_key),
        ("/tlog/tile/{rest:path}", tile),
    ):
        app.add_api_route(path, handler, methods=["GET"], response_model=None)


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.tg
    if state.ledger is None:
        raise LedgerUnavailable("This gateway runs without a ledger.")
    return state


async def checkpoint(request: Request) -> Response:
    state = _state(request)
    assert state.ledger is not None
    names, quorum, stamped = state.settings.publish_policy
    note = await state.ledger.published(names, quorum, stamped)
    if note is None:
        wanted = [f"cosigned by {quorum} witnesses"] * bool(quorum) + ["timestamped"] * stamped
        why = f" (one {' and '.join(wanted)})" if wanted else ": the ledger is empty"
        raise NotFound(f"No checkpoint published yet{why}.", code="no_checkpoint")
    return Response(note, media_type=TEXT, headers={"cache-control": "no-cache"})


async def public_key(request: Request) -> Response:
    state = _state(request)
    assert state.ledger is not None
    return Response(state.ledger.verifier_key(), media_type=TEXT)


async def tile(request: Request) -> Response:
    state = _state(request)
    assert state.ledger is not None
    try:
        ref = parse_tile_path(request.path_params["rest"])
    except TileError as exc:
        raise NotFound(f"No such tile: {exc}.", code="tile_not_found") from None
    if ref.level is None and not state.settings.tlog_public_entries:
        key = await authenticate(state.keys, request.headers.get("authorization"), "auditor")
        if key.tenant != ALL_TENANTS:
            raise PermissionDenied("Entry bundles hold every tenant's records: they need an "
                                   "auditor key of tenant '*'.")  # fmt: skip
    try:
        found = await state.ledger.tile(ref)
    except EntryTooLarge as exc:
        raise Conflict(str(exc), code="entry_too_large") from None
    if found is None:
        raise NotFound("The log has no such tile (yet).", code="tile_not_found")
    _, data = found
    cache = IMMUTABLE if ref.full else "no-cache"
    return Response(data, media_type="application/octet-stream", headers={"cache-control": cache})
