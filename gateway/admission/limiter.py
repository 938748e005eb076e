"""The port to ``ratelimit``: a ``Limiter`` admits a request before the upstream is opened and
settles it with the real usage afterwards. The rate limits plug in as
``gateway.admission.ratelimits.KeyLimiter``; ``Unlimited`` serves benchmarks of the relay
alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from audit.record import Usage
from gateway.auth.keys import KeyInfo
from ratelimit.limits import RateLimitBackend, Scope

if TYPE_CHECKING:
    from gateway.admission.spending import SpendAsk


@dataclass(frozen=True, slots=True)
class Admission:
    """A granted request; settled exactly once when the request ends. ``headers`` go on the
    response (``x-ratelimit-*``)."""

    key_id: str
    tenant: str
    reserved_tokens: int
    headers: tuple[tuple[str, str], ...] = ()
    scopes: tuple[Scope, ...] = ()  # the limits it was admitted under (settlement refunds them)
    backend: RateLimitBackend | None = None  # the one that took the reservation: it refunds
    spend: SpendAsk | None = None  # the money it reserved against its budgets, if any

    def __post_init__(self) -> None:
        if (self.scopes or self.spend) and self.backend is None:
            raise ValueError("limited scopes come with the backend that took the reservation")


class Limiter(Protocol):
    def at_once(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission | None:
        """The admission when there is nothing to ask (no limit counts the key, no budget is
        kept for it): nothing reserved, nothing to settle. ``None``: ``admit`` must ask."""
        ...

    async def admit(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission:
        """Reserve ``tokens`` for ``key``, and ``spend`` against its budgets, all or nothing;
        ``RateLimited`` (429) when a limit or a budget refuses."""
        ...

    async def settle(
        self, admission: Admission, used_tokens: int, usage: Usage | None = None
    ) -> None:
        """Refund what the request did not use: tokens, and the money its ``usage`` did not
        cost (no usage: it cost nothing)."""
        ...


class Unlimited:
    """Admits everything, budgets unkept: the gateway without limits (relay benchmarks)."""

    def at_once(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission:
        return Admission(key.key_id, key.tenant, tokens)

    async def admit(self, key: KeyInfo, tokens: int, spend: SpendAsk | None = None) -> Admission:
        return self.at_once(key, tokens, spend)

    async def settle(
        self, admission: Admission, used_tokens: int, usage: Usage | None = None
    ) -> None:
        return None
