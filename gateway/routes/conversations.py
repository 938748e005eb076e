"""``/v1/conversations``: the Conversations API, shapes as OpenAI's API reference has them.

- ``POST /v1/conversations`` ``{items?, metadata?}`` → the conversation object
  ``{"id": "conv_…", "object": "conversation", "created_at", "metadata"}``;
  ``GET``/``POST`` (``{metadata}``, replacing it)/``DELETE /v1/conversations/{id}`` → the
  object, the object, ``{"id", "object": "conversation.deleted", "deleted": true}``.
- ``GET /v1/conversations/{id}/items`` (``limit`` 1-100, default 20; ``order`` ``asc`` or
  ``desc``, the default; ``after`` an item id; ``include`` accepted, without effect: nothing
  here is left out unless asked for) → ``{"object": "list", "data", "first_id", "last_id",
  "has_more"}``; ``POST …/items`` ``{items}`` → the same list of the items added, as stored;
  ``GET …/items/{item_id}`` → the item; ``DELETE …/items/{item_id}`` → the conversation.

Items are Responses input items, refused as ``POST /v1/responses`` refuses them
(``gateway.api.items.chat_messages``, a 400 naming the item) and stored as OpenAI lists them
(``listed_items``): each with an ``id`` (the client's own when it gave one, as the Agents SDK
does for the output items it adds; else a new ``msg_…``, ``fc_…``, ``rs_…``), a ``type``,
message content as parts (``input_text``, an assistant's ``output_text``), ``status``
``completed`` on messages and function calls and their outputs, a reasoning item's
``summary`` list. At most 20 items per call (and at least one when adding); ``metadata`` at
most 16 pairs, keys up to 64 characters, values strings up to 512.

Every id is the caller's tenant's: an unknown, expired, deleted or another tenant's id is the
same 404. A key whose ``reasoning`` is ``hidden`` never reads reasoning text back: a reasoning
item is listed without its ``content`` and ``summary`` text (its ``encrypted_content`` kept).
An id the conversation already has is a 400 naming the item. Fields no reference names follow
``UNKNOWN_FIELDS``. Conversations are sealed with the ledger's tenant keys
(``gateway.conversation.conversations``): a gateway without them answers 400.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.fields import FieldRule
from gateway.api.items import chat_messages, listed_items
from gateway.api.jsonbody import json_object
from gateway.api.screen import screen
from gateway.auth.bearer import authenticate
from gateway.auth.keys import KeyInfo
from gateway.conversation.conversations import (
    MAX_ITEM_ID_CHARS,
    ConversationStore,
    DuplicateItem,
    Pair,
    StoredConversation,
    UnknownCursor,
)
from gateway.conversation.visibility import for_key_item
from gateway.errors import InvalidRequest, NotFound
from gateway.names.ids import lone_item_id
from gateway.routes.state import AppState, app_state

ENDPOINT = "conversations"
MAX_ITEMS, MAX_PAIRS, MAX_KEY, MAX_VALUE = 20, 16, 64, 512
_ITEMS = FieldRule("honoured", "Responses input items, stored in order")
_METADATA = FieldRule("honoured", "up to 16 string pairs, stored sealed")
_CREATE, _UPDATE, _ADD = {"items": _ITEMS, "metadata": _METADATA}, {"metadata": _METADATA}, {
    "items": _ITEMS}  # fmt: skip
_COMPLETED = frozenset({"message", "function_call", "function_call_output"})
Notes = tuple[tuple[str, str], ...]


async def create_conversation(request: Request) -> Response:
    state = app_state(request)
    key, body, notes = await _body(state, request, _CREATE)
    meta = _metadata(body.get("metadata"))
    items = _items(body.get("items"), least=0)
    try:
        made = await _store(state).create(key.tenant, meta, _pairs(items))
    except DuplicateItem as exc:
        raise _duplicate(exc, items) from None
    return _json(_object(made), notes)


async def retrieve_conversation(request: Request) -> Response:
    key, store, conversation_id = await _caller(request)
    found = await store.get(key.tenant, conversation_id)
    if found is None:
        raise _no_conversation(conversation_id)
    return _json(_object(found))


async def update_conversation(request: Request) -> Response:
    state = app_state(request)
    key, body, notes = await _body(state, request, _UPDATE)
    if "metadata" not in body:
        raise InvalidRequest("Missing required parameter: 'metadata'.", param="metadata")
    conversation_id = request.path_params["conversation_id"]
    meta = _metadata(body["metadata"])
    found = await _store(state).update(key.tenant, conversation_id, meta)
    if found is None:
        raise _no_conversation(conversation_id)
    return _json(_object(found), notes)


async def delete_conversation(request: Request) -> Response:
    key, store, conversation_id = await _caller(request)
    if not await store.delete(key.tenant, conversation_id):
        raise _no_conversation(conversation_id)
    return _json({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def list_items(request: Request) -> Response:
    key, store, conversation_id = await _caller(request)
    q = request.query_params
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("Invalid value for 'order': asc or desc.", param="order")
    limit = q.get("limit", "20")
    if not (limit.isascii() and limit.isdigit() and 1 <= int(limit) <= 100):
        raise InvalidRequest("Invalid value for 'limit': 1 to 100.", param="limit")
    after = q.get("after") or None
    try:
        page = await store.page(key.tenant, conversation_id, limit=int(limit),
                                order="asc" if order == "asc" else "desc", after=after)  # fmt: skip
    except UnknownCursor:
        raise InvalidRequest("Invalid value for 'after': no such item in this conversation.",
                             param="after") from None  # fmt: skip
    if page is None:
        raise _no_conversation(conversation_id)
    shown = key.reasoning == "visible"
    return _json(_list([for_key_item(item.listed, shown) for item in page.items], page.has_more))


async def add_items(request: Request) -> Response:
    state = app_state(request)
    key, body, notes = await _body(state, request, _ADD)
    items = _items(body.get("items"), least=1)
    conversation_id = request.path_params["conversation_id"]
    try:
        added = await _store(state).append(key.tenant, conversation_id, _pairs(items))
    except DuplicateItem as exc:
        raise _duplicate(exc, items) from None
    if not added:
        raise _no_conversation(conversation_id)
    shown = key.reasoning == "visible"
    return _json(_list([for_key_item(item, shown) for item in items], False), notes)


async def retrieve_item(request: Request) -> Response:
    key, store, conversation_id = await _caller(request)
    item_id = request.path_params["item_id"]
    found = await store.item(key.tenant, conversation_id, item_id)
    if found is None:
        if not await store.exists(key.tenant, conversation_id):
            raise _no_conversation(conversation_id)
        raise _no_item(item_id)
    return _json(for_key_item(found.listed, key.reasoning == "visible"))


async def delete_item(request: Request) -> Response:
    key, store, conversation_id = await _caller(request)
    item_id = request.path_params["item_id"]
    conversation = await store.get(key.tenant, conversation_id)
    if conversation is None:
        raise _no_conversation(conversation_id)
    if not await store.delete_item(key.tenant, conversation_id, item_id):
        raise _no_item(item_id)
    return _json(_object(conversation))


# -- reading requests ------------------------------------------------------------------------


async def _body(
    state: AppState, request: Request, fields: dict[str, FieldRule]
) -> tuple[KeyInfo, dict[str, Any], Notes]:
    """The caller's key (before any body is read), the body's known fields, and the header
    naming the unknown ones accepted."""
    key, raw = await state.pipeline.receive(request, "client")
    _store(state)
    screened = screen(json_object(raw), fields, state.settings.unknown_fields)
    return key, screened.body, state.pipeline.unknown_fields(ENDPOINT, screened.unknown)


async def _caller(request: Request) -> tuple[KeyInfo, ConversationStore, str]:
    state = app_state(request)
    key = await authenticate(state.keys, request.headers.get("authorization"), "client")
    return key, _store(state), request.path_params["conversation_id"]


def _store(state: AppState) -> ConversationStore:
    if state.conversations is None:
        raise InvalidRequest("Conversations need the ledger's keys, which this gateway does "
                             "not have.")  # fmt: skip
    return state.conversations


def _metadata(value: Any) -> dict[str, str]:
    """``metadata`` as the reference bounds it; ``null`` is none."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("Invalid type for 'metadata': expected an object.", param="metadata")
    if len(value) > MAX_PAIRS:
        raise InvalidRequest(f"Invalid 'metadata': at most {MAX_PAIRS} key-value pairs.",
                             param="metadata")  # fmt: skip
    for name, text in value.items():
        if len(name) > MAX_KEY or not isinstance(text, str) or len(text) > MAX_VALUE:
            raise InvalidRequest(f"Invalid 'metadata': keys of at most {MAX_KEY} characters, "
                                 f"string values of at most {MAX_VALUE}.",
                                 param="metadata")  # fmt: skip
    return dict(value)


def _items(value: Any, least: int) -> list[dict[str, Any]]:
    """``items``, checked as Responses input, as stored (``listed_items``, then ``_stored``)."""
    if value is None and least == 0:
        return []
    if not isinstance(value, list):
        raise InvalidRequest("Invalid type for 'items': expected an array of items.",
                             param="items")  # fmt: skip
    if not least <= len(value) <= MAX_ITEMS:
        raise InvalidRequest(f"Invalid 'items': {least} to {MAX_ITEMS} items per request.",
                             param="items")  # fmt: skip
    if not value:
        return []
    chat_messages(value, "items")  # every item an object of a type the gateway reads
    for index, item in enumerate(value):
        given, where = item.get("id"), f"items[{index}].id"
        if given is not None and not (isinstance(given, str) and
                                      0 < len(given) <= MAX_ITEM_ID_CHARS):  # fmt: skip
            raise InvalidRequest(f"Invalid value for '{where}': a string of 1 to "
                                 f"{MAX_ITEM_ID_CHARS} characters.", param=where)  # fmt: skip
    return [_stored(item) for item in listed_items(value, lone_item_id)]


def _stored(item: dict[str, Any]) -> dict[str, Any]:
    """An item as OpenAI lists it: calls and their outputs ``completed`` (messages are, by
    ``listed_items``), a reasoning item with its ``summary`` list."""
    if item["type"] in _COMPLETED and item.get("status") is None:
        item["status"] = "completed"
    if item["type"] == "reasoning" and item.get("summary") is None:
        item["summary"] = []
    return item


def _pairs(items: list[dict[str, Any]]) -> list[Pair]:
    return [(item, item) for item in items]  # added through the API: the engine reads it as is


# -- answers ---------------------------------------------------------------------------------


def _object(conversation: StoredConversation) -> dict[str, Any]:
    return {"id": conversation.id, "object": "conversation",
            "created_at": conversation.created_at, "metadata": conversation.metadata}  # fmt: skip


def _list(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}  # fmt: skip


def _json(body: dict[str, Any], notes: Notes = ()) -> Response:
    return Response(orjson.dumps(body), media_type="application/json", headers=dict(notes))


def _no_conversation(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id[:MAX_ITEM_ID_CHARS]}' not found.")


def _no_item(item_id: str) -> NotFound:
    return NotFound(f"Item with id '{item_id[:MAX_ITEM_ID_CHARS]}' not found.")


def _duplicate(exc: DuplicateItem, items: list[dict[str, Any]]) -> InvalidRequest:
    index = next(i for i, item in enumerate(items) if item["id"] == exc.item_id)
    return InvalidRequest(f"An item with id '{exc.item_id}' is already in the conversation.",
                          param=f"items[{index}].id")  # fmt: skip


def add_routes(app: FastAPI) -> None:
    one, items = "/v1/conversations/{conversation_id}", "/v1/conversations/{conversation_id}/items"
    for path, handler, method in (
        ("/v1/conversations", create_conversation, "POST"),
        (one, retrieve_conversation, "GET"),
        (one, update_conversation, "POST"),
        (one, delete_conversation, "DELETE"),
        (items, list_items, "GET"),
        (items, add_items, "POST"),
        (f"{items}/{{item_id}}", retrieve_item, "GET"),
        (f"{items}/{{item_id}}", delete_item, "DELETE"),
    ):
        app.add_api_route(path, handler, methods=[method], response_model=None)
