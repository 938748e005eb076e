"""Responses API input items, as the chat messages an engine understands (sans-I/O).

``chat_messages(items) -> History``: the list ``input`` of a Responses request (or the stored
items a ``previous_response_id`` brings back) as chat messages, and where the reasoning it
carried goes. The OpenAI API reference's item types, and what each becomes:

- ``message`` (``type`` may be left out) with role ``user``/``system``/``developer``/
  ``assistant`` and content a string or text parts (``input_text``, ``output_text``,
  ``refusal``): a chat message; ``developer`` is sent as ``system`` (chat templates know no
  other). Image, file and audio parts are refused: no engine behind thinkgate serves them yet.
- ``function_call`` (``call_id``, ``name``, ``arguments``, ``namespace``): a ``tool_calls``
  entry of an assistant message, ``{"id": call_id, "type": "function", "function": {name,
  arguments}}``, a namespaced name flattened as its tool was (``gateway.api.tools``).
- ``custom_tool_call`` (``call_id``, ``name``, ``input``, ``namespace``): the same, with the
  free-form ``input`` as the arguments of the function that carries a custom tool,
  ``{"input": input}``.
- ``function_call_output`` and ``custom_tool_call_output`` (``call_id``, ``output``: a string
  or text parts): a ``tool`` message with that ``tool_call_id``.
- ``reasoning`` (``content: [{"type": "reasoning_text", "text"}]`` and/or
  ``encrypted_content``): the reasoning of the assistant turn it belongs to. Plain text is
  used as given; a sealed token is kept as ``SealedReasoning`` for the caller to open (it needs the
  tenant's key: ``gateway.conversation.sealing``). ``summary`` is the reasoning only when the
  item has neither: thinkgate's summaries are the model's own trace, and a client that keeps
  only them (the AI SDK with ``store: false``) hands the trace back so.
- ``item_reference`` (``id``; ``type`` may be left out): an item of a stored response
  (``references``), which the route finds (``gateway.conversation.store``) and puts in its
  place (``resolved``) before the input is read again; read as is, it is refused.
- Anything else (built-in tool calls and their outputs) is refused with a 400 naming the item.

Item ids (``item_id``) name the response that listed the item, so a reference is found by
loading that one stored response of the caller's tenant.

One assistant turn is a run of ``reasoning``, assistant ``message`` and ``function_call``
items, in the order the Responses API itself produces them (reasoning, then text or calls).
A new turn starts at a ``reasoning`` item that follows text or a call, and at an assistant
message that follows a call; any other item ends the turn.

The reasoning of a turn is put in the message's ``reasoning`` field, thinkgate's canonical
place; ``gateway.conversation`` renames or drops it per the model's history rule before the
body goes upstream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.api.tools import custom_arguments, flat_name, required_string
from gateway.errors import InvalidRequest
from gateway.names.ids import item_id

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = {"input_text", "output_text", "refusal"}
_REASONING_TEXT = {"reasoning_text", "summary_text"}
MAX_TOKEN_CHARS = 1_000_000  # an encrypted_content longer than this is not one of ours


@dataclass(frozen=True, slots=True)
class SealedReasoning:
    """An ``encrypted_content`` token still to open, and the field it came in."""

    token: str
    param: str


ReasoningPart = str | SealedReasoning


@dataclass(slots=True)
class Turn:
    """One assistant message being built, and the reasoning parts it carries."""

    message: dict[str, Any]
    reasoning: list[ReasoningPart] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.message.get("content") is not None or bool(self.message.get("tool_calls"))


@dataclass(frozen=True, slots=True)
class History:
    """The chat messages, and for each assistant message with reasoning its parts."""

    messages: list[dict[str, Any]]
    reasoning: dict[int, list[ReasoningPart]]  # message index -> its reasoning parts

    @property
    def sealed(self) -> list[SealedReasoning]:
        return [
            p for parts in self.reasoning.values() for p in parts if isinstance(p, SealedReasoning)
        ]

    def with_reasoning(self, opened: dict[str, str]) -> list[dict[str, Any]]:
        """The messages with each turn's reasoning in its ``reasoning`` field; ``opened``
        maps every sealed token to its text."""
        messages = [dict(m) for m in self.messages]
        for index, parts in self.reasoning.items():
            text = "".join(opened[p.token] if isinstance(p, SealedReasoning) else p for p in parts)
            if text:
                messages[index]["reasoning"] = text
        return messages


def placed(message: dict[str, Any], history_field: str) -> dict[str, Any]:
    """``message`` with its ``reasoning`` field renamed to ``history_field`` (the model's
    history rule: ``reasoning``, ``reasoning_content``) or dropped (``drop``)."""
    if "reasoning" not in message or history_field == "reasoning":
        return message
    out = {k: v for k, v in message.items() if k != "reasoning"}
    if history_field != "drop":
        out[history_field] = message["reasoning"]
    return out


def handed_back(
    messages: list[dict[str, Any]], history_field: str, turns: str = "all"
) -> list[dict[str, Any]]:
    """The messages as sent upstream: each assistant message's ``reasoning`` placed per the
    model's history rule (``placed``); with ``turns`` ``tool_turns`` only the assistant turns
    after the last user message keep it (the tool-call loop in progress, which
    DeepSeek-V3.2/V4 and Kimi K2 refuse without it; DeepSeek recommends dropping the rest)."""
    if history_field == "reasoning" and turns == "all":
        return list(messages)  # every message as it is: no walk over an agent's whole context
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    last_user = users[-1] if users else -1
    out = []
    for index, message in enumerate(messages):
        if "reasoning" in message and turns != "all" and index < last_user:
            message = {k: v for k, v in message.items() if k != "reasoning"}
        out.append(placed(message, history_field))
    return out


def input_items(items: Any, response_id: str) -> list[dict[str, Any]]:
    """The request's ``input`` (already validated by ``chat_messages``, references resolved)
    as the items ``GET /v1/responses/{id}/input_items`` lists: each with an ``id`` (its own,
    else a new one, ``item_id``) and ``type``; a string is one user message; message content
    as parts."""
    return listed_items(items, lambda kind: item_id(kind, response_id))


def listed_items(items: Any, new_id: Callable[[str], str]) -> list[dict[str, Any]]:
    """``input_items`` with the ids of items that have none from ``new_id(kind)`` (a
    conversation's items name no response)."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    listed = []
    for item in items:
        kind = item.get("type", "message")
        out = {**item, "type": kind}
        if out.get("id") is None:
            out["id"] = new_id(kind)
        if kind == "message":
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            if isinstance(item.get("content"), str):
                out["content"] = [{"type": part, "text": item["content"]}]
            out.setdefault("status", "completed")
        listed.append(out)
    return listed


def chat_messages(items: Any, where: str = "input", *, skip_references: bool = False) -> History:
    """``items`` (the request's ``input``) as chat messages; ``InvalidRequest`` names the item.
    ``skip_references``: ``item_reference`` items (``references``) are passed over, to be
    resolved and the input read again; else one is refused."""
    if isinstance(items, str):
        return History([{"role": "user", "content": items}], {})
    if not isinstance(items, list) or not items:
        raise InvalidRequest(f"Missing required parameter: '{where}'.", param=where)
    builder = _Builder(skip_references)
    for index, item in enumerate(items):
        builder.add(item, f"{where}[{index}]")
    return builder.done()


@dataclass(frozen=True, slots=True)
class Reference:
    """An ``item_reference`` input item: the id it names, and the field that named it."""

    id: str
    param: str


MAX_ID_CHARS = 256


def references(items: Any) -> list[Reference]:
    """The ``item_reference`` items of ``input`` (``{"type": "item_reference", "id"}``; the
    reference lets ``type`` be left out of an item that has only an ``id``), each checked."""
    if not isinstance(items, list):
        return []
    found = []
    for index, item in enumerate(items):
        if isinstance(item, dict) and _kind(item) == "item_reference":
            value = item.get("id")
            if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
                raise _invalid(f"input[{index}].id", "must be the id of a stored item")
            found.append(Reference(value, f"input[{index}].id"))
    return found


def resolved(items: list[Any], found: dict[str, dict[str, Any]]) -> list[Any]:
    """``items`` with each ``item_reference`` replaced by ``found[its id]``."""
    return [found[item["id"]] if isinstance(item, dict) and _kind(item) == "item_reference"
            else item for item in items]  # fmt: skip


def _kind(item: dict[str, Any]) -> Any:
    if "type" in item:
        return item["type"]
    return "item_reference" if set(item) == {"id"} else "message"


class _Builder:
    def __init__(self, skip_references: bool = False) -> None:
        self.skip_references = skip_references
        self.messages: list[dict[str, Any]] = []
        self.reasoning: dict[int, list[ReasoningPart]] = {}
        self.turn: Turn | None = None

    def done(self) -> History:
        self._flush()
        return History(self.messages, self.reasoning)

    def add(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise _invalid(where, "an item must be an object")
        kind = _kind(item)
        if not isinstance(kind, str):
            raise _invalid(f"{where}.type", "must be a string")
        if kind == "message":
            self._message(item, where)
        elif kind in ("function_call", "custom_tool_call"):
            self._call(item, kind, where)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self._flush()
            call_id = required_string(item, "call_id", where)
            output = _text(item.get("output"), f"{where}.output")
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            self._reasoning(item, where)
        elif kind == "item_reference" and self.skip_references:
            return
        else:
            raise InvalidRequest(
                f"Input items of type '{kind}' are not supported by this gateway.",
                param=f"{where}.type",
            )

    def _message(self, item: dict[str, Any], where: str) -> None:
        raw_role = item.get("role")
        role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
        if role is None:
            raise _invalid(f"{where}.role", "must be user, system, developer or assistant")
        content = _text(item.get("content"), f"{where}.content")
        if role != "assistant":
            self._flush()
            self.messages.append({"role": role, "content": content})
            return
        if self.turn is not None and self.turn.message.get("tool_calls"):
            self._flush()
        turn = self._turn()
        previous = turn.message.get("content")
        turn.message["content"] = content if previous is None else previous + content

    def _call(self, item: dict[str, Any], kind: str, where: str) -> None:
        """A function call, or a custom tool call as the function that carries it
        (``gateway.api.tools``), its name flattened when it names a namespace."""
        call_id, name = (
            required_string(item, "call_id", where),
            required_string(item, "name", where),
        )
        namespace = item.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise _invalid(f"{where}.namespace", "must be a string")
        key, why = ("input", "a string") if kind == "custom_tool_call" else (
            "arguments", "a string of JSON")  # fmt: skip
        value = item.get(key)
        if not isinstance(value, str):
            raise _invalid(f"{where}.{key}", f"must be {why}")
        arguments = custom_arguments(value) if key == "input" else value
        function = {"name": flat_name(namespace, name), "arguments": arguments}
        call = {"id": call_id, "type": "function", "function": function}
        self._turn().message.setdefault("tool_calls", []).append(call)

    def _reasoning(self, item: dict[str, Any], where: str) -> None:
        if self.turn is not None and self.turn.answered:
            self._flush()
        turn = self._turn()
        token = item.get("encrypted_content")
        content = item.get("content")
        if token is not None:
            if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
                raise InvalidRequest("Invalid 'encrypted_content': not a token this gateway made.",
                                     param=f"{where}.encrypted_content",
                                     code="invalid_encrypted_content")  # fmt: skip
            turn.reasoning.append(SealedReasoning(token, f"{where}.encrypted_content"))
        elif content is not None:
            turn.reasoning += _parts(content, f"{where}.content", "reasoning_text")
        summary = item.get("summary", [])
        if not isinstance(summary, list):
            raise _invalid(f"{where}.summary", "must be a list")
        if token is None and content is None:  # the summary alone: thinkgate's is the trace
            turn.reasoning += _parts(summary, f"{where}.summary", "summary_text")

    def _turn(self) -> Turn:
        if self.turn is None:
            self.turn = Turn({"role": "assistant", "content": None})
        return self.turn

    def _flush(self) -> None:
        turn, self.turn = self.turn, None
        if turn is None:
            return
        if not turn.answered:
            turn.message["content"] = ""  # reasoning alone: the turn said nothing yet
        if turn.reasoning:
            self.reasoning[len(self.messages)] = turn.reasoning
        self.messages.append(turn.message)


def _parts(parts: Any, where: str, kind: str) -> list[str]:
    """The texts of a reasoning item's ``content`` (or ``summary``) parts."""
    if not isinstance(parts, list):
        raise _invalid(where, f"must be a list of {kind} parts")
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or _name(part.get("type")) not in _REASONING_TEXT:
            raise _invalid(f"{where}[{i}]", f"must be a {kind} part")
        text = part.get("text")
        if not isinstance(text, str):
            raise _invalid(f"{where}[{i}].text", "must be a string")
        texts.append(text)
    return texts


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(where, "must be a string or a list of text parts")
    texts = []
    for i, part in enumerate(content):
        kind = _name(part.get("type")) if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise InvalidRequest(
                f"Content parts of type '{kind}' are not supported by this gateway "
                f"('{where}[{i}]'): only text.",
                param=f"{where}[{i}]",
            )
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise _invalid(f"{where}[{i}].text", "must be a string")
        texts.append(text)
    return "".join(texts)


def _name(value: Any) -> str | None:
    """A client's value where a name is expected: a string, else nothing (a list or object
    cannot even be looked up)."""
    return value if isinstance(value, str) else None


def _invalid(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid value for '{param}': {why}.", param=param)
