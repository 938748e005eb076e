"""Per-minute rate limits as GCRA, the generic cell rate algorithm (sans-I/O).

GCRA is a token bucket kept as one number, the *theoretical arrival time* (TAT): the instant at
which the bucket would be full again if nothing more were taken. A limit of ``limit`` per minute
has the emission interval ``T = 60 / limit`` seconds (the time one unit takes to refill) and the
tolerance ``tau = 60`` seconds, so the burst is the full limit: OpenAI's semantics, where a key
with 60 RPM may send 60 requests at once and then one per second.

Rules (``now`` and ``tat`` in seconds on one clock the caller hands in; this module reads none):

- A TAT in the past means a full bucket: ``base = max(tat, now)``.
- What the bucket holds now, in units: ``available = limit - (base - now) / T``.
- Taking ``cost`` units moves the TAT to ``base + cost * T``; it is allowed iff that stays within
  ``now + tau``, i.e. iff ``cost <= available``. A denied request leaves the TAT unchanged.
- ``cost > limit`` can never fit: denied with ``exceeds_limit`` set, so the caller can say the
  request is too large for the limit instead of asking the client to retry in vain.
- ``limit == 0`` means unlimited: always allowed, nothing stored, ``remaining`` is the sentinel
  ``UNLIMITED``; callers send no rate-limit headers for such a limit.
- A refund (settlement after the real usage is known) moves the TAT back by ``amount * T``, but
  never before ``now``: a bucket cannot hold more than its limit. The TAT never moves forward.

Floating point: the comparisons allow ``SLACK`` (a thousandth of one unit), so a burst of exactly
``limit`` units is allowed although ``limit * (60 / limit)`` may round to a hair above 60. The
slack does not accumulate: after any allowed decision, ``tat <= now + tau + SLACK * T``, so the
excess is at most a thousandth of a unit at any time.

The Redis backend runs the same rules in Lua (``ratelimit.limits``); both must evaluate the same
expressions in the same order, so that the two give bit-identical results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

WINDOW_S: Final = 60.0
"""The limits are per minute; the tolerance ``tau`` is the whole window (burst = limit)."""

SLACK: Final = 1e-3
"""How far (in units) a cost may exceed what is available and still fit: float rounding only."""

UNLIMITED: Final = 2**63 - 1
"""``remaining`` of an unlimited bucket (``limit == 0``)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer of one bucket to one request for ``cost`` units."""

    allowed: bool
    limit: int  # per minute; 0 = unlimited
    remaining: int  # what could still be taken now (after this request if allowed)
    reset_s: float  # seconds until the bucket is full again
    retry_after_s: float  # 0 when allowed; else seconds until `cost` would fit
    exceeds_limit: bool = False  # cost > limit: it will never fit (retry_after_s is then 60)


def decide(tat: float, now: float, limit: int, cost: int) -> tuple[float, Decision]:
    """Ask the bucket at ``tat`` for ``cost`` units at ``now``; return the new TAT (unchanged if
    denied) and the decision."""
    _check(limit, cost)
    if limit == 0:
        return tat, Decision(True, 0, UNLIMITED, 0.0, 0.0)
    interval = WINDOW_S / limit
    base = max(tat, now)
    available = limit - (base - now) / interval
    if cost > limit:
        return tat, _denied(base, now, limit, available, WINDOW_S, exceeds_limit=True)
    new_tat = base + cost * interval
    if cost > available + SLACK:
        return tat, _denied(base, now, limit, available, new_tat - now - WINDOW_S)
    remaining = _whole(available - cost)
    return new_tat, Decision(True, limit, remaining, new_tat - now, 0.0)


def refund(tat: float, now: float, limit: int, amount: int) -> float:
    """Give ``amount`` units back to the bucket at ``tat``; return the new TAT."""
    _check(limit, amount)
    if limit == 0:
        return tat
    return min(tat, max(tat - amount * (WINDOW_S / limit), now))


def _denied(
    base: float,
    now: float,
    limit: int,
    available: float,
    retry_after_s: float,
    *,
    exceeds_limit: bool = False,
) -> Decision:
    return Decision(False, limit, _whole(available), base - now, retry_after_s, exceeds_limit)


def _whole(units: float) -> int:
    """Whole units that can be taken, given ``units`` available (the slack applies here too,
    so ``remaining >= cost`` always means that ``cost`` would be allowed)."""
    return max(0, math.floor(units + SLACK))


def _check(limit: int, amount: int) -> None:
    if limit < 0:
        raise ValueError(f"a limit cannot be negative: {limit}")
    if amount < 0:
        raise ValueError(f"an amount cannot be negative: {amount}")
