"""Fair share and priority when an engine's KV budget runs short (sans-I/O).

``decide(request, ...)`` answers ``admit``, ``wait`` or ``reject`` for one request against an
engine's admitted limit, what is reserved on it (in total and per tenant) and which tenants are
waiting. Rules, in order:

1. **Pressure** is ``reserved + tokens > limit × pressure_threshold``: the last part of the
   budget (by default 10 %) is headroom kept for ``critical`` work.
   - ``sheddable`` is rejected at once (the client can retry elsewhere or later; queueing it
     would only delay the work that matters);
   - ``standard`` waits, even if it would fit, since the headroom is not for it;
   - ``critical`` may use the headroom: it is judged by rule 2 against the full limit, and
     when it must wait it is woken first (``queue_order``).
2. **Fit and fairness**: a request is admitted iff ``reserved + tokens <= limit`` and either no
   other tenant is waiting or the tenant's reservation stays within its weighted share of the
   limit (``share``) among the active tenants (those holding tokens or waiting, and the
   requester). Otherwise it waits: a tenant above its share yields to the others that wait.

Fairness applies to every priority, so a tenant cannot starve the others by marking its work
critical. Whether a request that can never fit (``tokens`` above the largest limit) is refused
is the caller's decision: here it waits.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Protocol, TypeVar

Priority = Literal["critical", "standard", "sheddable"]
Decision = Literal["admit", "wait", "reject"]

RANK: Mapping[Priority, int] = {"critical": 0, "standard": 1, "sheddable": 2}
PRESSURE_THRESHOLD = 0.9


@dataclass(frozen=True, slots=True)
class Request:
    tenant: str
    tokens: int
    priority: Priority = "standard"


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


def share(limit: int, weights: Mapping[str, float], active: Iterable[str]) -> dict[str, int]:
    """Each active tenant's share of ``limit`` in proportion to its weight (1 if unlisted).

    Shares are whole tokens, each within one token of its exact proportion, and sum to
    ``limit`` exactly (largest remainder; ties go to the tenant whose name sorts first).
    """
    tenants = sorted(set(active))
    if not tenants:
        return {}
    exact = {t: Fraction(_weight(weights, t)) for t in tenants}
    total = sum(exact.values())
    exact = {t: limit * w / total for t, w in exact.items()}
    shares = {t: int(x) for t, x in exact.items()}
    spare = limit - sum(shares.values())
    for t in sorted(tenants, key=lambda t: (shares[t] - exact[t], t))[:spare]:
        shares[t] += 1
    return shares


def decide(
    request: Request,
    *,
    limit: int,
    reserved: int,
    by_tenant: Mapping[str, int],
    waiting: Collection[str] = (),
    weights: Mapping[str, float] | None = None,
    pressure_threshold: float = PRESSURE_THRESHOLD,
) -> Decision:
    """Admit, queue or refuse ``request`` (the rules are in the module docstring)."""
    if not 0 < pressure_threshold <= 1:
        raise ValueError(f"pressure_threshold must be in (0, 1], not {pressure_threshold}")
    after = reserved + request.tokens
    if after > limit * pressure_threshold:
        if request.priority == "sheddable":
            return "reject"
        if request.priority == "standard":
            return "wait"
    if after > limit:
        return "wait"
    if not any(t != request.tenant for t in waiting):
        return "admit"
    active = {t for t, held in by_tenant.items() if held > 0} | set(waiting) | {request.tenant}
    fair = share(limit, weights or {}, active)[request.tenant]
    return "admit" if by_tenant.get(request.tenant, 0) + request.tokens <= fair else "wait"


def _weight(weights: Mapping[str, float], tenant: str) -> float:
    weight = weights.get(tenant, 1.0)
    if not 0 < weight < float("inf"):
        raise ValueError(f"a tenant's weight must be positive and finite, not {weight}")
    return weight
