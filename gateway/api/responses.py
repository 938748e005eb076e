"""The Responses API request at the edge, translated to the upstream's Chat Completions.

``parse_responses_request(raw, unknown) -> ResponsesRequest`` applies the field policy
(``gateway.api.fields.RESPONSES``, by ``gateway.api.screen``), validates the request (OpenAI
API reference, "Responses") and builds the chat body sent upstream; ``ResponsesRequest.build``
finishes it once the route has what needs I/O (the stored conversation of
``previous_response_id``, the stored items ``item_reference`` names, the opened
``encrypted_content`` tokens, the model's history rule).

- Fields without effect here (``client_metadata``, ``prompt_cache_key``, ``safety_identifier``,
  ``service_tier``, ``max_tool_calls`` (it bounds built-in tools, which do not run here),
  ``user`` (echoed),
  ...) are accepted and not sent on; ``prompt``, ``moderation`` and ``n`` above 1 are refused
  naming them; a field no reference names follows ``UNKNOWN_FIELDS`` (``unknown``: dropped and
  named in ``x-thinkgate-ignored``, or refused).
- ``conversation`` (an id, or ``{"id": ...}``): the route puts the conversation's items first
  (``with_conversation``) and appends the turn once it completed; not with
  ``previous_response_id``.
- ``background``: the route runs the response detached (``gateway.exchange.background``); the
  engine is then asked to stream whatever the client's ``stream``.
- ``input``: a string (one user message) or a list of items (``gateway.api.items``);
  ``item_reference`` items are resolved by the route (``with_references``); ``instructions``
  becomes a leading system message.
- ``max_output_tokens`` → ``max_tokens``; ``temperature``, ``top_p``, ``parallel_tool_calls``
  pass through, as do the engine fields vLLM's own Responses API takes (``seed``,
  ``ignore_eos``, ``repetition_penalty``, ``stop_token_ids``, ``vllm_xargs``, ``cache_salt``);
  ``reasoning.effort`` → ``reasoning_effort`` (the format's thinking switch reads
  it, ``gateway.relay.formats``, and it is the request's reasoning budget,
  ``gateway.relay.effort``); ``reasoning.summary`` (or its alias ``generate_summary``) asks for
  ``summary_text`` parts (``gateway.relay.apis.responses``, for a key that may see reasoning);
  ``reasoning.context`` picks the turns whose reasoning the engine gets back (``current_turn``:
  those after the last user message, ``all_turns``: all; ``auto``: the model's rule);
  ``metadata`` is echoed, not sent.
- ``tools`` and ``tool_choice``: ``gateway.api.tools`` (functions, namespaces flattened, custom
  tools as one-string functions, built-in tools dropped with a notice or refused).
- ``text.format``: ``text``, ``json_object`` or ``json_schema`` (``name``, ``schema``,
  ``strict``) → chat's ``response_format``, the engine's structured output; ``verbosity``
  ignored.
- ``include``: ``reasoning.encrypted_content`` (the reasoning comes back sealed),
  ``message.output_text.logprobs`` (with ``top_logprobs``: the engine's ``logprobs`` and
  ``top_logprobs``, in ``output_text.logprobs``); the built-in tools' outputs are accepted
  without effect (those tools do not run); any other value is a 400 naming it.
- ``store`` (default true), ``previous_response_id``: kept for the route
  (``gateway.conversation``).
- ``truncation``: ``auto`` has the route drop the oldest turns to fit the engine's context
  (``gateway.api.room.truncated``); ``disabled`` (the default) cuts nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.api.fields import RESPONSES, RESPONSES_ENGINE_FIELDS, UnknownFields
from gateway.api.items import (
    History,
    Reference,
    chat_messages,
    handed_back,
    input_items,
    references,
    resolved,
)
from gateway.api.jsonbody import json_object
from gateway.api.screen import screen
from gateway.api.tools import Tools, translate_tool_choice, translate_tools
from gateway.errors import InvalidRequest
from gateway.names.ids import new_response_id
from gateway.names.tools import ToolMap

ENCRYPTED = "reasoning.encrypted_content"
LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = {
    ENCRYPTED, LOGPROBS, "file_search_call.results", "web_search_call.results",
    "web_search_call.action.sources", "message.input_image.image_url",
    "computer_call_output.output.image_url", "code_interpreter_call.outputs",
}  # fmt: skip
MAX_OUTPUT_TOKENS = 1_000_000
MAX_TOP_LOGPROBS = 20
# The reference's efforts (gateway.relay.effort.EFFORTS says what each costs; a test keeps
# the two equal: the relay is this layer's neighbour, not below it).
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SUMMARIES = ("auto", "concise", "detailed")
_CONTEXTS = {"auto": None, "current_turn": "tool_turns", "all_turns": "all"}  # -> turns
HistoryField = str  # "reasoning" | "reasoning_content" | "drop" (settings validate it)


@dataclass(frozen=True, slots=True)
class ReasoningAsked:
    """The request's ``reasoning`` object, as far as it asks something of the gateway."""

    effort: str | None = None
    summary: str | None = None  # auto, concise, detailed: summary_text parts wanted
    turns: str | None = None  # from context: "all" or "tool_turns"; None: the model's rule
    echo: dict[str, Any] = field(default_factory=lambda: {"effort": None, "summary": None})


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    model: str
    stream: bool
    max_tokens: int | None
    messages: list[Any]  # the chat messages sent upstream (for the record)
    params: dict[str, Any]  # the Responses fields other than input (for the record)
    upstream_body: bytes
    echo: dict[str, Any] = field(default_factory=dict)  # parameters the response repeats
    n: int = 1
    wants_reasoning: bool = True
    history: History = field(default_factory=lambda: History([], {}))  # this request's input
    chat: dict[str, Any] = field(default_factory=dict)  # the chat body but its messages
    instructions: list[dict[str, Any]] = field(default_factory=list)
    include_encrypted: bool = False
    store: bool = True
    previous_response_id: str | None = None
    input_items: list[dict[str, Any]] = field(default_factory=list)  # as listed back
    # the turns a follow-up replays: the earlier ones and this input, reasoning in "reasoning"
    conversation: list[dict[str, Any]] = field(default_factory=list)
    response_id: str = field(default_factory=new_response_id)
    references: list[Reference] = field(default_factory=list)  # still to resolve
    raw_input: Any = None  # the input as given, references in it
    tools: ToolMap = field(default_factory=ToolMap)  # engine names -> the client's tools
    dropped: tuple[str, ...] = ()  # built-in tools dropped (x-thinkgate-dropped-tools)
    unknown: tuple[str, ...] = ()  # fields no reference names, accepted (UNKNOWN_FIELDS=ignore)
    summary: bool = False  # summary_text parts asked for
    turns: str | None = None  # reasoning.context's turns, else the model's rule
    logprobs: bool = False  # output_text.logprobs asked for
    background: bool = False  # runs detached; the engine is then always asked to stream
    truncation: str = "disabled"  # "auto": the oldest turns dropped to fit (the route's work)
    conversation_id: str | None = None  # the conversation the turn continues and is added to

    @property
    def params_for_thinking(self) -> dict[str, Any]:
        """The chat fields a format's thinking switch reads (``reasoning_effort``)."""
        effort = (self.echo.get("reasoning") or {}).get("effort")
        return {"reasoning_effort": effort} if effort else {}

    def with_references(
        self, engine: dict[str, dict[str, Any]], listed: dict[str, dict[str, Any]]
    ) -> ResponsesRequest:
        """The request with each ``item_reference`` replaced by the stored item it names:
        ``engine[id]`` as the engine reads it (a reasoning item with its text), ``listed[id]``
        as ``input_items`` lists it (as the key that made it was shown it)."""
        if not self.references:
            return self
        history = chat_messages(resolved(self.raw_input, engine))
        listing = input_items(resolved(self.raw_input, listed), self.response_id)
        return dataclasses.replace(self, history=history, input_items=listing, references=[])

    def with_conversation(self, items: list[dict[str, Any]]) -> ResponsesRequest:
        """The request with the conversation's ``items`` (as the engine reads them) before
        its input; the route then calls ``build``."""
        earlier = chat_messages(items, "conversation") if items else History([], {})
        shift = len(earlier.messages)
        later = {i + shift: parts for i, parts in self.history.reasoning.items()}
        reasoning = {**earlier.reasoning, **later}
        history = History([*earlier.messages, *self.history.messages], reasoning)
        return dataclasses.replace(self, history=history, upstream_body=b"")

    def with_messages(self, messages: list[dict[str, Any]]) -> ResponsesRequest:
        """The request with these messages sent instead (``truncation: "auto"``)."""
        body = {**self.chat, "messages": messages}
        return dataclasses.replace(self, messages=messages, upstream_body=orjson.dumps(body))

    def build(
        self, opened: dict[str, str], history_field: HistoryField,
        earlier: list[dict[str, Any]] | None = None, turns: str = "all",
    ) -> ResponsesRequest:  # fmt: skip
        """The request with its final messages: the instructions, the ``earlier`` turns (a
        stored conversation, reasoning in ``reasoning``), then this input with each sealed
        token replaced by ``opened[token]``; the reasoning field renamed or dropped per
        ``history_field``, kept on the turns ``turns`` says (``reasoning.context`` first). The
        record keeps the messages as sent."""
        conversation = [*(earlier or []), *self.history.with_reasoning(opened)]
        messages = handed_back([*self.instructions, *conversation], history_field,
                               self.turns or turns)  # fmt: skip
        body = {**self.chat, "messages": messages}
        return dataclasses.replace(self, messages=messages, upstream_body=orjson.dumps(body),
                                   conversation=conversation)  # fmt: skip


def parse_responses_request(raw: bytes, unknown: UnknownFields = "ignore") -> ResponsesRequest:
    """Decode, screen, validate and translate; ``InvalidRequest`` (400, with ``param``) on a
    problem. The body is final (``upstream_body``) unless the input has sealed reasoning or
    references, or there is a ``previous_response_id``: then the route calls ``build``."""
    given = json_object(raw)
    screened = screen(given, RESPONSES, unknown)
    body = screened.body
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    refs = references(body.get("input"))
    history = chat_messages(body.get("input"), skip_references=bool(refs))
    tools = translate_tools(body.get("tools"), unknown)
    reasoning = _reasoning(body.get("reasoning"))
    chat: dict[str, Any] = {"model": model, **_sampling(body, reasoning), **_tooling(body, tools)}
    chat.update(_outputs(body))
    previous = _previous(body.get("previous_response_id"))
    conversation = _conversation(body.get("conversation"), previous)
    include = _include(body.get("include"))
    background = _bool(body.get("background"), "background")
    stream = bool(chat.get("stream"))
    if background:  # detached, the response is built from the engine's stream either way
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    call = ResponsesRequest(
        model, stream, chat.get("max_tokens"), [],
        {k: v for k, v in body.items() if k != "input"}, b"",
        _echo(body, given, chat, tools, reasoning), history=history, chat=chat,
        instructions=_instructions(body.get("instructions")),
        include_encrypted=ENCRYPTED in include, store=_store(body.get("store")),
        previous_response_id=previous, references=refs, raw_input=body.get("input"),
        tools=tools.names, dropped=tools.dropped, unknown=screened.unknown,
        summary=reasoning.summary is not None, turns=reasoning.turns,
        logprobs=bool(chat.get("logprobs")), background=background,
        truncation=_truncation(body.get("truncation")), conversation_id=conversation,
    )  # fmt: skip
    if not refs:
        call = dataclasses.replace(call, input_items=input_items(body["input"], call.response_id))
    final = not history.sealed and previous is None and not refs and conversation is None
    return call.build({}, "reasoning") if final else call


def _previous(previous: Any) -> str | None:
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise InvalidRequest("Invalid value for 'previous_response_id'.",
                             param="previous_response_id")  # fmt: skip
    return previous


def _conversation(value: Any, previous: str | None) -> str | None:
    """The conversation's id, given as itself or as ``{"id": ...}``."""
    if value is None:
        return None
    found = value.get("id") if isinstance(value, dict) else value
    if not isinstance(found, str) or not found or len(found) > 64:
        raise InvalidRequest("Invalid value for 'conversation': a conversation id.",
                             param="conversation")  # fmt: skip
    if previous is not None:
        raise InvalidRequest("Mutually exclusive parameters: provide one of "
                             "'previous_response_id' or 'conversation'.",
                             param="conversation")  # fmt: skip
    return found


def _sampling(body: dict[str, Any], reasoning: ReasoningAsked) -> dict[str, Any]:
    """The chat fields for the output budget, sampling and reasoning effort."""
    chat: dict[str, Any] = {}
    max_tokens = _max_output_tokens(body.get("max_output_tokens"))
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = _number(body[name], name)
    if reasoning.effort is not None:
        chat["reasoning_effort"] = reasoning.effort
    for name in ("seed", *RESPONSES_ENGINE_FIELDS):  # vLLM's own: the engine validates them
        if body.get(name) is not None:
            chat[name] = body[name]
    return chat


def _tooling(body: dict[str, Any], tools: Tools) -> dict[str, Any]:
    """The chat fields for tools."""
    chat: dict[str, Any] = {}
    tool_choice, offered = translate_tool_choice(body.get("tool_choice"), tools)
    if offered:
        chat["tools"] = offered
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = _bool(body["parallel_tool_calls"], "parallel_tool_calls")
    return chat


def _outputs(body: dict[str, Any]) -> dict[str, Any]:
    """The chat fields for the output's form: format, stream, logprobs."""
    chat: dict[str, Any] = {}
    response_format = _text_format(body.get("text"))[1]
    if response_format is not None:
        chat["response_format"] = response_format
    if _bool(body.get("stream"), "stream"):
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    top = _top_logprobs(body.get("top_logprobs"))
    if LOGPROBS in _include(body.get("include")) or top:
        chat["logprobs"] = True
        if top:
            chat["top_logprobs"] = top
    return chat


def _echo(body: dict[str, Any], given: dict[str, Any], chat: dict[str, Any], tools: Tools,
          reasoning: ReasoningAsked) -> dict[str, Any]:  # fmt: skip
    """The parameters every response object repeats (``user`` as given: it is not sent on)."""
    names = ("instructions", "max_output_tokens", "metadata", "temperature", "top_p",
             "previous_response_id", "top_logprobs")  # fmt: skip
    echo = {name: body.get(name) for name in names}
    user = given.get("user")
    echo.update(
        user=user if isinstance(user, str) else None,
        reasoning=reasoning.echo,
        store=_store(body.get("store")),
        tools=tools.echo,
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=chat.get("parallel_tool_calls", True),
        text={"format": _text_format(body.get("text"))[0]},
        truncation=_truncation(body.get("truncation")),
        background=bool(body.get("background")),
        conversation=_echoed_conversation(body.get("conversation")),
    )
    return echo


def _echoed_conversation(value: Any) -> dict[str, Any] | None:
    """``{"id": ...}`` of a conversation already validated (``_conversation``)."""
    if value is None:
        return None
    return {"id": value["id"] if isinstance(value, dict) else value}


def _truncation(value: Any) -> str:
    if value is None:
        return "disabled"
    if value not in ("auto", "disabled"):
        raise InvalidRequest("Invalid value for 'truncation': auto or disabled.",
                             param="truncation")  # fmt: skip
    return str(value)


def _include(include: Any) -> list[str]:
    if include is None:
        return []
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise InvalidRequest("'include' must be a list of strings.", param="include")
    for index, value in enumerate(include):
        if value not in INCLUDABLE:
            raise InvalidRequest(f"Invalid value for 'include[{index}]': not one the reference "
                                 "lists.", param="include")  # fmt: skip
    return include


def _top_logprobs(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"Invalid value for 'top_logprobs': 0 to {MAX_TOP_LOGPROBS}.",
                             param="top_logprobs")  # fmt: skip
    return value


def _text_format(text: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The echoed ``text.format`` and chat's ``response_format`` (``None`` for plain text)."""
    if text is None:
        return {"type": "text"}, None
    fmt = text.get("format") if isinstance(text, dict) else ...
    if fmt is None:
        return {"type": "text"}, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return fmt, None  # type: ignore[return-value]
    if kind == "json_object":
        return fmt, {"type": "json_object"}  # type: ignore[return-value]
    if kind == "json_schema":
        name, schema = fmt.get("name"), fmt.get("schema")  # type: ignore[union-attr]
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise InvalidRequest("'text.format' json_schema needs a 'name' and a 'schema'.",
                                 param="text.format")  # fmt: skip
        spec: dict[str, Any] = {"name": name, "schema": schema}
        if fmt.get("strict") is not None:  # type: ignore[union-attr]
            spec["strict"] = _bool(fmt["strict"], "text.format.strict")  # type: ignore[index]
        return fmt, {"type": "json_schema", "json_schema": spec}  # type: ignore[return-value]
    raise InvalidRequest("Invalid value for 'text.format'.", param="text.format")


def _instructions(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, str):
        raise InvalidRequest("'instructions' must be a string.", param="instructions")
    return [{"role": "system", "content": value}]


def _max_output_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise InvalidRequest("Invalid value for 'max_output_tokens'.", param="max_output_tokens")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"Invalid value for '{name}'.", param=name)
    return float(value)


def _bool(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"Invalid value for '{name}'.", param=name)
    return value


def _store(value: Any) -> bool:
    return True if value is None else _bool(value, "store")


def _reasoning(reasoning: Any) -> ReasoningAsked:
    """The ``reasoning`` object: ``effort``, ``summary`` (or ``generate_summary``, its alias),
    ``context``; ``mode`` is OpenAI's execution mode, without effect here."""
    if reasoning is None:
        return ReasoningAsked()
    if not isinstance(reasoning, dict):
        raise InvalidRequest("Invalid value for 'reasoning'.", param="reasoning")
    effort, context = reasoning.get("effort"), reasoning.get("context")
    summary = reasoning.get("summary")
    if summary is None:
        summary = reasoning.get("generate_summary")
        param = "reasoning.generate_summary"
    else:
        param = "reasoning.summary"
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest("Invalid value for 'reasoning.effort'.", param="reasoning.effort")
    if summary is not None and summary not in SUMMARIES:
        raise InvalidRequest(f"Invalid value for '{param}'.", param=param)
    if context is not None and context not in _CONTEXTS:
        raise InvalidRequest("Invalid value for 'reasoning.context': auto, current_turn or "
                             "all_turns.", param="reasoning.context")  # fmt: skip
    echo = {"effort": effort, "summary": summary, **({"context": context} if context else {})}
    return ReasoningAsked(effort, summary, _CONTEXTS.get(context) if context else None, echo)
