"""The one gate every request passes before an engine is asked: rate limits and KV budget at once.

``Gate.admit(key, candidates, priority, tokens) -> (Ticket, candidates in order)`` asks the
limiter and the KV budget together (with Redis, their two scripts share one round trip,
``ratelimit.autopipe``); whichever refuses, the other's reservation is given back before the
refusal propagates. A ``Ticket`` is settled exactly once by its owner (``exchange``):
``settle(used)`` refunds the unused tokens and releases the KV lease at once (each to the
backend that reserved it), and reports the failures of either without raising (unrefunded tokens
refill, a lease expires).

Rules:

- A refusal of the KV budget (429 ``kv_budget_exhausted``) still carries the limiter's
  ``x-ratelimit-*`` headers: they are part of the refusal, given when it is made.
- Cancellation while both are asked leaves nothing reserved: a grant already made is released,
  one still in flight is awaited and released (``KVAdmission.abandon``, in a task of its own:
  a caller cancelled again cannot interrupt it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from audit.record import Usage
from gateway.admission.budget import Grant, KVAdmission
from gateway.admission.limiter import Admission, Limiter
from gateway.admission.spending import SpendAsk
from gateway.auth.keys import KeyInfo
from gateway.errors import GatewayError
from gateway.upstream.engine import Upstream
from ratelimit.fairness import Priority


@dataclass(frozen=True, slots=True)
class Ticket:
    """A request admitted by both: what it reserved and what it must give back."""

    admission: Admission
    grant: Grant

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """``x-ratelimit-*`` for the response."""
        return self.admission.headers

    @property
    def reserved_tokens(self) -> int:
        return self.admission.reserved_tokens


@dataclass(frozen=True, slots=True)
class Gate:
    limiter: Limiter
    kv: KVAdmission

    async def admit(
        self,
        key: KeyInfo,
        candidates: Sequence[Upstream],
        priority: Priority,
        tokens: int,
        preferred: int = 0,
        spend: SpendAsk | None = None,
    ) -> tuple[Ticket, list[Upstream]]:
        """``preferred``: how many of the first candidates the router chose (tried first);
        ``spend``: the money to reserve against the key's budgets, with its rate limits."""
        kv = asyncio.ensure_future(
            self.kv.admit(list(candidates), key.tenant, priority, tokens, preferred)
        )
        try:
            admission = await self.limiter.admit(key, tokens, spend)
        except BaseException:
            self.kv.abandon(kv)  # a grant it already had, or makes yet, is given back
            raise
        try:
            grant, ordered = await kv
        except BaseException as exc:
            # Cancelled here, the grant may be made and not yet read: it is given back too.
            self.kv.abandon(kv)
            await self.limiter.settle(admission, 0)  # refused: the reservation comes back whole
            if isinstance(exc, GatewayError):
                raise exc.with_headers(admission.headers) from None
            raise
        return Ticket(admission, grant), ordered

    async def settle(
        self, ticket: Ticket, used_tokens: int, usage: Usage | None = None
    ) -> list[BaseException]:
        """Refund (tokens, and money by ``usage``) and release at once; the failures of
        either, for the caller to log."""
        done = await asyncio.gather(
            self.limiter.settle(ticket.admission, used_tokens, usage),
            self.kv.release(ticket.grant),
            return_exceptions=True,
        )
        return [failure for failure in done if isinstance(failure, BaseException)]
