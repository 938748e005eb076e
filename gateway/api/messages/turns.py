"""The Anthropic Messages API's ``system`` and ``messages``, as the chat messages an engine reads
(sans-I/O).

``conversation(system, messages) -> Conversation``: the leading system message (and the tool
changes the system messages carry), the turns as chat messages with the reasoning each
assistant turn carried (``History``), and the thinking blocks whose text must match their
signature.

- ``system`` and every ``role: "system"`` message inside ``messages`` become one leading
  system message (``gateway.api.messages.system``, which says why and how).
- ``messages``: content a string or blocks. A user turn's ``tool_result`` blocks (each must
  answer a ``tool_use`` of the assistant turn right before it; ``tool_use_id``, ``content`` a
  string or text blocks; ``is_error`` prefixes the text with ``[tool error]``) become ``tool``
  messages, before its text; an assistant turn's ``text`` is its content, ``tool_use`` (``id``,
  ``name``, ``input``) its ``tool_calls`` (``input`` as JSON arguments), ``thinking``
  (``thinking``, ``signature``) and ``redacted_thinking`` (``data``) its reasoning. A thinking
  block's ``signature`` is the gateway's seal of its text (``gateway.relay.apis.messages``); the
  route checks it opens to the very text given, or to any text when the block came back empty
  (``thinking.display: "omitted"`` returned it so). ``image`` and ``document`` blocks are
  refused: the engines behind thinkgate serve text.

The walk runs once per request over what may be an agent's whole context (hundreds of blocks),
so a block's path (``messages[i].content[j]``) is written only for an error (``_where``), and a
text block is read inline, ``gateway.api.messages.text`` called only to name what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.api.items import History, SealedReasoning
from gateway.api.messages.system import ToolChange, system_texts
from gateway.api.messages.text import content_of, text
from gateway.errors import InvalidRequest

Signed = list[tuple[SealedReasoning, str]]  # a thinking block's signature, and its text
_UNREAD = ("image", "document", "search_result")


@dataclass(frozen=True, slots=True)
class Conversation:
    system: list[dict[str, Any]]  # the leading system message, if any
    history: History
    signed: Signed = field(default_factory=list)
    tool_changes: tuple[ToolChange, ...] = ()  # system messages' tool_addition / tool_removal


def conversation(system: Any, messages: Any) -> Conversation:
    """The request's system prompt and turns as chat messages (rules in the module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: a non-empty list", param="messages")
    prompts = system_texts(system)
    chat: list[dict[str, Any]] = []
    reasoning: dict[int, list[str | SealedReasoning]] = {}
    signed: Signed = []
    last_user = -1
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user":
            last_user = i
            content = message.get("content")
            if isinstance(content, str):
                chat.append({"role": "user", "content": content})
            else:
                chat += _user(_blocks(content, i), i, chat[-1] if chat else None)
        elif role == "assistant":
            turn, parts = _assistant(message.get("content"), i, signed)
            if parts:
                reasoning[len(chat)] = parts
            chat.append(turn)
        elif role == "system":
            prompts.add(message, i)
        else:
            raise InvalidRequest(f"messages[{i}].role: user, assistant or system",
                                 param=f"messages[{i}].role")  # fmt: skip
    prompt = prompts.prompt(last_user)
    if not chat:
        raise InvalidRequest("messages: at least one user or assistant message", param="messages")
    leading = [{"role": "system", "content": prompt.text}] if prompt.text else []
    return Conversation(leading, History(chat, reasoning), signed, prompt.tool_changes)


def _blocks(content: Any, i: int) -> list[Any]:
    """Message ``i``'s content, not a string: a list of blocks, else refused."""
    if isinstance(content, list):
        return content
    content_of(content, _where(i))  # raises: neither a string nor blocks
    raise AssertionError("content_of accepted a message's content that is not a list")


def _where(i: int, j: int | None = None, k: int | None = None) -> str:
    """The path of message ``i``'s content, its block ``j``, that block's text block ``k``."""
    path = f"messages[{i}].content"
    if j is not None:
        path += f"[{j}]"
    return path if k is None else f"{path}.content[{k}]"


def _user(blocks: list[Any], i: int, before: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A user turn's blocks, after the chat message ``before`` (``None``: the first)."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            said = block.get("text")
            texts.append(said if isinstance(said, str) else text(block, _where(i, j)))
        elif kind == "tool_result":
            out.append(_tool_result(block, i, j))
        elif kind in _UNREAD:
            where = _where(i, j)
            raise InvalidRequest(f"{where}: '{kind}' content is not supported: the engines "
                                 "behind this gateway read text", param=where)  # fmt: skip
        else:
            where = _where(i, j)
            raise InvalidRequest(f"{where}.type: '{kind}' is not a user content block",
                                 param=f"{where}.type")  # fmt: skip
    if out:
        _answers_calls(out, before, i)
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_result(block: dict[str, Any], i: int, j: int) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        where = _where(i, j)
        raise InvalidRequest(f"{where}.tool_use_id: Field required", param=f"{where}.tool_use_id")
    content = block.get("content")
    result = content if isinstance(content, str) else _result(content, i, j)
    if block.get("is_error") is True:
        result = f"[tool error] {result}"
    return {"role": "tool", "tool_call_id": call_id, "content": result}


def _answers_calls(turn: list[dict[str, Any]], before: dict[str, Any] | None, i: int) -> None:
    """Each ``tool_result`` must answer a ``tool_use`` of the assistant turn just before it, as
    Anthropic's API requires (an engine would otherwise get a result of no call)."""
    calls = {c["id"] for c in (before or {}).get("tool_calls") or ()}
    for message in turn:
        if message["role"] == "tool" and message["tool_call_id"] not in calls:
            param = _where(i)
            raise InvalidRequest(
                f"{param}: tool_result block(s) provided when previous message does not "
                f"contain the matching tool_use block ('{message['tool_call_id']}')",
                param=param,
            )


def _result(content: Any, i: int, j: int) -> str:
    """A ``tool_result``'s content other than a string: none, or text blocks."""
    if content is None:
        return ""
    if not isinstance(content, list):
        param = f"{_where(i, j)}.content"
        raise InvalidRequest(f"{param}: a string or text blocks", param=param)
    texts = []
    for k, block in enumerate(content):
        said = block.get("text") if isinstance(block, dict) and block.get("type") == "text" else 0
        texts.append(said if isinstance(said, str) else text(block, _where(i, j, k)))
    return "\n".join(texts)


def _assistant(
    content: Any, i: int, signed: Signed
) -> tuple[dict[str, Any], list[str | SealedReasoning]]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}, []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    parts: list[str | SealedReasoning] = []
    for j, block in enumerate(_blocks(content, i)):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            said = block.get("text")
            texts.append(said if isinstance(said, str) else text(block, _where(i, j)))
        elif kind == "tool_use":
            calls.append(_tool_use(block, i, j))
        elif kind == "thinking":
            parts.append(_thinking(block, _where(i, j), signed))
        elif kind == "redacted_thinking":
            where = _where(i, j)
            data = block.get("data")
            if not isinstance(data, str) or not data:
                raise InvalidRequest(f"{where}.data: Field required", param=f"{where}.data")
            parts.append(SealedReasoning(data, f"{where}.data"))
        else:
            where = _where(i, j)
            raise InvalidRequest(f"{where}.type: '{kind}' is not an assistant content block",
                                 param=f"{where}.type")  # fmt: skip
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        turn["tool_calls"] = calls
    return turn, parts


def _thinking(block: dict[str, Any], where: str, signed: Signed) -> SealedReasoning:
    said, signature = block.get("thinking"), block.get("signature")
    if not isinstance(said, str) or not isinstance(signature, str) or not signature:
        raise InvalidRequest(f"{where}: a thinking block needs 'thinking' and its 'signature'",
                             param=f"{where}.signature")  # fmt: skip
    sealed = SealedReasoning(signature, f"{where}.signature")
    signed.append((sealed, said))
    return sealed


def _tool_use(block: dict[str, Any], i: int, j: int) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        where = _where(i, j)
        raise InvalidRequest(f"{where}: a tool_use block needs 'id' and 'name'", param=where)
    if not isinstance(arguments, dict):
        where = _where(i, j)
        raise InvalidRequest(f"{where}.input: Input should be an object", param=f"{where}.input")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}  # fmt: skip
