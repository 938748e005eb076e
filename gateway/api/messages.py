"""The Anthropic Messages API request at the edge, translated to the upstream's Chat Completions.

``parse_messages_request(raw) -> MessagesRequest`` validates a request as Anthropic's API
reference defines it and builds the chat body; ``MessagesRequest.build`` finishes it once the
route has opened the reasoning that came back sealed (it needs the tenant's key).

- ``max_tokens`` is required; ``system`` (a string or text blocks, ``cache_control`` accepted
  and ignored) becomes a leading system message; ``stop_sequences`` → ``stop``;
  ``temperature``, ``top_p``, ``top_k`` pass through; ``metadata.user_id`` → ``user``.
- ``messages``: content a string or blocks. A user turn's ``tool_result`` blocks (each must
  answer a ``tool_use`` of the assistant turn right before it; ``tool_use_id``,
  ``content`` a string or text blocks; ``is_error`` prefixes the text with ``[tool error]``)
  become ``tool`` messages, before its text; an assistant turn's ``text`` is its content,
  ``tool_use`` (``id``, ``name``, ``input``) its ``tool_calls`` (``input`` as JSON arguments),
  ``thinking`` (``thinking``, ``signature``) and ``redacted_thinking`` (``data``) its
  reasoning. A thinking block's ``signature`` is the gateway's seal of its text (see
  ``gateway.relay.messages``): it must open to the very text given, else the block was changed
  and the request is refused, as Anthropic's API refuses it. ``image`` and ``document`` blocks
  are refused: the engines behind thinkgate serve text.
- ``tools`` (``name``, ``description``, ``input_schema``) become function tools; server tools (a
  ``type`` other than ``custom``) are refused. ``tool_choice`` ``auto`` / ``any`` (→
  ``required``) / ``tool`` (a named function) / ``none``; ``disable_parallel_tool_use`` →
  ``parallel_tool_calls: false``.
- ``thinking``: ``{"type": "enabled", "budget_tokens": N}`` (N below ``max_tokens``, as the
  reference requires) is the request's reasoning budget (``thinking_token_budget``,
  ``gateway.relay.effort``); ``{"type": "disabled"}`` is ``reasoning_effort: "none"`` (thinking
  off where the format can, else a budget of 0); ``adaptive`` sets no budget. Thinking blocks are
  returned only when thinking is enabled or adaptive: a client that did not ask for them reads
  ``content[0].text``. The model still reasons as its format says, and the ledger keeps it.
- Unknown fields are refused (the reference's schema has no extras), but for vLLM's own
  sampling fields (``ENGINE_EXTRAS``: ``seed``, ``min_p``, ``repetition_penalty``,
  ``logit_bias``, ``structured_outputs``, ``chat_template_kwargs``), passed through as on chat;
  ``service_tier`` is
  accepted and ignored; ``container``, ``mcp_servers`` and ``context_management`` are refused
  as features thinkgate does not have.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.api.items import History, SealedReasoning, handed_back
from gateway.api.jsonbody import json_object
from gateway.errors import InvalidRequest

_KNOWN = {
    "model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p",
    "top_k", "tools", "tool_choice", "thinking", "metadata", "stream", "service_tier",
    "container", "mcp_servers", "context_management",
}  # fmt: skip
_NOT_SUPPORTED = ("container", "mcp_servers", "context_management")
# vLLM's own sampling fields a self-hosted client may add: passed through as on chat
ENGINE_EXTRAS = ("seed", "min_p", "repetition_penalty", "logit_bias", "structured_outputs",
                 "chat_template_kwargs")  # fmt: skip
MAX_TOKENS = 1_000_000


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    model: str
    stream: bool
    max_tokens: int
    messages: list[Any]  # the chat messages sent upstream (for the record)
    params: dict[str, Any]  # the Messages fields other than messages (for the record)
    upstream_body: bytes
    chat: dict[str, Any]  # the chat body but its messages
    history: History  # the conversation, reasoning parts per assistant message
    system: list[dict[str, Any]] = field(default_factory=list)
    signed: list[tuple[SealedReasoning, str]] = field(default_factory=list)  # (signature, text)
    show_thinking: bool = False  # the request asked for thinking blocks
    stop_sequences: tuple[str, ...] = ()
    n: int = 1

    @property
    def params_for_thinking(self) -> dict[str, Any]:
        """The chat fields a format's thinking switch reads."""
        effort = self.chat.get("reasoning_effort")
        return {"reasoning_effort": effort} if effort else {}

    def build(
        self, opened: dict[str, str], history_field: str, turns: str = "all"
    ) -> MessagesRequest:
        """The request with each sealed reasoning opened into its turn, handed back per the
        model's history rule."""
        conversation = self.history.with_reasoning(opened)
        messages = handed_back([*self.system, *conversation], history_field, turns)
        body = orjson.dumps({**self.chat, "messages": messages})
        return dataclasses.replace(self, messages=messages, upstream_body=body)


def parse_messages_request(raw: bytes) -> MessagesRequest:
    """Decode, validate and translate; ``InvalidRequest`` (400, with ``param``) on a problem.
    The body is final (``upstream_body``) unless reasoning came back sealed: then the route
    opens it and calls ``build``."""
    body = json_object(raw)
    unknown = sorted(set(body) - _KNOWN - set(ENGINE_EXTRAS))
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: Extra inputs are not permitted", param=unknown[0])
    for name in _NOT_SUPPORTED:
        if body.get(name) is not None:
            raise InvalidRequest(f"'{name}' is not supported by this gateway.", param=name)
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise InvalidRequest("model: Field required", param="model")
    max_tokens = body.get("max_tokens")
    if type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS:
        raise InvalidRequest("max_tokens: Field required (an integer of at least 1)",
                             param="max_tokens")  # fmt: skip
    stream = _bool(body.get("stream"), "stream")
    chat: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    chat.update(_sampling(body))
    chat.update({name: body[name] for name in ENGINE_EXTRAS if name in body})
    chat.update(_tooling(body))
    show_thinking = _thinking(body.get("thinking"), max_tokens, chat)
    if stream:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    history, signed = _conversation(body.get("messages"))
    system = _system(body.get("system"))
    call = MessagesRequest(
        model, stream, max_tokens, [], {k: v for k, v in body.items() if k != "messages"}, b"",
        chat, history, system, signed, show_thinking,
        tuple(chat.get("stop") or ()),
    )  # fmt: skip
    return call.build({}, "reasoning") if not history.sealed else call


def _bool(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name}: Input should be a valid boolean", param=name)
    return value


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidRequest(f"{name}: Input should be a valid number", param=name)
            chat[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if type(top_k) is not int or top_k < 0:
            raise InvalidRequest("top_k: Input should be a non-negative integer", param="top_k")
        chat["top_k"] = top_k
    chat.update(_stops_and_user(body))
    return chat


def _stops_and_user(body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {}
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise InvalidRequest("stop_sequences: a list of non-empty strings",
                                 param="stop_sequences")  # fmt: skip
        if stops:
            chat["stop"] = stops
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise InvalidRequest("metadata: Input should be an object", param="metadata")
        if isinstance(metadata.get("user_id"), str):
            chat["user"] = metadata["user_id"]
    return chat


def _tooling(body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {}
    raw = body.get("tools")
    names: set[str] = set()
    if raw is not None:
        if not isinstance(raw, list):
            raise InvalidRequest("tools: Input should be a valid list", param="tools")
        tools = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(raw)]
        names = {t["function"]["name"] for t in tools}
        if tools:
            chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        chat.update(_tool_choice(choice, names))
    return chat


def _tool(tool: Any, param: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise InvalidRequest(f"{param}: Input should be an object", param=param)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise InvalidRequest(f"{param}.type: server tool '{kind}' is not supported by this "
                             "gateway; only custom tools with an input_schema",
                             param=f"{param}.type")  # fmt: skip
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{param}.name: Field required", param=f"{param}.name")
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param}.input_schema: Field required",
                             param=f"{param}.input_schema")  # fmt: skip
    function: dict[str, Any] = {"name": name, "parameters": schema}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, names: set[str]) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise InvalidRequest("tool_choice.type: one of auto, any, tool, none",
                             param="tool_choice.type")  # fmt: skip
    out: dict[str, Any] = {}
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise InvalidRequest("tool_choice.name: no such tool", param="tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def _thinking(thinking: Any, max_tokens: int, chat: dict[str, Any]) -> bool:
    """Put the thinking setting in ``chat``; whether thinking blocks are to be returned."""
    if thinking is None:
        return False
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if type(budget) is not int or not 0 <= budget < max_tokens:
            raise InvalidRequest("thinking.budget_tokens: an integer below max_tokens",
                                 param="thinking.budget_tokens")  # fmt: skip
        chat["thinking_token_budget"] = budget
        return True
    if kind == "disabled":
        chat["reasoning_effort"] = "none"
        return False
    if kind == "adaptive":
        return True
    raise InvalidRequest("thinking.type: one of enabled, disabled, adaptive",
                         param="thinking.type")  # fmt: skip


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, list):
        raise InvalidRequest("system: a string or a list of text blocks", param="system")
    texts = [_text(block, f"system[{i}]") for i, block in enumerate(system)]
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def _text(block: Any, param: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise InvalidRequest(f"{param}: a text block", param=param)
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"{param}.text: Field required", param=f"{param}.text")
    return text


def _conversation(raw: Any) -> tuple[History, list[tuple[SealedReasoning, str]]]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("messages: a non-empty list", param="messages")
    messages: list[dict[str, Any]] = []
    reasoning: dict[int, list[str | SealedReasoning]] = {}
    signed: list[tuple[SealedReasoning, str]] = []
    for i, message in enumerate(raw):
        param = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"{param}.role: user or assistant", param=f"{param}.role")
        content = message.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise InvalidRequest(f"{param}.content: a string or a list of blocks",
                                 param=f"{param}.content")  # fmt: skip
        if role == "user":
            said = _user(content, f"{param}.content")
            _answers_calls(said, messages[-1] if messages else None, f"{param}.content")
            messages += said
        else:
            turn, parts = _assistant(content, f"{param}.content", signed)
            if parts:
                reasoning[len(messages)] = parts
            messages.append(turn)
    return History(messages, reasoning), signed


def _user(blocks: list[Any], param: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequest(f"{where}.tool_use_id: Field required",
                                     param=f"{where}.tool_use_id")  # fmt: skip
            result = _result(block.get("content"), f"{where}.content")
            if block.get("is_error") is True:
                result = f"[tool error] {result}"
            out.append({"role": "tool", "tool_call_id": call_id, "content": result})
        elif kind in ("image", "document", "search_result"):
            raise InvalidRequest(f"{where}: '{kind}' content is not supported: the engines "
                                 "behind this gateway read text", param=where)  # fmt: skip
        else:
            raise InvalidRequest(f"{where}.type: '{kind}' is not a user content block",
                                 param=f"{where}.type")  # fmt: skip
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _answers_calls(turn: list[dict[str, Any]], before: dict[str, Any] | None, param: str) -> None:
    """Each ``tool_result`` must answer a ``tool_use`` of the assistant turn just before it, as
    Anthropic's API requires (an engine would otherwise get a result of no call)."""
    calls = {c["id"] for c in (before or {}).get("tool_calls") or ()}
    for message in turn:
        if message["role"] == "tool" and message["tool_call_id"] not in calls:
            raise InvalidRequest(
                f"{param}: tool_result block(s) provided when previous message does not "
                f"contain the matching tool_use block ('{message['tool_call_id']}')",
                param=param,
            )


def _result(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{param}: a string or text blocks", param=param)
    return "\n".join(_text(block, f"{param}[{k}]") for k, block in enumerate(content))


def _assistant(
    blocks: list[Any], param: str, signed: list[tuple[SealedReasoning, str]]
) -> tuple[dict[str, Any], list[str | SealedReasoning]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    parts: list[str | SealedReasoning] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        elif kind == "thinking":
            text, signature = block.get("thinking"), block.get("signature")
            if not isinstance(text, str) or not isinstance(signature, str) or not signature:
                raise InvalidRequest(f"{where}: a thinking block needs 'thinking' and its "
                                     "'signature'", param=f"{where}.signature")  # fmt: skip
            sealed = SealedReasoning(signature, f"{where}.signature")
            signed.append((sealed, text))
            parts.append(sealed)
        elif kind == "redacted_thinking":
            data = block.get("data")
            if not isinstance(data, str) or not data:
                raise InvalidRequest(f"{where}.data: Field required", param=f"{where}.data")
            parts.append(SealedReasoning(data, f"{where}.data"))
        else:
            raise InvalidRequest(f"{where}.type: '{kind}' is not an assistant content block",
                                 param=f"{where}.type")  # fmt: skip
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        turn["tool_calls"] = calls
    return turn, parts


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}: a tool_use block needs 'id' and 'name'", param=where)
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"{where}.input: Input should be an object", param=f"{where}.input")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}  # fmt: skip
