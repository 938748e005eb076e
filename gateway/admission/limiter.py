"""The port to ``ratelimit``: a ``Limiter`` admits a request before the upstream is opened and
settles it with the real usage afterwards. The rate limits plug in as
``gateway.admission.ratelimits.KeyLimiter``; ``Unlimited`` serves benchmarks of the relay
alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.auth.keys import KeyInfo
from ratelimit.limits import RateLimitBackend, Scope


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

    def __post_init__(self) -> None:
        if self.scopes and self.backend is None:
            raise ValueError("limited scopes come with the backend that took the reservation")


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
