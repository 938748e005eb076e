"""A choice's tool calls, put together from the upstream's pieces (sans-I/O).

``ToolCalls.add(raw) -> list[ToolCallPiece]`` takes the ``tool_calls`` list of one streamed
delta (or of a whole message) and returns what it added, call by call; ``calls`` is what the
choice called, for the record and for the Responses API's ``function_call`` items.

Rules (OpenAI's chat stream, which vLLM's tool parsers follow):

- A call is keyed by its ``index``; its first piece brings ``id``, ``type`` and
  ``function.name``, later pieces only ``function.arguments`` text, appended in order. A piece
  that names a new ``id`` for a known index starts nothing new: the first id stays.
- A whole message's ``tool_calls`` have no ``index``: their position is the index.
- Anything that is not this shape is the upstream's protocol error (``RemoteProtocolError``):
  a gateway that guessed would record and hand on calls the model never made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.errors import RemoteProtocolError


@dataclass(slots=True)
class ToolCall:
    """One call as far as it has arrived."""

    index: int
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": "".join(self.arguments)}


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    """What one upstream piece added to call ``call``: ``new`` when it opened the call."""

    call: ToolCall
    arguments: str
    new: bool


@dataclass(slots=True)
class ToolCalls:
    by_index: dict[int, ToolCall] = field(default_factory=dict)

    @property
    def calls(self) -> list[ToolCall]:
        return [self.by_index[i] for i in sorted(self.by_index)]

    def add(self, raw: Any) -> list[ToolCallPiece]:
        if not isinstance(raw, list):
            raise RemoteProtocolError("upstream sent 'tool_calls' that is not a list")
        pieces = []
        for position, item in enumerate(raw):
            if not isinstance(item, dict):
                raise RemoteProtocolError("upstream sent a tool call that is not an object")
            index = item.get("index", position)
            function = item.get("function") or {}
            if not isinstance(function, dict):
                raise RemoteProtocolError(
                    "upstream sent a tool call whose function is not an object"
                )
            arguments = function.get("arguments")
            if type(index) is not int or not isinstance(arguments, str | None):
                raise RemoteProtocolError("upstream sent a malformed tool call")
            call, new = self.by_index.get(index), False
            if call is None:
                name, call_id = function.get("name"), item.get("id")
                if not isinstance(name, str) or not name:
                    raise RemoteProtocolError("upstream began a tool call without a name")
                call_id = call_id if isinstance(call_id, str) and call_id else f"call_{index}"
                call = self.by_index[index] = ToolCall(index, call_id, name)
                new = True
            if arguments:
                call.arguments.append(arguments)
            pieces.append(ToolCallPiece(call, arguments or "", new))
        return pieces
