"""The SIEM export's loop: ledger rows in, OCSF events out to every sink, at least once.

A round (``SiemExporter.round``), on a task of its own, never on the request path:

1. **Lease**: claim or renew it (``gateway.side.siem.cursor``); a replica that does not hold it
   exports nothing and looks again next interval.
2. **Bound**: read the latest checkpoint (``gateway.side.siem.source``); when the backlog, its size
   minus the cursor, exceeds ``SIEM_MAX_BACKLOG``, the cursor jumps to keep only the newest
   ``SIEM_MAX_BACKLOG`` records, the skipped ones are counted
   (``thinkgate_siem_dropped_events_total``, alerted on) and logged with their index range.
   The ledger still holds them: ``thinkgate ledger export`` or the auditor API can fetch them.
3. **Batch**: up to ``SIEM_BATCH`` rows from the cursor, each mapped to its OCSF event.
4. **Deliver** to each sink; **advance** the cursor to the batch's end only once every sink
   has accepted it (``gateway.side.siem.sinks`` says what accepted means per sink).

At least once: the cursor is in the database and moves only after delivery, so a restart, a
crash or a takeover by another replica resends at most the batch that was in flight (up to
``SIEM_BATCH`` duplicates per sink; ``metadata.uid`` tells them apart), and loses nothing. A
sink that is down holds the cursor back (one cursor for all sinks): the round is retried after
a backoff that doubles from ``SIEM_INTERVAL_S`` up to 64 intervals (at most a third of the
lease, which each round renews). Within a process a sink that already accepted the batch in
flight is not sent it again while another sink is being retried.

Pacing: after a full batch with more behind it, the next round starts at once; otherwise
after ``SIEM_INTERVAL_S``. Outages (a sink, the database) are logged when they begin and end,
not once per retry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from audit.sqlasync import AsyncEngine
from gateway.db import is_outage
from gateway.sections import SiemSettings
from gateway.side.siem import ocsf, source
from gateway.side.siem.cursor import ExportCursor
from gateway.side.siem.ocsf import OcsfEvent
from gateway.side.siem.sinks import SiemSink, SinkDown, open_sinks
from gateway.telemetry.metrics import Metrics

log = logging.getLogger("thinkgate.siem")

LEASE_S = 60.0  # well above a round whose three sinks all time out (3 × 10 s)
BACKOFF_INTERVALS = 64


@dataclass(frozen=True, slots=True)
class ExportPlan:
    """One round's work: skip ``[cursor, start)`` (the bound), export ``[start, stop)``."""

    start: int
    stop: int
    skipped: int


def plan(cursor: int, head: int, max_backlog: int, batch: int) -> ExportPlan:
    """What a round does with the cursor at ``cursor`` and the checkpoint at size ``head``."""
    start = max(cursor, head - max_backlog)
    return ExportPlan(start, max(start, min(head, start + batch)), start - cursor)


def backoff(interval_s: float, failures: int, lease_s: float) -> float:
    """The pause after ``failures`` failed rounds in a row (0: the interval)."""
    cap = min(BACKOFF_INTERVALS * interval_s, lease_s / 3)
    return min(interval_s * (1 << min(failures, 32)), max(cap, interval_s))


class SiemExporter:
    def __init__(self, engine: AsyncEngine, sinks: Sequence[SiemSink], cursor: ExportCursor,
                 metrics: Metrics, *, batch: int, max_backlog: int,
                 interval_s: float) -> None:  # fmt: skip
        self._engine = engine
        self._sinks = tuple(sinks)
        self._cursor = cursor
        self._metrics = metrics
        self._batch, self._max_backlog, self._interval = batch, max_backlog, interval_s
        self._delivered: dict[str, int] = {}  # per sink: the end of the last batch it took
        self._down: set[str] = set()  # sinks (and "database") in an outage, as logged
        self._holding = False
        self._failures = 0
        metrics.siem_sinks(sink.name for sink in self._sinks)

    async def aclose(self) -> None:
        """Close the sinks (after ``run`` was cancelled)."""
        for sink in self._sinks:
            await sink.aclose()

    async def run(self) -> None:
        """Rounds until cancelled; then the lease is released for the next exporter."""
        try:
            while True:
                pause = await self._step()
                await asyncio.sleep(pause)
        finally:
            if self._holding:
                await asyncio.shield(self._release())

    async def _step(self) -> float:
        """One round and the pause before the next."""
        try:
            more = await self.round()
        except SinkDown:
            self._failures += 1
            return backoff(self._interval, self._failures, self._cursor.lease_s)
        except Exception as exc:  # the database, or a bug: never the end of the loop
            self._failures += 1
            self._database_failed(exc)
            return backoff(self._interval, self._failures, self._cursor.lease_s)
        self._failures = 0
        self._outage_over("database")
        return 0.0 if more else self._interval

    async def round(self) -> bool:
        """One round (module docstring); whether more records wait right behind this batch.
        ``SinkDown`` when a sink did not accept the batch (the cursor stays)."""
        cursor = await self._cursor.claim()
        self._hold(cursor)
        if cursor is None:
            return False
        async with self._engine.connect() as conn:
            head = await source.tree_head(conn)
        if head is None:
            return False
        work = plan(cursor, head.size, self._max_backlog, self._batch)
        if work.skipped:
            if not await self._cursor.advance(cursor, work.start):
                return False  # another replica took over
            self._dropped(cursor, work.start, head.size)
            cursor = work.start
        self._metrics.siem_backlog.set(head.size - cursor)
        if work.stop == work.start:
            return False
        async with self._engine.connect() as conn:
            rows = await source.ledger_rows(conn, work.start, work.stop)
        stop = _contiguous_end(work.start, [row.index for row in rows])
        if stop == work.start:
            return False
        await self._deliver([ocsf.event(row, head) for row in rows if row.index < stop], stop)
        if not await self._cursor.advance(cursor, stop):
            return False
        self._metrics.siem_backlog.set(head.size - stop)
        return stop < head.size

    def _hold(self, cursor: int | None) -> None:
        """Note (and log) whether this replica holds the lease now."""
        holding = cursor is not None
        if holding != self._holding:
            if holding:
                log.info("SIEM export: %s holds the lease, exporting from index %s",
                         self._cursor.holder, cursor)  # fmt: skip
            else:
                log.info("SIEM export: another replica holds the lease")
                self._delivered.clear()
            self._holding = holding
        if not holding:
            self._metrics.siem_backlog.set(0)  # the holder reports it

    async def _deliver(self, events: list[OcsfEvent], stop: int) -> None:
        failed = None
        start = events[0].index
        for sink in self._sinks:
            since = max(self._delivered.get(sink.name, 0), start)
            todo = [event for event in events if event.index >= since]
            if not todo:
                continue
            try:
                await sink.send(todo)
            except SinkDown as exc:
                self._metrics.siem_events.labels(sink.name, "failed").inc(len(todo))
                self._outage(sink.name, str(exc))
                failed = exc
                continue
            self._metrics.siem_events.labels(sink.name, "sent").inc(len(todo))
            self._delivered[sink.name] = stop
            self._outage_over(sink.name)
        if failed is not None:
            raise failed

    def _dropped(self, cursor: int, start: int, head: int) -> None:
        self._metrics.siem_dropped.inc(start - cursor)
        log.warning("SIEM export: %d records behind, more than SIEM_MAX_BACKLOG=%d: records "
                    "%d to %d are skipped (they stay in the ledger)", head - cursor,
                    self._max_backlog, cursor, start - 1)  # fmt: skip

    def _database_failed(self, exc: Exception) -> None:
        if is_outage(exc):
            self._outage("database", type(exc).__name__)
        else:
            log.exception("SIEM export round failed")

    def _outage(self, what: str, reason: str) -> None:
        if what not in self._down:
            self._down.add(what)
            log.warning("SIEM export: %s is down (%s); retrying with backoff", what, reason)

    def _outage_over(self, what: str) -> None:
        if what in self._down:
            self._down.discard(what)
            log.warning("SIEM export: %s takes events again", what)

    async def _release(self) -> None:
        try:
            await self._cursor.release()
        except Exception as exc:  # the lease then expires by itself
            log.warning("SIEM export: could not release the lease (%s)", type(exc).__name__)


def _contiguous_end(start: int, indexes: list[int]) -> int:
    """One past the last index of the unbroken run ``start, start + 1, ...`` in ``indexes``
    (a gap would be a row not visible yet: it is not skipped, the next round reads it)."""
    end = start
    for index in indexes:
        if index != end:
            break
        end += 1
    return end


def create_exporter(settings: SiemSettings, engine: AsyncEngine, metrics: Metrics
                    ) -> SiemExporter | None:  # fmt: skip
    """The export the settings configure, ``None`` without a sink. Its lease holder id names
    the host and process (readable in the database) and is unique per start."""
    hostname, pid = socket.gethostname(), str(os.getpid())
    sinks = open_sinks(settings, hostname, pid)
    if not sinks:
        return None
    cursor = ExportCursor(engine, f"{hostname[:96]}/{pid}/{secrets.token_hex(4)}", LEASE_S)
    return SiemExporter(engine, sinks, cursor, metrics, batch=settings.siem_batch,
                        max_backlog=settings.siem_max_backlog,
                        interval_s=settings.siem_interval_s)  # fmt: skip
