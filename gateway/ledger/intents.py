"""The gateway's side of write-ahead intents (``audit.intents``): the running exchanges'
progress, the replica's heartbeat and the sweep.

``Running`` holds, by intent id, how to read each running exchange's progress; the ledger
sink adds an exchange when its intent is queued and removes it once its record is handed to
the ledger. ``keep_forever`` beats every ``beat_s`` (the heartbeat and every running
exchange's progress whose figures changed, one transaction) and, after each beat, recovers the
intents of replicas that stopped beating ``stale_s`` ago (``Ledger.recover_lost``): every
replica does, a claim makes sure one of them writes each record. ``stale_s`` is
``BACKGROUND_STALE_S``, the liveness background responses go by: a replica presumed dead is
presumed dead for both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from audit.intents import Progress
from audit.ledger import Ledger

log = logging.getLogger("thinkgate.ledger")

ProgressOf = Callable[[], Progress]


class Running:
    def __init__(self) -> None:
        self._live: dict[str, ProgressOf] = {}
        self._told: dict[str, Progress] = {}

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, intent_id: object) -> bool:
        return intent_id in self._live

    def add(self, intent_id: str, progress: ProgressOf) -> None:
        self._live[intent_id] = progress

    def discard(self, intent_id: str) -> None:
        self._live.pop(intent_id, None)
        self._told.pop(intent_id, None)

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


async def keep_forever(ledger: Ledger, running: Running, stale_s: float, beat_s: float) -> None:
    """Beat, then recover lost intents, every ``beat_s``, until cancelled; a failed round is
    logged and tried again at the next (a database away for a while, say)."""
    while True:
        await keep_once(ledger, running, stale_s)
        await asyncio.sleep(beat_s)


async def keep_once(ledger: Ledger, running: Running, stale_s: float) -> list[str]:
    """One round: the beat, then the sweep; the request ids recorded as lost."""
    moved = running.changed()
    try:
        await ledger.beat(moved)
    except Exception as exc:
        running.untold(moved)  # told again at the next beat
        log.warning("ledger heartbeat failed (%s)", type(exc).__name__)
        return []
    try:
        lost = await ledger.recover_lost(stale_s, running=running)
    except Exception as exc:
        log.warning("recovering lost exchanges failed (%s)", type(exc).__name__)
        return []
    for request_id in lost:
        log.warning("request %s: its replica stopped before its record; recorded as "
                    "replica_lost", request_id)  # fmt: skip
    return lost
