"""The completion record and the sink the gateway hands it to (the port to ``audit``).

The gateway builds one ``CompletionRecord`` per completion, however it ended, and gives it to a
``RecordSink`` in the ``finally`` of the request. The ledger plugs in as
``gateway.ledger.sink.LedgerSink``; ``DiscardSink`` serves benchmarks of the relay alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from audit.record import Usage

__all__ = ["CompletionRecord", "DiscardSink", "RecordSink", "RequestPart", "Status", "Usage",
           "parse_usage", "recordable", "request_fields", "status_of"]  # fmt: skip
from gateway.errors import InvalidRequest, Outcome
from gateway.relay.guarding import GuardAct
from gateway.relay.rewrite import cached_tokens

Status = Literal[
    "ok", "invalid", "upstream_error", "client_disconnected", "cancelled", "error", "started"
]  # started: an exchange's write-ahead intent (audit.intents)


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """Everything the ledger needs about one completion; ``messages`` and texts are sensitive."""

    request_id: str
    endpoint: str  # the API it came through: "chat.completions"
    tenant: str
    key_id: str
    model: str
    upstream: str | None
    stream: bool
    started_at: float  # wall clock, seconds since the epoch
    first_token_at: float | None
    ended_at: float
    status: Status
    error_code: str | None
    client_disconnected: bool
    usage: Usage | None  # as the engine reported it, reasoning tokens filled in
    finish_reasons: tuple[str | None, ...]
    messages: list[Any]
    params: dict[str, Any]  # the request's other fields, as forwarded
    reasoning: tuple[str, ...]  # per choice
    content: tuple[str, ...]  # per choice
    traceparent: str | None = None  # the caller's W3C trace context, as passed upstream
    reasoning_format: str | None = None  # the format the answer was split by
    thinking: bool = True  # False: the request switched thinking off, nothing was split
    # per choice, the calls it made ({"id", "name", "arguments"}); None when no choice made one
    tool_calls: tuple[tuple[dict[str, str], ...], ...] | None = None
    # what guardrail policies did, per choice index (values are hashed before they are sealed)
    guardrails: tuple[tuple[int | None, GuardAct], ...] = ()  # None: the prompt
    intent: str | None = None  # the write-ahead intent this record takes the place of
    batch: tuple[str, str] | None = None  # (batch id, the line's custom_id), for a batch line
    request: RequestPart | None = None  # ``messages`` and ``params`` encoded (``recordable``)


@dataclass(frozen=True, slots=True)
class RequestPart:
    """A record's request part, encoded once for the exchange's intent and its record (an
    agent's context is 100 kB a request): the messages and the parameters as ``Body.encode``
    writes them (keys sorted), which embeds them as they are (``orjson.Fragment``), so a
    body's bytes are those of a fresh encoding. Only for the very objects it encoded."""

    messages: list[Any]
    params: dict[str, Any]
    encoded: tuple[orjson.Fragment, orjson.Fragment]

    def of(self, messages: list[Any], params: dict[str, Any]) -> RequestPart:
        """This part if ``messages`` and ``params`` are what it encoded, else theirs (a step
        changed the request: a guardrail redacted it)."""
        if messages is self.messages and params is self.params:
            return self
        return recordable(messages, params)


def recordable(messages: list[Any], params: dict[str, Any]) -> RequestPart:
    """The request part of a record, encoded; ``InvalidRequest`` naming the field when it
    could not be, before any engine is asked: the rule is that no byte of an answer reaches a
    client unless its record can be written. The request part is the only one a client shapes
    (the answer is text the gateway split), and what a parser keeps of it may differ from the
    body it read (a whole float made an int, a translated API's items), so this encodes
    exactly what the record will, at the depth the record puts it."""
    try:
        return RequestPart(messages, params, (_fragment(messages), _fragment(params)))
    except orjson.JSONEncodeError:
        param = _culprit(messages, params)
        named = f" (field {param!r})" if param else ""
        raise InvalidRequest(f"The request cannot be recorded as sent{named}: a value nests too "
                             "deeply or is out of range.", param=param) from None  # fmt: skip


def _fragment(value: Any) -> orjson.Fragment:
    # inside a list, so that orjson's depth limit counts the level the body puts it at
    return orjson.Fragment(orjson.dumps([value], option=orjson.OPT_SORT_KEYS)[1:-1])


def request_fields(record: CompletionRecord) -> tuple[Any, Any]:
    """The record's messages and parameters for its ``Body``: the part encoded at admission
    when it is the record's own, else the values."""
    part = record.request
    if part is not None and part.messages is record.messages and part.params is record.params:
        return part.encoded
    return record.messages, record.params


def _culprit(messages: list[Any], params: dict[str, Any]) -> str | None:
    """The field whose value cannot be encoded at the depth the record puts it."""
    fields = [("messages", messages), *params.items()]
    for name, value in fields:
        try:
            orjson.dumps({"params": {name: value}})
        except orjson.JSONEncodeError:
            return name
    return None


def parse_usage(raw: Mapping[str, Any] | None) -> Usage | None:
    """The engine's ``usage`` object, read once for every reader (record, metrics, log, the
    settlement); a figure that is not a whole number >= 0 counts as 0, and reasoning tokens are
    never more than the completion's."""
    if not raw:
        return None
    details = raw.get("completion_tokens_details")
    completion = _count(raw.get("completion_tokens"))
    reasoning = _count(details.get("reasoning_tokens")) if isinstance(details, Mapping) else 0
    prompt = _count(raw.get("prompt_tokens"))
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        reasoning_tokens=min(reasoning, completion),
        total_tokens=_count(raw.get("total_tokens")),
        cached_tokens=min(cached_tokens(raw), prompt),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def status_of(outcome: Outcome) -> Status:
    """A completion's record status for an error's outcome: an admitted request ends ok,
    refused by the engine as the client's mistake (``invalid``: an engine's 4xx), failed
    upstream, disconnected, or in error."""
    if outcome in ("invalid", "upstream_error", "client_disconnected"):
        return outcome
    return "error"


class RecordSink(Protocol):
    def accepting(self) -> bool:
        """False while records cannot be stored and the sink wants new requests refused."""
        ...

    async def prepare(self, tenant: str) -> None:
        """Raise (a ``GatewayError``) if a record of ``tenant`` could not be sealed now: called
        before the engine is asked."""
        ...

    async def submit(self, record: CompletionRecord) -> None: ...

    async def intend(self, record: CompletionRecord, progress: Callable[[], Any]) -> Any:
        """Queue the exchange's write-ahead intent before its first token (``None``: none
        was); ``confirm`` it before the first byte of the answer goes out."""
        ...

    async def confirm(self, intention: Any) -> None: ...


class DiscardSink:
    """Drops records: the gateway without a ledger (benchmarks of the relay alone)."""

    def accepting(self) -> bool:
        return True

    async def prepare(self, tenant: str) -> None:
        return None

    async def submit(self, record: CompletionRecord) -> None:
        return None

    async def intend(self, record: CompletionRecord, progress: Callable[[], Any]) -> None:
        return None

    async def confirm(self, intention: Any) -> None:
        return None
