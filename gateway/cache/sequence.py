"""One engine's event stream in order: what to do with each message's sequence number
(sans-I/O; ``gateway.upstream.kvevents`` does the I/O).

vLLM numbers its batches from 0 at the engine's start and keeps the last ``buffer_steps`` for
replay. A subscriber may join late, miss messages (the PUB socket's high-water mark) or see the
engine restart:

- the first message, or one right after the last: ``apply`` (a first message past 0 asks for
  ``replay`` from 0 first, to learn the blocks stored before the subscription);
- one past a gap: ``replay`` from the first missing number, then apply it;
- one at or before the last applied, within what the last replay applied: ``old``, skipped
  (the SUB socket's copies of what the replay brought; never 0, which only starts a stream);
- any other going back (the engine started again and counts from 0): ``restart``: drop the
  engine's index and apply it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Step = Literal["apply", "replay", "old", "restart"]


@dataclass(slots=True)
class EventOrder:
    last: int | None = None  # the last sequence number applied
    replayed: tuple[int, int] = (0, -1)  # the numbers the last replay applied, first and last

    def step(self, sequence: int) -> Step:
        last = self.last
        if last is None:
            return "replay" if sequence > 0 else "apply"
        if sequence == last + 1:
            return "apply"
        if sequence > last + 1:
            return "replay"
        low, high = self.replayed
        if sequence > 0 and low <= sequence <= high:
            return "old"
        return "restart"

    def applied(self, sequence: int, *, replay: bool = False) -> None:
        if replay:
            low, high = self.replayed
            self.replayed = (sequence, sequence) if sequence != high + 1 else (low, sequence)
        self.last = sequence

    def missing_from(self) -> int:
        """Where a replay starts."""
        return 0 if self.last is None else self.last + 1

    def reset(self) -> None:
        self.last, self.replayed = None, (0, -1)
