"""What a key may read of stored Responses state: no reasoning text for a hidden key, in a
stored response, an item, or a replayed stream event.

- ``for_key(response, shown)``: the response object; a hidden key gets no reasoning text (a
  reasoning item only if it carries ``encrypted_content``).
- ``for_key_item(item, shown)``: an item; a hidden key's reasoning item keeps no ``content`` and
  an empty ``summary``.
- ``for_key_event(name, data, shown)``: a stream event as stored (the creating key's view),
  for a key that replays it; ``None`` when a hidden key gets nothing of it: reasoning deltas,
  reasoning parts, a reasoning item without ``encrypted_content``. An event with nothing to
  withhold comes back as the same bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

_REASONING_EVENTS = frozenset({
    "response.reasoning_text.delta", "response.reasoning_text.done",
    "response.reasoning_summary_text.delta", "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.added", "response.reasoning_summary_part.done",
})  # fmt: skip
_REASONING_PARTS = ("reasoning_text", "summary_text")


def for_key(response: dict[str, Any], shown: bool) -> dict[str, Any]:
    if shown:
        return response
    output = [for_key_item(item, False) for item in response.get("output") or []]
    output = [i for i in output if i.get("type") != "reasoning" or i.get("encrypted_content")]
    return {**response, "output": output}


def for_key_item(item: dict[str, Any], shown: bool) -> dict[str, Any]:
    if shown or item.get("type") != "reasoning":
        return item
    return {k: v for k, v in item.items() if k not in ("content", "summary")} | {"summary": []}


def for_key_event(name: str, data: bytes, shown: bool) -> bytes | None:
    if shown:
        return data
    if name in _REASONING_EVENTS:
        return None
    if b'"reasoning' not in data and b'_text"' not in data:
        return data  # nothing of reasoning in it: as it was
    event = orjson.loads(data)
    part = event.get("part")
    if isinstance(part, dict) and part.get("type") in _REASONING_PARTS:
        return None
    changed = False
    item = event.get("item")
    if isinstance(item, dict) and item.get("type") == "reasoning":
        if not item.get("encrypted_content"):
            return None
        event["item"], changed = for_key_item(item, False), True
    response = event.get("response")
    if isinstance(response, dict) and any(
        isinstance(i, dict) and i.get("type") == "reasoning" for i in response.get("output") or []
    ):
        event["response"], changed = for_key(response, False), True
    return orjson.dumps(event) if changed else data
