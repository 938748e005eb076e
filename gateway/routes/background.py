"""Background responses at the edge: ``POST /v1/responses`` with ``background: true``,
``GET /v1/responses/{id}?stream=true&starting_after=N`` and ``POST /v1/responses/{id}/cancel``
(the runner: ``gateway.exchange.background``).

- Created: the request is admitted as a foreground one is (limits, KV budget: their 429s are
  the caller's at once), then stored ``queued`` and run detached. Without ``stream``, the
  answer is the ``queued`` response object; with it, the live stream, which is the stored
  one followed (``Runner.follow``): a connection that drops loses nothing.
- ``background`` needs ``store`` (400 ``background`` otherwise, as OpenAI) and the ledger's
  keys (events and state are sealed with them). At most ``BACKGROUND_MAX_PER_KEY`` running per
  key and ``BACKGROUND_MAX_PER_TENANT`` per tenant: beyond, 429 ``rate_limit_exceeded``
  (``background_limit``), counted over every replica (the database's rows; two replicas
  admitting at the same instant may pass the limit by one each).
- Resumed: ``stream=true`` replays the events after ``starting_after`` (default: all) and
  continues live, on any replica; a key of the tenant that may not see reasoning replays none
  (``for_key_event``). A response that is not a background one has no stored stream: 400.
- Cancelled: the response as it ended (``cancelled``, or its earlier end: cancelling again
  returns it unchanged); 400 for a response that did not run in the background.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.api.responses import ResponsesRequest
from gateway.auth.keys import KeyInfo
from gateway.conversation.background import Background
from gateway.conversation.visibility import for_key
from gateway.errors import GatewayError, InvalidRequest, NotFound, RateLimited
from gateway.exchange.background import Runner
from gateway.relay.apis.responses import ResponsesStream
from gateway.routes.state import AppState

ENDPOINT, PATH = "responses", "/chat/completions"


def runner(state: AppState) -> Runner:
    if state.background is None:
        raise InvalidRequest("Background responses need the ledger's keys, which this gateway "
                             "does not have.", param="background")  # fmt: skip
    return state.background


async def create(
    state: AppState, request: Request, key: KeyInfo, call: ResponsesRequest,
    relay: ResponsesStream, started: tuple[float, float], **forward: Any,
) -> Response:  # fmt: skip
    """Admit, store ``queued``, run detached; ``forward`` as ``Pipeline.admitted`` takes it."""
    try:
        run = runner(state)
        if not call.store:
            raise InvalidRequest("Background responses must be stored: 'store' cannot be "
                                 "false with 'background'.", param="background")  # fmt: skip
        await _within_limits(state, run, key)
    except GatewayError as exc:
        state.pipeline.refused(request, key, exc, call.model, call.stream)
        raise
    ex, candidates = await state.pipeline.admitted(request, key, call, (ENDPOINT, PATH), relay,
                                          started, **forward)  # fmt: skip
    try:
        queued = await run.start(ex, candidates, relay, call.input_items)
    except BaseException as exc:  # not stored: nothing runs, the admission is given back
        if isinstance(exc, GatewayError):
            ex.fail(exc)
        await ex.finish()
        raise
    headers = dict((*ex.ticket.headers, *ex.notes))
    if not call.stream:
        return _json(queued, headers)
    events = run.follow(key.tenant, queued["id"], -1, key.reasoning == "visible")
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


async def _within_limits(state: AppState, run: Runner, key: KeyInfo) -> None:
    per_key, per_tenant = await run.store.active(key.tenant, key.key_id)
    s = state.settings
    if per_key >= s.background_max_per_key:
        raise _limited(f"This key has {per_key} background responses running, the most it may; "
                       "wait for one to end or cancel one.")  # fmt: skip
    if per_tenant >= s.background_max_per_tenant:
        raise _limited(f"This tenant has {per_tenant} background responses running, the most "
                       "it may; wait for one to end or cancel one.")  # fmt: skip


def _limited(message: str) -> RateLimited:
    return RateLimited(message, retry_after=1.0, code="background_limit")


async def stream_of(state: AppState, request: Request, key: KeyInfo, response_id: str) -> Response:
    """``GET /v1/responses/{id}?stream=true[&starting_after=N]``: 404 for no such response of
    the tenant, 400 for one that has no stored stream."""
    after = request.query_params.get("starting_after", "-1")
    try:
        starting_after = int(after)
    except ValueError:
        raise InvalidRequest("Invalid value for 'starting_after': an integer.",
                             param="starting_after") from None  # fmt: skip
    run = runner(state)
    if await run.store.load(key.tenant, response_id) is None:
        if state.stored is not None and await state.stored.load(key.tenant, response_id):
            raise InvalidRequest("Only background responses can be streamed again: this one "
                                 "was not created with 'background'.", param="stream")  # fmt: skip
        raise NotFound(f"No response found with id '{response_id}'.")
    events = run.follow(key.tenant, response_id, starting_after, key.reasoning == "visible")
    return StreamingResponse(events, media_type="text/event-stream")


async def cancel(request: Request, state: AppState, key: KeyInfo) -> Response:
    """``POST /v1/responses/{id}/cancel``: the response as it ended."""
    response_id = request.path_params["response_id"]
    run = runner(state)
    if await run.store.load(key.tenant, response_id) is None:
        if state.stored is not None and await state.stored.load(key.tenant, response_id):
            raise InvalidRequest("Cannot cancel a synchronous response: only responses created "
                                 "with 'background' can be cancelled.")  # fmt: skip
        raise NotFound(f"No response found with id '{response_id}'.")
    await run.cancel(key.tenant, response_id)
    found = await run.store.load(key.tenant, response_id)
    if found is None:
        raise NotFound(f"No response found with id '{response_id}'.")
    return _json(for_key(found.response, key.reasoning == "visible"))


async def found(state: AppState, key: KeyInfo, response_id: str) -> Background | None:
    """The tenant's background response as it stands (for ``GET`` and ``input_items``)."""
    if state.background is None:
        return None
    return await state.background.store.load(key.tenant, response_id)


async def forget(state: AppState, key: KeyInfo, response_id: str) -> bool:
    """``DELETE``: a running response is cancelled first; whether there was one."""
    if state.background is None:
        return False
    run = state.background
    if await run.store.load(key.tenant, response_id) is None:
        return False
    await run.cancel(key.tenant, response_id)
    return await run.store.delete(key.tenant, response_id)


def _json(body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)
