"""Files, OpenAI's Batch API and Anthropic's Message Batches (docs/batches.md).

- ``POST /v1/files`` (multipart: ``file``, ``purpose`` ``batch``): the upload is read through
  a bound (``FILES_MAX_BYTES``, else 413) and checked line by line (400 naming the first bad
  line); ``GET /v1/files`` (``purpose``, ``limit`` 1-10,000, ``after``, ``order``),
  ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``.
- ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``GET /v1/batches`` (``limit`` 1-100,
  ``after``), ``POST /v1/batches/{id}/cancel``. An input file whose lines cannot make a batch
  gives a batch ``failed`` with its ``errors``, as the reference does.
- ``POST /v1/messages/batches``, ``GET /v1/messages/batches/{id}``, ``GET
  /v1/messages/batches`` (``limit`` 1-1,000, ``before_id``, ``after_id``), ``GET
  /v1/messages/batches/{id}/results`` (JSONL, once ended), ``POST
  /v1/messages/batches/{id}/cancel``, ``DELETE /v1/messages/batches/{id}`` (once ended);
  errors in Anthropic's shape, ``x-api-key`` as the Messages API takes it.

Everything is the tenant's: any key of the tenant reads its files and batches; lines run as the
key that created the batch. Without the ledger's keys (nothing can be sealed) these routes
answer 400.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from gateway.auth.bearer import authenticate
from gateway.auth.keys import KeyInfo
from gateway.batch.files import FileStore
from gateway.batch.lines import ENDPOINTS, MESSAGES, BadLine, anthropic_lines, check_jsonl
from gateway.batch.lines import openai_lines as read_lines
from gateway.batch.rows import Api, Batch, LimitReached
from gateway.batch.shapes import WINDOW, WINDOW_S, anthropic_batch, anthropic_result, openai_batch
from gateway.batch.store import BatchStore
from gateway.errors import InvalidRequest, NotFound, RateLimited, RequestTooLarge
from gateway.pipeline.steps import authorization
from gateway.routes.state import AppState, app_state


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def _caller(request: Request) -> tuple[AppState, KeyInfo, FileStore, BatchStore]:
    state = app_state(request)
    key = await authenticate(state.keys, authorization(request), "client")
    if state.files is None or state.batches is None:
        raise InvalidRequest("Files and batches need the ledger's keys, which this gateway "
                             "does not have.")  # fmt: skip
    return state, key, state.files, state.batches


def _limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"Invalid value for 'limit': 1 to {most}.", param="limit")
    return int(raw)


# -- files -------------------------------------------------------------------------------------


def _bounded(request: Request, most: int) -> Request:
    """The request with its body cut off past ``most`` bytes (413), whatever its headers say."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > most + (64 << 10):
        raise RequestTooLarge(f"The file exceeds {most} bytes.")
    seen = 0

    async def receive() -> Message:
        nonlocal seen
        message = await request.receive()
        seen += len(message.get("body", b""))
        if seen > most + (64 << 10):  # the form's own fields and boundaries besides the file
            raise RequestTooLarge(f"The file exceeds {most} bytes.")
        return message

    return Request(request.scope, receive)


async def upload_file(request: Request) -> Response:
    state, key, files, _ = await _caller(request)
    most = state.settings.files_max_bytes
    async with _bounded(request, most).form(max_files=1, max_fields=8) as form:
        purpose = form.get("purpose")
        upload = form.get("file")
        if purpose != "batch":
            raise InvalidRequest("Invalid value for 'purpose': only 'batch' files are kept "
                                 "here.", param="purpose")  # fmt: skip
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("Missing required parameter: 'file'.", param="file")
        content = await upload.read(most + 1)
        filename = upload.filename or "upload.jsonl"
    if len(content) > most:
        raise RequestTooLarge(f"The file exceeds {most} bytes.")
    try:
        check_jsonl(content)
    except BadLine as exc:
        raise InvalidRequest(f"The file is not a valid batch input: {exc}", param="file",
                             code="invalid_file") from None  # fmt: skip
    stored = await files.create(key.tenant, key.key_id, "batch", filename[:256], content)
    return _json(stored.to_json())


async def list_files(request: Request) -> Response:
    _, key, files, _ = await _caller(request)
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("Invalid value for 'order': asc or desc.", param="order")
    found, more = await files.list(key.tenant, purpose=q.get("purpose"),
                                   limit=_limit(request, 10_000, 10_000), after=q.get("after"),
                                   ascending=order == "asc")  # fmt: skip
    data = [f.to_json() for f in found]
    return _json({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                  "last_id": data[-1]["id"] if data else None, "has_more": more})  # fmt: skip


def _no_file(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id}", param="id")


async def get_file(request: Request) -> Response:
    _, key, files, _ = await _caller(request)
    file_id = request.path_params["file_id"]
    found = await files.get(key.tenant, file_id)
    if found is None:
        raise _no_file(file_id)
    return _json(found.to_json())


async def file_content(request: Request) -> Response:
    _, key, files, _ = await _caller(request)
    file_id = request.path_params["file_id"]
    found = await files.content(key.tenant, file_id)
    if found is None:
        raise _no_file(file_id)
    return Response(found[1], media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    _, key, files, _ = await _caller(request)
    file_id = request.path_params["file_id"]
    if not await files.delete(key.tenant, file_id):
        raise _no_file(file_id)
    return _json({"id": file_id, "object": "file", "deleted": True})


# -- OpenAI's Batch API ----------------------------------------------------------------------


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise InvalidRequest("The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object.")
    return body


def _limits(state: AppState) -> tuple[int, int]:
    s = state.settings
    return s.batch_max_active_per_tenant, s.batch_max_queued_lines_per_tenant


def _refused(exc: LimitReached) -> RateLimited:
    return RateLimited(str(exc), retry_after=60.0, code="batch_limit_reached")


async def create_batch(request: Request) -> Response:
    state, key, files, batches = await _caller(request)
    body = await _body(request)
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise InvalidRequest(f"Invalid value for 'endpoint': one of {', '.join(ENDPOINTS)}.",
                             param="endpoint")  # fmt: skip
    if body.get("completion_window") != WINDOW:
        raise InvalidRequest("Invalid value for 'completion_window': '24h'.",
                             param="completion_window")  # fmt: skip
    meta = body.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or len(meta) > 16 or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items())):  # fmt: skip
        raise InvalidRequest("Invalid value for 'metadata': up to 16 string pairs.",
                             param="metadata")  # fmt: skip
    file_id = body.get("input_file_id")
    found = await files.content(key.tenant, file_id) if isinstance(file_id, str) else None
    if found is None or not isinstance(file_id, str):
        raise NotFound(f"No such File object: {file_id}", param="input_file_id")
    if found[0].purpose != "batch":
        raise InvalidRequest("The input file's purpose must be 'batch'.", param="input_file_id")
    try:
        lines = read_lines(found[1], endpoint, state.settings.batch_max_lines)
    except BadLine as exc:
        failed = await batches.failed(key.tenant, key.key_id, endpoint, file_id, meta,
                                      {"code": "invalid_request", "message": str(exc),
                                       "param": exc.param, "line": exc.line})  # fmt: skip
        return _json(openai_batch(failed))
    try:
        batch = await batches.create(key.tenant, key.key_id, "openai", endpoint, lines,
                                     window_s=WINDOW_S, metadata=meta, input_file_id=file_id,
                                     limits=_limits(state))  # fmt: skip
    except LimitReached as exc:
        raise _refused(exc) from None
    if state.batch_runner is not None:
        state.batch_runner.wake()
    return _json(openai_batch(batch))


async def _batch(request: Request, api: Api) -> tuple[AppState, KeyInfo, BatchStore, Batch]:
    state, key, _, batches = await _caller(request)
    batch_id = request.path_params["batch_id"]
    batch = await batches.load(key.tenant, batch_id, api)
    if batch is None:
        raise NotFound(f"No such batch: {batch_id}", param="batch_id")
    return state, key, batches, batch


async def get_batch(request: Request) -> Response:
    return _json(openai_batch((await _batch(request, "openai"))[3]))


async def _cancelled(state: AppState, batches: BatchStore, batch: Batch) -> Batch:
    """Cancel the batch: its lines running here stop now, other replicas' at their next
    renewal; ended at once when none was running."""
    await batches.cancel(batch.tenant, batch.id, batch.api)
    if state.batch_runner is not None:
        state.batch_runner.stop({batch.id: "canceled"})
        await state.batch_runner.sweep()
    return await batches.load(batch.tenant, batch.id, batch.api) or batch


async def cancel_batch(request: Request) -> Response:
    state, _, batches, batch = await _batch(request, "openai")
    return _json(openai_batch(await _cancelled(state, batches, batch)))


async def list_batches(request: Request) -> Response:
    _, key, _, batches = await _caller(request)
    found, more = await batches.page(key.tenant, "openai", limit=_limit(request, 20, 100),
                                     after=request.query_params.get("after"))  # fmt: skip
    data = [openai_batch(b) for b in found]
    return _json({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                  "last_id": data[-1]["id"] if data else None, "has_more": more})  # fmt: skip


# -- Anthropic's Message Batches --------------------------------------------------------------


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def create_message_batch(request: Request) -> Response:
    state, key, _, batches = await _caller(request)
    body = await _body(request)
    try:
        lines = anthropic_lines(body.get("requests"), state.settings.batch_max_lines)
    except BadLine as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    try:
        batch = await batches.create(key.tenant, key.key_id, "anthropic", MESSAGES, lines,
                                     window_s=WINDOW_S, limits=_limits(state))  # fmt: skip
    except LimitReached as exc:
        raise _refused(exc) from None
    if state.batch_runner is not None:
        state.batch_runner.wake()
    return _json(anthropic_batch(batch, _base(request)))


async def get_message_batch(request: Request) -> Response:
    return _json(anthropic_batch((await _batch(request, "anthropic"))[3], _base(request)))


async def list_message_batches(request: Request) -> Response:
    _, key, _, batches = await _caller(request)
    q = request.query_params
    limit = _limit(request, 20, 1000)
    after, before = q.get("after_id"), q.get("before_id")
    found, more = await batches.page(key.tenant, "anthropic", limit=limit, after=after,
                                     before=before)  # fmt: skip
    data = [anthropic_batch(b, _base(request)) for b in found]
    return _json({"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
                  "last_id": data[-1]["id"] if data else None})  # fmt: skip


async def message_batch_results(request: Request) -> Response:
    _, _, batches, batch = await _batch(request, "anthropic")
    if batch.ended_at is None:
        raise InvalidRequest(f"Batch {batch.id} has not ended yet: its results are not "
                             "available.")  # fmt: skip
    results = await batches.results(batch)
    body = b"".join(anthropic_result(r) + b"\n" for r in results)
    return Response(body, media_type="application/x-jsonl")


async def cancel_message_batch(request: Request) -> Response:
    state, _, batches, batch = await _batch(request, "anthropic")
    return _json(anthropic_batch(await _cancelled(state, batches, batch), _base(request)))


async def delete_message_batch(request: Request) -> Response:
    _, key, batches, batch = await _batch(request, "anthropic")
    if batch.ended_at is None:
        raise InvalidRequest(f"Batch {batch.id} is still processing: cancel it first.")
    await batches.delete(key.tenant, batch.id, "anthropic")
    return _json({"id": batch.id, "type": "message_batch_deleted"})


def add_routes(app: FastAPI) -> None:
    routes = [
        ("/v1/files", upload_file, "POST"), ("/v1/files", list_files, "GET"),
        ("/v1/files/{file_id}", get_file, "GET"), ("/v1/files/{file_id}", delete_file, "DELETE"),
        ("/v1/files/{file_id}/content", file_content, "GET"),
        ("/v1/batches", create_batch, "POST"), ("/v1/batches", list_batches, "GET"),
        ("/v1/batches/{batch_id}", get_batch, "GET"),
        ("/v1/batches/{batch_id}/cancel", cancel_batch, "POST"),
        ("/v1/messages/batches", create_message_batch, "POST"),
        ("/v1/messages/batches", list_message_batches, "GET"),
        ("/v1/messages/batches/{batch_id}", get_message_batch, "GET"),
        ("/v1/messages/batches/{batch_id}", delete_message_batch, "DELETE"),
        ("/v1/messages/batches/{batch_id}/results", message_batch_results, "GET"),
        ("/v1/messages/batches/{batch_id}/cancel", cancel_message_batch, "POST"),
    ]  # fmt: skip
    for path, handler, method in routes:
        app.add_api_route(path, handler, methods=[method], response_model=None)
