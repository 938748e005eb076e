"""The one gate every request passes before an engine is asked: rate limits and KV budget at once.

``Gate.admit(key, candidates, priority, tokens) -> (Ticket, candidates in order)`` asks the
limiter and the KV budget together (with Redis, their two scripts share one round trip,
``ratelimit.autopipe``); whichever refuses, the other's reservation is given back before the
refusal propagates. When one of them has nothing to ask (a key no limit counts and no budget
is kept for; an engine whose KV capacity is unknown), the other is asked alone, in the
request's own task: a task beside it would cost two turns of the event loop before its
script is sent and one after its reply, which is most of the admission's time on a busy
replica (``bench/RESULTS.md``). A ``Ticket`` is settled exactly once by its owner (``exchange``):
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
        if (unlimited := self.limiter.at_once(key, tokens, spend)) is not None:
            grant, ordered = await self.kv.admit(list(candidates), key.tenant, priority, tokens,
                                                 preferred)  # fmt: skip
            return Ticket(unlimited, grant), ordered
        if (unmeasured := self.kv.at_once(candidates)) is not None:
            grant, ordered = unmeasured
            return Ticket(await self.limiter.admit(key, tokens, spend), grant), ordered
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
        either, for the caller to log. When both have a store to ask, the release runs in a
        task beside this one (its first step comes before the flush, so with Redis both
        scripts share one round trip), the refund in this task; otherwise one after the
        other, here."""
        failures: list[BaseException] = []
        releasing = None
        if ticket.admission.backend is not None and ticket.grant.lease is not None:
            releasing = asyncio.ensure_future(self.kv.release(ticket.grant))
            # its outcome is read below, or, should this caller be cancelled first, dropped
            # here as gather's was (the release itself goes on)
            releasing.add_done_callback(_observed)
        try:
            await self.limiter.settle(ticket.admission, used_tokens, usage)
        except Exception as exc:
            failures.append(exc)
        try:
            await (releasing if releasing is not None else self.kv.release(ticket.grant))
        except Exception as exc:
            failures.append(exc)
        return failures


def _observed(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
