"""``POST /v1/responses``: the Responses API, translated to the upstream's Chat Completions.

The chat route's recipe with the Responses parser and rewriter: authenticate → read the body
(bounded) → validate and translate (``gateway.api.responses``) → admit → build the Responses
rewriter for this key (``gateway.relay.apis.responses``) → forward to the engine's
``/chat/completions`` → finish (settle and record, endpoint ``responses``). Everything the
chat route guarantees holds: reasoning formats and sources, visibility, limits, KV admission,
one ledger record, metrics, one terminal event after a failure.

Stored responses (``store``, true by default, needs the ledger's keys): once a response
completed it is kept (``gateway.conversation.store``); ``GET /v1/responses/{id}``,
``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items`` read it, scoped to the
caller's tenant, a hidden key never getting reasoning text; ``previous_response_id`` replays
its conversation (reasoning included, per the model's history rule) before the new input; an
``item_reference`` input item is replaced by the stored item it names (``referenced``: a
reasoning item gives the engine its text, whatever the key was shown). A failure to store is
logged and the response still completes (the ledger has the exchange); the id then reads as
unknown.

``conversation`` (``gateway.conversation.conversations``): the conversation's items, as the
engine reads them, come before the input (an unknown id, or another tenant's, is a 404 naming
``conversation``); once the response completed its turn is appended (``_add_turn``), whether or
not the response itself is stored. ``background`` runs the response detached
(``gateway.routes.background``); ``truncation: "auto"`` drops the oldest turns to fit the
engine's context (``truncated_to_fit``).

Notices: fields no reference names (``UNKNOWN_FIELDS=ignore``) are named in
``x-thinkgate-ignored``, built-in tools dropped in ``x-thinkgate-dropped-tools``, and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.responses import ResponsesRequest, parse_responses_request
from gateway.api.room import truncated, truncated_header
from gateway.api.tools import DROPPED_HEADER, dropped_header
from gateway.auth.bearer import authenticate
from gateway.auth.keys import KeyInfo
from gateway.conversation.conversations import ConversationStore
from gateway.conversation.sealing import ReasoningSealer
from gateway.conversation.store import ResponseStore, Stored
from gateway.conversation.visibility import for_key, for_key_item
from gateway.errors import GatewayError, InvalidRequest, NotFound
from gateway.ledger.record import CompletionRecord
from gateway.names.ids import item_id
from gateway.pipeline.steps import claimed_model
from gateway.relay.apis.responses import ResponseMeta, ResponsesStream, ResponsesWhole, Sealer
from gateway.routes import background
from gateway.routes.state import AppState, app_state

ENDPOINT, PATH = "responses", "/chat/completions"
log = logging.getLogger("thinkgate")


async def create_response(request: Request) -> Response:
    state = app_state(request)
    t0, started_at = time.perf_counter(), time.time()
    key, raw = await state.pipeline.receive(request, "client")
    try:
        call = parse_responses_request(raw, state.settings.unknown_fields)
        call = await prepared(state, key, await referenced(state, key, call))
        call, cut = await truncated_to_fit(state, call)
        seal = await _sealer(state, key, call)
        relay = rewriter(state, key, call, seal)
        call = state.pipeline.budgeted(key, call, relay, call.chat)
    except GatewayError as exc:
        state.pipeline.refused(request, key, exc, claimed_model(raw), stream=False)
        raise
    notes = state.pipeline.unknown_fields(ENDPOINT, call.unknown) + _dropped(call) + cut
    keeps = call.store or call.conversation_id is not None
    after = _keeper(state, key, call, relay) if keeps and state.stored else None
    if call.background:
        assert isinstance(relay, ResponsesStream)
        return await background.create(state, request, key, call, relay, (started_at, t0),
                                       after=after, notes=notes)  # fmt: skip
    return await state.pipeline.forward(request, key, call, (ENDPOINT, PATH), relay,
                               (started_at, t0), after=after, notes=notes)  # fmt: skip


def _dropped(call: ResponsesRequest) -> tuple[tuple[str, str], ...]:
    """The notice of the built-in tools dropped: logged, and named in a response header."""
    if call.dropped:
        log.info("built-in tools dropped on %s (UNKNOWN_FIELDS=ignore): %s; named in %s",
                 ENDPOINT, ", ".join(call.dropped), DROPPED_HEADER)  # fmt: skip
    return dropped_header(call.dropped)


async def referenced(state: AppState, key: KeyInfo, call: ResponsesRequest) -> ResponsesRequest:
    """The request with each ``item_reference`` replaced by the item of this tenant's stored
    responses it names. An id not found is a 400 naming it, the same whether it is unknown,
    expired, deleted or another tenant's."""
    if not call.references:
        return call
    found = await _store(state).items(key.tenant, [r.id for r in call.references])
    for reference in call.references:
        if reference.id not in found:
            raise InvalidRequest(f"Item with id '{reference.id}' not found.",
                                 param=reference.param)  # fmt: skip
    engine = {item_id: item.engine for item_id, item in found.items()}
    return call.with_references(engine, {item_id: i.listed for item_id, i in found.items()})


async def truncated_to_fit(
    state: AppState, call: ResponsesRequest
) -> tuple[ResponsesRequest, tuple[tuple[str, str], ...]]:
    """``truncation: "auto"``: the oldest turns dropped until the prompt leaves the answer
    ``min(max_output_tokens, a quarter of the context)`` (``gateway.api.room.truncated``),
    said in ``x-thinkgate-truncated``; nothing when the engines report no context."""
    if call.truncation != "auto":
        return call, ()
    context = await state.upstreams.context_length(call.model)
    if context is None:
        return call, ()
    reserve = min(call.max_tokens or state.settings.default_max_tokens, context // 4)
    rest = len(call.upstream_body) - len(orjson.dumps(call.messages))
    messages, dropped = truncated(call.messages, rest, context, reserve)
    if not dropped:
        return call, ()
    log.info("truncation auto dropped the %d oldest messages to fit a context of %d tokens",
             dropped, context)  # fmt: skip
    return call.with_messages(messages), (truncated_header(dropped, context),)


async def prepared(state: AppState, key: KeyInfo, call: ResponsesRequest) -> ResponsesRequest:
    """The request with the stored conversation it continues, its sealed reasoning opened,
    the reasoning placed per the model's history rule."""
    if call.conversation_id is not None:
        items = await _conversations(state).engine_items(key.tenant, call.conversation_id)
        if items is None:
            raise NotFound(f"Conversation with id '{call.conversation_id}' not found.",
                           param="conversation")  # fmt: skip
        call = call.with_conversation(items)
    sealed = call.history.sealed
    if call.upstream_body and not call.history.reasoning:
        return call  # no reasoning to place: the parser's body is final
    earlier = None
    if call.previous_response_id is not None:
        previous = await _store(state).load(key.tenant, call.previous_response_id)
        if previous is None:
            raise _not_found(call.previous_response_id, "previous_response_id")
        earlier = previous.conversation
    rule = state.settings.reasoning_for(call.model)
    opened = await _sealing(state).open(key.tenant, call.model, sealed) if sealed else {}
    return call.build(opened, rule.history, earlier, rule.turns)


def _keeper(
    state: AppState, key: KeyInfo, call: ResponsesRequest, relay: ResponsesWhole | ResponsesStream
) -> Callable[[CompletionRecord], Awaitable[None]]:
    """Stores the response once it completed (``Exchange.after``), and adds its turn to its
    conversation."""

    async def keep(record: CompletionRecord) -> None:
        final = relay.final_object()
        if final is None or state.stored is None:
            return
        calls = record.tool_calls[0] if record.tool_calls else ()
        content = record.content[0]  # as the client got it: no whitespace-only message
        shown = content if content.strip() or not calls else None
        answer: dict[str, Any] = {"role": "assistant", "content": shown}
        if calls:
            answer["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": c["arguments"]}} for c in calls]  # fmt: skip
        reasoning = record.reasoning[0]
        if reasoning:
            answer["reasoning"] = reasoning
        items = {item["id"]: reasoning for item in final["output"]
                 if item.get("type") == "reasoning" and reasoning}  # fmt: skip
        stored = Stored(final["id"], call.model, final, call.input_items,
                        [*call.conversation, answer], items)  # fmt: skip
        if call.conversation_id is not None:  # first: a poll that sees it done sees the turn
            await _add_turn(state, key, call, final, reasoning)
        if call.store:
            await state.stored.save(key.tenant, key.key_id, stored, call.previous_response_id)

    return keep


async def _add_turn(
    state: AppState, key: KeyInfo, call: ResponsesRequest, final: dict[str, Any], reasoning: str
) -> None:
    """The turn appended to its conversation: the input items, then the output items (a
    reasoning item as its key was shown it, and with its text for the engine; a key that saw
    none gets a reasoning item without text, so the engine still has it next turn). Items
    whose ids the conversation already has (a client that sent them back) are not added
    twice."""
    store = _conversations(state)
    have = {item.get("id") for item in await store.engine_items(key.tenant,
                                                                  call.conversation_id or "")
            or []}  # fmt: skip
    pairs = [(item, item) for item in call.input_items]
    output = list(final["output"])
    if reasoning and not any(item.get("type") == "reasoning" for item in output):
        output.insert(0, {"id": item_id("reasoning", final["id"]), "type": "reasoning",
                          "summary": []})  # fmt: skip
    for item in output:
        engine = item
        if item.get("type") == "reasoning" and reasoning:
            engine = {"id": item["id"], "type": "reasoning", "summary": [],
                      "content": [{"type": "reasoning_text", "text": reasoning}]}  # fmt: skip
        pairs.append((item, engine))
    fresh = [(listed, engine) for listed, engine in pairs if listed.get("id") not in have]
    if not await store.append(key.tenant, call.conversation_id or "", fresh):
        log.warning("conversation of response %s is gone: its turn was not added", final["id"])


def _conversations(state: AppState) -> ConversationStore:
    if state.conversations is None:
        raise InvalidRequest("Conversations need the ledger's keys, which this gateway does not "
                             "have.", param="conversation")  # fmt: skip
    return state.conversations


async def _sealer(state: AppState, key: KeyInfo, call: ResponsesRequest) -> Sealer | None:
    if not call.include_encrypted:
        return None
    return await _sealing(state).sealer(key.tenant, call.model)


def _sealing(state: AppState) -> ReasoningSealer:
    if state.sealer is None:
        raise InvalidRequest("Encrypted reasoning needs the ledger's keys, which this gateway "
                             "does not have.", param="include")  # fmt: skip
    return state.sealer


def _store(state: AppState) -> ResponseStore:
    if state.stored is None:
        raise InvalidRequest("Stored responses need the ledger's keys, which this gateway "
                             "does not have.", param="store")  # fmt: skip
    return state.stored


def _not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"No response found with id '{response_id}'.", param=param)


def rewriter(
    state: AppState, key: KeyInfo, call: ResponsesRequest, seal: Sealer | None = None
) -> ResponsesWhole | ResponsesStream:
    policy = state.pipeline.policy(
        key, call.model, thinking_params=call.params_for_thinking, include_usage=True
    )
    meta = ResponseMeta(call.model, call.echo, id=call.response_id, seal=seal, tools=call.tools,
                        summary=call.summary, logprobs=call.logprobs)  # fmt: skip
    streamed = call.stream or call.background  # a background response is built from events
    return ResponsesStream(policy, meta) if streamed else ResponsesWhole(policy, meta)


async def _caller(request: Request) -> tuple[AppState, KeyInfo, str]:
    state = app_state(request)
    key = await authenticate(state.keys, request.headers.get("authorization"), "client")
    return state, key, request.path_params["response_id"]


async def retrieve_response(request: Request) -> Response:
    """``GET /v1/responses/{id}``: as created (a background one as it stands), minus
    reasoning text for a hidden key; ``stream=true``: its stored stream
    (``gateway.routes.background``)."""
    state, key, response_id = await _caller(request)
    if request.query_params.get("stream") == "true":
        return await background.stream_of(state, request, key, response_id)
    response, _ = await _response_of(state, key, response_id)
    return _json(for_key(response, key.reasoning == "visible"))


async def _response_of(
    state: AppState, key: KeyInfo, response_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The tenant's response and its input items: stored, else a background one as it
    stands; 404 for neither."""
    stored = await _store(state).load(key.tenant, response_id)
    if stored is not None:
        return stored.response, stored.input_items
    running = await background.found(state, key, response_id)
    if running is None:
        raise _not_found(response_id)
    return running.response, running.input_items


async def cancel_response(request: Request) -> Response:
    state, key, _ = await _caller(request)
    return await background.cancel(request, state, key)


async def delete_response(request: Request) -> Response:
    state, key, response_id = await _caller(request)
    ran = await background.forget(state, key, response_id)
    if not await _store(state).delete(key.tenant, response_id) and not ran:
        raise _not_found(response_id)
    return _json({"id": response_id, "object": "response", "deleted": True})


async def list_input_items(request: Request) -> Response:
    """``GET /v1/responses/{id}/input_items``: ``order`` (``desc`` by default), ``limit``
    (1-100, default 20), ``after`` / ``before`` an item id (cursors)."""
    state, key, response_id = await _caller(request)
    _, listed = await _response_of(state, key, response_id)
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("Invalid value for 'order': asc or desc.", param="order")
    limit = q.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise InvalidRequest("Invalid value for 'limit': 1 to 100.", param="limit")
    shown = key.reasoning == "visible"
    items = [for_key_item(i, shown) for i in listed]
    items = items if order == "asc" else items[::-1]
    ids = [i["id"] for i in items]
    for cursor in ("after", "before"):
        if q.get(cursor) is not None and q[cursor] not in ids:
            raise InvalidRequest(f"Invalid value for '{cursor}': no such item.", param=cursor)
    start = ids.index(q["after"]) + 1 if q.get("after") else 0
    stop = ids.index(q["before"]) if q.get("before") else len(items)
    items = items[start:stop]
    page = items[: int(limit)]
    return _json({"object": "list", "data": page,
                  "first_id": page[0]["id"] if page else None,
                  "last_id": page[-1]["id"] if page else None,
                  "has_more": len(items) > len(page)})  # fmt: skip


def _json(body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/responses", create_response, methods=["POST"], response_model=None)
    app.add_api_route("/v1/responses/{response_id}", retrieve_response, methods=["GET"],
                      response_model=None)  # fmt: skip
    app.add_api_route("/v1/responses/{response_id}", delete_response, methods=["DELETE"],
                      response_model=None)  # fmt: skip
    app.add_api_route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"],
                      response_model=None)  # fmt: skip
    app.add_api_route("/v1/responses/{response_id}/input_items", list_input_items,
                      methods=["GET"], response_model=None)  # fmt: skip
