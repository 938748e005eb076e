"""Which engine first: a cached prefix weighed against load (sans-I/O).

The rule, bounded-load prefix affinity (after consistent hashing with bounded loads, Mirrokni,
Thorup and Zadimoghaddam 2018): an engine is *eligible* for a request's affinity while its
requests in flight, counting this one, stay within ``(1 + slack)`` times the mean over the
engines serving the model, rounded up, plus one. The one is for replicas: each counts only its
own requests in flight, and with a few per engine the rounding alone would make every replica
spill sessions the others keep (measured in ``bench/routing.py``: two replicas then lost a
quarter of the cache hits). Eligible engines come first, the one whose cache holds most of the
prompt (``affinity``: cached tokens, or a session's rendezvous weight) first among them, then
the fewest in flight, then the session's own engines (``ties``); the others follow by load.
So a conversation returns to the engine holding its context until that engine carries more
than its share, and then spills to the next best; a hot prefix shared by every session (a
common system prompt) never piles onto one engine. Nothing is refused here: the order is a
preference that KV admission and fair share still judge, and the request runs wherever they
admit it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

SLACK = 0.25


def bound(loads: Sequence[int], slack: float = SLACK) -> int:
    """The most requests in flight (this one counted) an engine may have and stay eligible."""
    return math.ceil((sum(loads) + 1) / len(loads) * (1 + slack)) + 1


def rank(loads: Sequence[int], affinity: Sequence[float], slack: float = SLACK,
         ties: Sequence[float] | None = None) -> list[int]:  # fmt: skip
    """Indices of the engines, best first (``loads``: requests in flight; ``affinity``: higher
    is better, 0 for none). ``ties``: what orders eligible engines of equal affinity before
    their loads (a session's rendezvous weights: every replica then spills a session to the
    same next engine, whose cache builds up there, whatever each replica's own load view)."""
    most = bound(loads, slack)

    def order(i: int) -> tuple[bool, float, int, float]:
        eligible = loads[i] + 1 <= most
        if not eligible:
            return (True, 0.0, loads[i], 0.0)
        return (False, -affinity[i], loads[i], -ties[i] if ties is not None else 0.0)

    return sorted(range(len(loads)), key=order)


def rendezvous(session: str, engines: Sequence[str]) -> list[float]:
    """Each engine's highest-random-weight for a session: the same engines rank a session the
    same way in every replica, and removing one engine moves only its own sessions."""
    weights = []
    for engine in engines:
        digest = hashlib.blake2b(f"{session}\0{engine}".encode(), digest_size=8).digest()
        weights.append(1.0 + int.from_bytes(digest, "big") / 2**64)  # > 0: an affinity
    return weights
