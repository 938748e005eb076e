"""The completion record and the sink the gateway hands it to (the port to ``audit``).

The gateway builds one ``CompletionRecord`` per completion, however it ended, and gives it to a
``RecordSink`` in the ``finally`` of the request. The ledger plugs in as
``gateway.ledger.sink.LedgerSink``; ``DiscardSink`` serves benchmarks of the relay alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.errors import Outcome

Status = Literal["ok", "upstream_error", "client_disconnected", "error"]


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
    usage: dict[str, Any] | None
    finish_reasons: tuple[str | None, ...]
    messages: list[Any]
    params: dict[str, Any]  # the request's other fields, as forwarded
    reasoning: tuple[str, ...]  # per choice
    content: tuple[str, ...]  # per choice
    traceparent: str | None = None  # the caller's W3C trace context, as passed upstream
    reasoning_format: str | None = None  # the format the answer was split by
    thinking: bool = True  # False: the request switched thinking off, nothing was split


def status_of(outcome: Outcome) -> Status:
    """A completion's record status for an error's outcome: an admitted request ends ok,
    failed upstream, disconnected, or in error (an engine's 4xx included)."""
    if outcome == "upstream_error" or outcome == "client_disconnected":
        return outcome
    return "error"


class RecordSink(Protocol):
    def accepting(self) -> bool:
        """False while records cannot be stored and the sink wants new requests refused."""
        ...

    async def submit(self, record: CompletionRecord) -> None: ...


class DiscardSink:
    """Drops records: the gateway without a ledger (benchmarks of the relay alone)."""

    def accepting(self) -> bool:
        return True

    async def submit(self, record: CompletionRecord) -> None:
        return None
