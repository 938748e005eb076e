"""The admitted KV limit of one engine, adapted to its live metrics (sans-I/O, TCP-like AIMD).

``AdmissionController`` holds the limit as a fraction of the engine's KV capacity, starting at
``target_utilization``. Rules (back off fast, recover slowly, as TCP's congestion window does):

- **Unhealthy** is any of: KV usage above ``usage_high``; more than ``waiting_high`` requests
  queued in the engine; the preemption counter rose since the previous snapshot (vLLM preempts
  when the cache runs out, which costs recomputation); a failed scrape (``None``); metrics
  gone stale (see ``tick``). A figure the engine does not export gives no signal either way.
- Each unhealthy verdict multiplies the limit by ``decrease``; the limit never falls below
  ``capacity × min_fraction``, so traffic keeps flowing and keeps producing signal.
- Each healthy snapshot adds ``capacity × increase_fraction``, up to ``capacity ×
  target_utilization``, never above.
- A preemption counter lower than before is an engine restart (the counter was reset), not a
  rise: it becomes the new baseline.
- ``observe`` takes one verdict per scrape. ``tick`` (every scrape interval) covers silence:
  if no scrape result arrived since the previous tick and the last good snapshot is older than
  ``stale_after_s`` (or none ever arrived within ``stale_after_s`` of the first tick), the
  metrics are stale and count as one unhealthy verdict. A failed scrape is reported by
  ``observe(None)`` and is therefore not counted twice.
- Capacity is discovered from a snapshot's ``kv_capacity_tokens`` unless fixed by
  configuration; the limit keeps its fraction of the new capacity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ratelimit.engine_metrics import EngineSnapshot

_EPSILON = 1e-9  # keeps 1000 × 0.85 from flooring to 849 through float rounding


@dataclass(frozen=True, slots=True)
class Tuning:
    target_utilization: float = 0.85
    usage_high: float = 0.85
    waiting_high: float = 5
    decrease: float = 0.7
    increase_fraction: float = 0.05
    min_fraction: float = 0.1
    stale_after_s: float = 3.0  # three scrape intervals of 1 s

    def __post_init__(self) -> None:
        if not 0 < self.min_fraction <= self.target_utilization <= 1:
            raise ValueError("need 0 < min_fraction <= target_utilization <= 1")
        if not 0 < self.decrease < 1:
            raise ValueError("decrease must be in (0, 1)")
        if not self.increase_fraction > 0 or not self.stale_after_s > 0:
            raise ValueError("increase_fraction and stale_after_s must be positive")


class AdmissionController:
    def __init__(
        self, capacity_tokens: int, tuning: Tuning = Tuning(), *, capacity_fixed: bool = False
    ) -> None:
        if capacity_tokens < 1:
            raise ValueError(f"capacity must be at least one token, not {capacity_tokens}")
        self._tuning = tuning
        self._capacity = capacity_tokens
        self._capacity_fixed = capacity_fixed
        self._fraction = tuning.target_utilization
        self._healthy = True
        self._preemptions: float | None = None
        self._last_good_at: float | None = None
        self._observed_since_tick = False

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def capacity_fixed(self) -> bool:
        return self._capacity_fixed

    @property
    def healthy(self) -> bool:
        """The latest verdict (``True`` until the first one)."""
        return self._healthy

    @property
    def limit(self) -> int:
        """Admitted tokens, in ``[capacity × min_fraction, capacity × target_utilization]``."""
        low = math.ceil(self._capacity * self._tuning.min_fraction - _EPSILON)
        high = max(low, math.floor(self._capacity * self._tuning.target_utilization + _EPSILON))
        return min(high, max(low, math.floor(self._capacity * self._fraction + _EPSILON)))

    def observe(self, snapshot: EngineSnapshot | None, at: float) -> int:
        """Adjust to one scrape result taken at ``at`` (``None``: the scrape failed)."""
        self._observed_since_tick = True
        if snapshot is None:
            return self._verdict(healthy=False)
        self._last_good_at = at
        if snapshot.kv_capacity_tokens and not self._capacity_fixed:
            self._capacity = snapshot.kv_capacity_tokens
        return self._verdict(healthy=self._judge(snapshot))

    def tick(self, now: float) -> int:
        """Called every scrape interval: stale metrics with no scrape result since the previous
        tick count as unhealthy."""
        observed, self._observed_since_tick = self._observed_since_tick, False
        if self._last_good_at is None:
            self._last_good_at = now  # staleness counts from the first tick
        if observed or now - self._last_good_at <= self._tuning.stale_after_s:
            return self.limit
        return self._verdict(healthy=False)

    def _judge(self, snapshot: EngineSnapshot) -> bool:
        tuning, previous = self._tuning, self._preemptions
        if snapshot.preemptions_total is not None:
            self._preemptions = snapshot.preemptions_total
        preempted = (
            previous is not None
            and snapshot.preemptions_total is not None
            and snapshot.preemptions_total > previous  # lower: the engine restarted
        )
        crowded = snapshot.requests_waiting is not None and (
            snapshot.requests_waiting > tuning.waiting_high
        )
        full = snapshot.kv_usage is not None and snapshot.kv_usage > tuning.usage_high
        return not (preempted or crowded or full)

    def _verdict(self, *, healthy: bool) -> int:
        tuning = self._tuning
        self._healthy = healthy
        if healthy:
            step = self._fraction + tuning.increase_fraction
            self._fraction = min(tuning.target_utilization, step)
        else:
            self._fraction = max(tuning.min_fraction, self._fraction * tuning.decrease)
        return self.limit
