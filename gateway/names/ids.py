"""Responses ids (sans-I/O): a response's, and its items', which name the response that made
them, so an ``item_reference`` finds its item by loading that one response (scoped to the tenant
as every load is) rather than searching every stored response. A conversation's id, and the id
of an item a client adds to one, are random and name nothing."""

from __future__ import annotations

import secrets

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs", "custom_tool_call": "ctc",
              "custom_tool_call_output": "ctco"}  # fmt: skip
_RESPONSE_HEX, _ITEM_HEX = 32, 8
_LONE_HEX = 48  # != _RESPONSE_HEX + _ITEM_HEX: never taken for a response's item


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(_RESPONSE_HEX // 2)}"


def new_conversation_id() -> str:
    """``conv_`` and 48 random hex digits, as OpenAI's conversation ids look."""
    return f"conv_{secrets.token_hex(_LONE_HEX // 2)}"


def lone_item_id(kind: str) -> str:
    """A new id for an item no response made (one a client adds to a conversation):
    ``<prefix>_<48 random hex>``, a length ``response_of`` never reads as a response's."""
    return f"{_ID_PREFIX.get(kind, 'item')}_{secrets.token_hex(_LONE_HEX // 2)}"


def item_id(kind: str, response_id: str) -> str:
    """A new id for an item of ``kind`` that response ``response_id`` lists (its input or
    output): ``<prefix>_<the response id's hex><8 random hex>``. An item id names its
    response, so a later ``item_reference`` finds the item by loading that one response
    (scoped to the tenant as every load is) rather than searching every stored response."""
    hexpart = response_id.removeprefix("resp_")
    return f"{_ID_PREFIX.get(kind, 'item')}_{hexpart}{secrets.token_hex(_ITEM_HEX // 2)}"


def response_of(item: str) -> str | None:
    """The id of the response that made the item id ``item`` (``item_id``), or ``None`` for
    an id this gateway did not make."""
    _, _, hexpart = item.partition("_")
    if len(hexpart) != _RESPONSE_HEX + _ITEM_HEX or not _is_hex(hexpart):
        return None
    return f"resp_{hexpart[:_RESPONSE_HEX]}"


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
