"""Fair share and priority when the KV budget runs short (sans-I/O).

``decide(request, ...)`` answers ``admit``, ``wait`` or ``reject`` for one request against an
engine's admitted limit, what is reserved on it (in total and per tenant) and which tenants are
waiting; ``route`` applies it to every candidate engine and picks one. Rules, in order:

1. **Pressure** is ``reserved + tokens > limit × pressure_threshold``: the last part of the
   budget (by default 10 %) is headroom kept for ``critical`` work.
   - ``sheddable`` is rejected at once (the client can retry elsewhere or later; queueing it
     would only delay the work that matters), and earlier than pressure: past
     ``SHEDDABLE_SHARE`` of the pressure line (by default 75 %: two thirds of the limit), so
     the work that may use idle capacity only (batch lines) never fills the budget up to where
     a ``standard`` request must wait;
   - ``standard`` waits, even if it would fit, since the headroom is not for it;
   - ``critical`` may use the headroom: it is judged by rule 2 against the full limit, and
     when it must wait it is woken first (``queue_order``).
2. **Fit and fairness**: a request is admitted iff ``reserved + tokens <= limit`` and either no
   other tenant is waiting or the tenant stays within its weighted share of the limit among
   the active tenants (those holding tokens or waiting, and the requester):
   ``(held + tokens) × Σ weights(active) <= limit × weight(tenant)``. Otherwise it waits: a
   tenant above its share yields to the others that wait.
3. **Routing** (``route``): engines are considered in order of free budget (``limit −
   reserved``, most first; ties keep the caller's order, which puts the engine with fewest
   requests in flight first). The first engine that admits is chosen; if none does, the
   request waits if any engine would let it wait, and is rejected only if every engine rejects.

Weights are whole numbers (1 if unlisted), so every product above is an exact integer in a
double as well (below 2^53: a limit of 10^9 tokens times weights summing to 10^6 stays under),
and the Redis script (``ratelimit.kvbudget``) evaluates the same expressions and
decides identically. Fairness applies to every priority, so a tenant cannot starve the others
by marking its work critical. Whether a request that can never fit (``tokens`` above the largest
limit) is refused is the caller's decision: here it waits.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

Priority = Literal["critical", "standard", "sheddable"]
Decision = Literal["admit", "wait", "reject"]

RANK: Mapping[Priority, int] = {"critical": 0, "standard": 1, "sheddable": 2}
PRESSURE_THRESHOLD = 0.9
# the share of the pressure line sheddable work may fill (kvbudget_admit.lua has it too)
SHEDDABLE_SHARE = 0.75
MAX_WEIGHT = 1_000_000


@dataclass(frozen=True, slots=True)
class Request:
    tenant: str
    tokens: int
    priority: Priority = "standard"


@dataclass(frozen=True, slots=True)
class EngineBook:
    """One candidate engine as the request sees it: its admitted limit, the request's
    reservation on it (its block size may differ from another engine's), what is held on it
    and which tenants wait for it."""

    limit: int
    tokens: int
    by_tenant: Mapping[str, int]
    waiting: Collection[str] = ()

    @property
    def reserved(self) -> int:
        return sum(self.by_tenant.values())


class Queued(Protocol):
    """Anything waiting for admission: its priority and when it arrived (any monotone clock or
    sequence number)."""

    @property
    def priority(self) -> Priority: ...

    @property
    def arrived(self) -> float: ...


Q = TypeVar("Q", bound=Queued)


def queue_order(waiters: Iterable[Q]) -> list[Q]:
    """Waiters in the order to wake them: critical first, then standard, then sheddable; within
    a priority, first come first served."""
    return sorted(waiters, key=lambda w: (RANK[w.priority], w.arrived))


def within_share(
    tenant: str, tokens: int, limit: int, by_tenant: Mapping[str, int],
    active: Iterable[str], weights: Mapping[str, int],
) -> bool:  # fmt: skip
    """Whether ``tenant`` holding ``tokens`` more stays within its weighted share of ``limit``
    among ``active`` tenants (exact integer arithmetic)."""
    total = sum(weight_of(weights, t) for t in set(active) | {tenant})
    held = by_tenant.get(tenant, 0) + tokens
    return held * total <= limit * weight_of(weights, tenant)


def decide(
    request: Request,
    *,
    limit: int,
    reserved: int,
    by_tenant: Mapping[str, int],
    waiting: Collection[str] = (),
    weights: Mapping[str, int] | None = None,
    pressure_threshold: float = PRESSURE_THRESHOLD,
) -> Decision:
    """Admit, queue or refuse ``request`` on one engine (rules 1 and 2 of the docstring)."""
    _check_threshold(pressure_threshold)
    after = reserved + request.tokens
    if request.priority == "sheddable" and after > limit * pressure_threshold * SHEDDABLE_SHARE:
        return "reject"
    if request.priority == "standard" and after > limit * pressure_threshold:
        return "wait"
    if after > limit:
        return "wait"
    if not any(t != request.tenant for t in waiting):
        return "admit"
    active = {t for t, held in by_tenant.items() if held > 0} | set(waiting)
    fair = within_share(request.tenant, request.tokens, limit, by_tenant, active, weights or {})
    return "admit" if fair else "wait"


def route(
    tenant: str,
    priority: Priority,
    engines: Sequence[EngineBook],
    *,
    weights: Mapping[str, int] | None = None,
    pressure_threshold: float = PRESSURE_THRESHOLD,
    preferred: int = 0,
) -> tuple[Decision, int | None]:
    """The decision over several engines and the index of the chosen one (rule 3): the first
    ``preferred`` engines in their order, then the rest by most free budget."""
    if not engines:
        raise ValueError("route needs at least one engine")
    first = list(range(min(preferred, len(engines))))
    rest = sorted(range(len(first), len(engines)),
                  key=lambda i: engines[i].reserved - engines[i].limit)  # fmt: skip
    order = first + rest
    verdicts: list[Decision] = []
    for i in order:
        book = engines[i]
        verdict = decide(Request(tenant, book.tokens, priority), limit=book.limit,
                         reserved=book.reserved, by_tenant=book.by_tenant, waiting=book.waiting,
                         weights=weights, pressure_threshold=pressure_threshold)  # fmt: skip
        if verdict == "admit":
            return "admit", i
        verdicts.append(verdict)
    return ("wait" if "wait" in verdicts else "reject"), None


def weight_of(weights: Mapping[str, int], tenant: str) -> int:
    weight = weights.get(tenant, 1)
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(
            f"a tenant's weight must be a whole number in 1..{MAX_WEIGHT}, not {weight}"
        )
    return weight


def _check_threshold(pressure_threshold: float) -> None:
    if not 0 < pressure_threshold <= 1:
        raise ValueError(f"pressure_threshold must be in (0, 1], not {pressure_threshold}")
