"""The two small interfaces through which the gateway hands work to ``audit`` and ``ratelimit``.

The gateway builds one ``CompletionRecord`` per chat completion, however it ended, and gives
it to a ``RecordSink`` in the ``finally`` of the request. It asks a ``Limiter`` to admit a
request before opening the upstream and settles it with the real usage afterwards.

The ledger plugs in as ``gateway.ledgersink.LedgerSink``, the rate limits as
``gateway.limiting.KeyLimiter``. ``Unlimited`` and ``DiscardSink`` serve benchmarks of the relay
alone: explicit pass-through implementations, named for what they do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.keys import KeyInfo
from ratelimit.limits import Scope

Status = Literal["ok", "upstream_error", "client_disconnected", "error"]


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """Everything the ledger needs about one completion; ``messages`` and texts are sensitive."""

    request_id: str
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


@dataclass(frozen=True, slots=True)
class Admission:
    """A granted request; settled exactly once when the request ends. ``headers`` go on the
    response (``x-ratelimit-*``)."""

    key_id: str
    tenant: str
    reserved_tokens: int
    headers: tuple[tuple[str, str], ...] = ()
    scopes: tuple[Scope, ...] = ()  # the limits it was admitted under (settlement refunds them)


class Limiter(Protocol):
    async def admit(self, key: KeyInfo, tokens: int) -> Admission:
        """Reserve ``tokens`` for ``key``; ``RateLimited`` (429) when a limit refuses."""
        ...

    async def settle(self, admission: Admission, used_tokens: int) -> None: ...


class Unlimited:
    """Admits everything: the gateway without rate limits (relay benchmarks, tests)."""

    async def admit(self, key: KeyInfo, tokens: int) -> Admission:
        return Admission(key.key_id, key.tenant, tokens)

    async def settle(self, admission: Admission, used_tokens: int) -> None:
        return None
