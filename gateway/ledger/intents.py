"""The gateway's side of write-ahead intents (``audit.intents``): the running exchanges'
progress, the replica's heartbeat and the sweep.

``Running`` holds, by intent id, how to read each running exchange's progress; the ledger
sink adds an exchange when its intent is queued and removes it once its record is handed to
the ledger. ``keep_forever`` ticks every ``beat_s`` and does at each tick only what is due
(``Cadence``): the heartbeat, unless the ledger writer's commits carried one within the tick
(under load they do: a beat rides every commit of intents, at most once a second); every
running exchange's progress whose figures changed, every ``stale_s / 4``; and the sweep, every
``stale_s / 12``, which recovers the intents of replicas that stopped beating ``stale_s`` ago
(``Ledger.recover_lost``): every replica sweeps, a claim makes sure one of them writes each
record. ``stale_s`` is ``BACKGROUND_STALE_S``, the liveness background responses go by: a
replica presumed dead is presumed dead for both. So a dead replica's exchanges are recorded
within ``stale_s × 13/12`` of its death, with the tokens it had reported at most ``stale_s / 4``
before it; at 30 s, the cadence costs about 1 ms of CPU a second, where beating, reporting and
sweeping every second cost 3.3 ms (``bench/RESULTS.md``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from audit.intents import Progress
from audit.ledger import Ledger

log = logging.getLogger("thinkgate.ledger")

ProgressOf = Callable[[], Progress]


class Running:
    """The running exchanges by intent id, and those that ended within ``grace_s`` (in
    ``AUDIT_MODE=async`` an ended exchange's record may still be queued, its intent still in
    the database: the sweep must not take it for one whose record was refused)."""

    def __init__(self, grace_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._live: dict[str, ProgressOf] = {}
        self._told: dict[str, Progress] = {}
        self._ended: set[str] = set()
        self._ending: deque[tuple[float, str]] = deque()  # ``_ended`` oldest first
        self._grace_s, self._clock = grace_s, clock

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, intent_id: object) -> bool:
        return intent_id in self._live or intent_id in self._ended

    def add(self, intent_id: str, progress: ProgressOf) -> None:
        self._live[intent_id] = progress

    def discard(self, intent_id: str) -> None:
        """The exchange ended and its record was handed to the ledger."""
        self._live.pop(intent_id, None)
        self._told.pop(intent_id, None)
        now = self._clock()
        self._ended.add(intent_id)
        self._ending.append((now, intent_id))
        # forget those past the grace: O(1) per end (a scan of every ended exchange here
        # cost 1.8 ms per request at 1,200 requests a second, bench/RESULTS.md)
        while self._ending and now - self._ending[0][0] >= self._grace_s:
            self._ended.discard(self._ending.popleft()[1])

    def changed(self) -> dict[str, Progress]:
        """The progress of every running exchange whose figures moved since the last call
        (the time of the report aside)."""
        moved = {}
        for intent_id, read in list(self._live.items()):
            now = read()
            before = self._told.get(intent_id)
            if before is None or _figures(before) != _figures(now):
                moved[intent_id] = now
        self._told.update(moved)
        return moved

    def untold(self, progress: dict[str, Progress]) -> None:
        """Those reports did not reach the database: the next ``changed`` repeats them."""
        for intent_id in progress:
            self._told.pop(intent_id, None)


def _figures(p: Progress) -> tuple[object, ...]:
    return (p.upstream, p.first_token_at, p.prompt_tokens, p.completion_tokens,
            p.reasoning_tokens)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Due:
    """What one tick does."""

    beat: bool = True
    report: bool = True  # the running exchanges' progress
    sweep: bool = True


class Cadence:
    """Which of the beat, the progress report and the sweep are due at a tick (sans-I/O)."""

    def __init__(self, stale_s: float, beat_s: float) -> None:
        self.beat_s = beat_s
        self._report_every = max(1, round(stale_s / 4 / beat_s))
        self._sweep_every = max(1, round(stale_s / 12 / beat_s))
        self._tick = 0

    def next(self, since_beat_s: float) -> Due:
        """The next tick's work; ``since_beat_s``: how long ago a beat of this replica's last
        reached the database (the writer's commits carry one)."""
        tick, self._tick = self._tick, self._tick + 1
        report = tick % self._report_every == 0
        return Due(report or since_beat_s >= self.beat_s, report, tick % self._sweep_every == 0)


async def keep_forever(ledger: Ledger, running: Running, stale_s: float, beat_s: float,
                       on_lost: Callable[[int], object] | None = None) -> None:  # fmt: skip
    """Tick every ``beat_s`` until cancelled, doing what ``Cadence`` says is due; a failed
    round is tried again at the next (a database away for a while, say), logged once per
    outage. ``on_lost``: told how many records each round appended (a metric)."""
    failing, cadence = [False], Cadence(stale_s, beat_s)
    while True:
        due = cadence.next(time.time() - ledger.beaten_at)
        lost = await keep_once(ledger, running, stale_s, failing, due)
        if lost and on_lost is not None:
            on_lost(len(lost))
        await asyncio.sleep(beat_s)


async def keep_once(ledger: Ledger, running: Running, stale_s: float,
                    failing: list[bool] | None = None, due: Due = Due()) -> list[str]:  # fmt: skip
    """One round: the beat (with the progress that moved), then the sweep, each if ``due``;
    the request ids recorded as lost. ``failing``: whether the last round failed (its first
    failure is logged, not every one after)."""
    failing = [False] if failing is None else failing
    moved = running.changed() if due.report else {}
    try:
        if due.beat or moved:
            await ledger.beat(moved)
        lost = await ledger.recover_lost(stale_s, running=running) if due.sweep else []
    except Exception as exc:
        running.untold(moved)  # told again at the next beat
        if not failing[0]:
            log.warning("ledger heartbeat or sweep failed (%s); retried every beat",
                        type(exc).__name__)  # fmt: skip
        failing[0] = True
        return []
    if failing[0]:
        log.info("ledger heartbeat back")
    failing[0] = False
    for request_id in lost:
        log.warning("request %s: its replica stopped before its record; recorded as "
                    "replica_lost", request_id)  # fmt: skip
    return lost
