"""The ledger writer: group commit, the spool while the database is away, and replay.

One task owns all writing. Requests put sealed records on a bounded queue; the task takes
whatever has accumulated (up to ``max_batch``) and commits it as one sequencer transaction, so
under load many requests share one commit ("group commit") and the cost per record falls as
concurrency rises.

Modes (``AUDIT_MODE``):

- ``strict``: ``submit`` returns once the record is durable, committed to the database or
  fsync'd to the spool; the gateway sends ``[DONE]`` only after that.
- ``async``: ``submit`` returns once the record is queued (it waits only while the queue is
  full). A crash loses at most the queued records, none of which was reported durable.

When a commit fails for a database reason, the batch goes to the spool (``audit.spool``), and
so does every later batch until a replay succeeds: replay is attempted at most once per
``retry_s``, also with no traffic, commits the spooled records in their order (skipping those
already stored), then clears the spool. New records never overtake spooled ones.

Checkpoints (``checkpoint_interval_s``, the gateway's ``CHECKPOINT_INTERVAL_MS``): 0 signs one per
commit; otherwise records are committed (durable) as before and one checkpoint is signed over
everything committed, at most one interval after the first commit it covers, at start (what a
crash left uncovered) and at stop. A record's inclusion proof against a checkpoint is there
once the next checkpoint is out.

When the spool cannot take a batch either (disk full, read-only), or anything else fails (a
spool damaged under us), the batch's submitters get ``WriterUnavailable`` and ``accepting()``
turns false until a commit or replay succeeds again. The writer task itself never dies of it:
a dead writer would leave strict-mode requests waiting forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from audit.datakeys import DataKeyRow, DataKeys
from audit.errors import AuditError
from audit.intents import Beat, Intent
from audit.record import Sealed
from audit.sequencer import Sequencer
from audit.spool import Spool
from audit.store import DB_ERRORS

log = logging.getLogger("thinkgate.ledger")

Mode = Literal["strict", "async"]

# spool line types: a data key, a record, the intent the record before it replaces, an intent
_KEY, _RECORD, _DONE, _INTENT = b"K", b"R", b"D", b"I"
BEAT_REUSE_S = 1.0  # a commit of intents beats again only when the last beat is this old


class WriterUnavailable(AuditError):
    """Neither the database nor the spool could take a record."""


@dataclass(slots=True)
class WriterStats:
    committed: int = 0
    spooled: int = 0
    replayed: int = 0
    failed: int = 0
    batches: int = 0
    last_commit_seconds: float = 0.0
    last_checkpoint_at: float | None = None


@dataclass(frozen=True, slots=True)
class WriterEvent:
    """What changed, for an observer (the gateway's metrics): records committed by this event
    and how long the commit took (``None``: no commit, e.g. the spool changed), and the state
    after it."""

    committed: int
    commit_seconds: float | None
    tree_size: int
    spool_pending: int
    last_checkpoint_at: float | None


_Item = tuple[Sealed | Intent, "asyncio.Future[None] | None"]
_STOP = object()
_FLUSH = object()  # someone waits for the riding intents: commit now


class LedgerWriter:
    def __init__(
        self,
        sequencer: Sequencer,
        spool: Spool,
        keys: DataKeys,
        *,
        mode: Mode = "strict",
        max_batch: int = 1024,
        queue_limit: int = 10_000,
        retry_s: float = 1.0,
        checkpoint_interval_s: float = 0.0,
        replica: str = "",
    ) -> None:
        self._sequencer = sequencer
        # the replica's heartbeat rides on every commit that writes intents (``audit.intents``)
        self._replica, self._started_at = replica, time.time()
        self._beaten_at = -float("inf")
        self._riding: list[_Item] = []  # intents waiting for the next commit (``ride``)
        self._flush_asked = False  # a commit for them is asked for (``_FLUSH`` is queued)
        # 0: the sequencer signs each commit; else one checkpoint per interval (``_publish``)
        self._interval = checkpoint_interval_s
        self._checkpoint_due: float | None = 0.0 if checkpoint_interval_s else None
        self._spool = spool
        self._keys = keys
        self._mode = mode
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Item | object] = asyncio.Queue(queue_limit)
        self._retry_s = retry_s
        self._last_attempt = -float("inf")
        self._spooled_keys: set[str] = set()
        self._unavailable = False
        self._task: asyncio.Task[None] | None = None
        self.stats = WriterStats()
        # Told of every commit and spool change; must not raise or block (metrics).
        self.listener: Callable[[WriterEvent], None] | None = None

    @property
    def spool_pending(self) -> int:
        return len(self._spool)

    def accepting(self) -> bool:
        return not self._unavailable

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ledger-writer")

    async def aclose(self) -> None:
        """Persist everything queued, then stop."""
        if self._task is None:
            return
        await self._queue.put(_STOP)
        await self._task
        self._task = None
        await self._sequencer.aclose()
        self._spool.release()

    async def submit(self, item: Sealed | Intent) -> None:
        await (await self.enqueue(item))

    async def enqueue(
        self, item: Sealed | Intent, *, durable: bool = False
    ) -> asyncio.Future[None]:
        """Queue ``item`` (waiting only while the queue is full) and return what resolves
        once it is as safe as the mode says: durable (committed or spooled) in ``strict`` or
        with ``durable``, queued in ``async`` (resolved at once). A caller with other work
        first (the engine's first token) awaits it later."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._mode == "async" and not durable:
            await self._queue.put((item, None))
            done.set_result(None)
        else:
            await self._queue.put((item, done))
        return done

    def ride(self, intent: Intent) -> asyncio.Future[None]:
        """Put ``intent`` aboard the writer's next commit and ask for one at once: what
        resolves once it is as safe as the mode says. The exchange made it as its request
        went to the engine, so the commit runs while the engine works toward its first
        token, and the answer's first byte seldom waits for it. Intents made while a commit
        runs share the next one, with whatever records are queued by then (under load, a
        record's commit carries them). Committing only once the first byte waited, as the
        writer did before, spared some commits at medium load but cost a lone request a
        commit of its own between the engine's first bytes and the client's (0.36 ms,
        ``bench/RESULTS.md``)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._mode == "async":
            self._riding.append((intent, None))
            done.set_result(None)
        else:
            self._riding.append((intent, done))
        if not self._flush_asked:
            self._flush_asked = True
            self._flush()
        return done

    def hurry(self, done: asyncio.Future[None]) -> None:
        """``done`` is awaited now: commit the riding intents if it is still among them (the
        queue was full when it rode)."""
        if not done.done():
            self._flush()

    def _flush(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # full: a batch comes anyway
            self._queue.put_nowait(_FLUSH)

    def beat(self) -> Beat:
        return Beat(self._replica, time.time(), self._started_at)

    @property
    def beaten_at(self) -> float:
        return self._beaten_at

    def beaten(self, at: float) -> None:
        """A beat of this replica's reached the database at ``at`` (wall clock)."""
        self._beaten_at = max(self._beaten_at, at)

    def _beat_due(self) -> Beat | None:
        """A beat for a commit that inserts intents, unless one reached the database within
        ``BEAT_REUSE_S``: the replica's row is then there and fresh, which is all the sweep
        needs (an intent never waits in the database under an owner with no row)."""
        beat = self.beat()
        return beat if beat.at - self._beaten_at >= BEAT_REUSE_S else None

    async def _run(self) -> None:
        while True:
            batch, stop = await self._next_batch()
            try:
                if batch:
                    await self._persist(batch)
                elif self._spool_pending_or_down():
                    await self._recover()
            except Exception as exc:  # a damaged spool, a bug: refuse, never hang or die
                log.error("ledger writer failed (%s): records refused", type(exc).__name__)
                self._unavailable = True
                self.stats.failed += len(batch)
                _resolve(batch, WriterUnavailable("The audit ledger cannot store records."))
            if self._checkpoint_due is not None and (stop or self._checkpoint_due <= _now()):
                await self._publish()
            if stop:
                return

    async def _publish(self) -> None:
        """The interval mode's checkpoint over everything committed (at start too: records a
        crash left without one are covered now). A database that is away delays it to the
        next try (``retry_s``); nothing is lost, the records are committed."""
        try:
            await self._sequencer.publish()
        except DB_ERRORS as exc:
            log.warning("ledger checkpoint delayed: database unreachable (%s)",
                        type(exc).__name__)  # fmt: skip
            self._checkpoint_due = _now() + self._retry_s
            return
        except Exception as exc:  # never the writer's death
            log.error("ledger checkpoint failed (%s)", type(exc).__name__)
            self._checkpoint_due = _now() + self._retry_s
            return
        self._checkpoint_due = None  # until the next commit
        self.stats.last_checkpoint_at = time.time()
        self._tell(0, None)

    def _spool_pending_or_down(self) -> bool:
        return len(self._spool) > 0 or self._unavailable

    async def _next_batch(self) -> tuple[list[_Item], bool]:
        timeout = self._retry_s if self._spool_pending_or_down() else None
        if self._checkpoint_due is not None:
            until = max(0.0, self._checkpoint_due - _now())
            timeout = until if timeout is None else min(timeout, until)
        try:
            first = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return [], False
        items = [first]
        while len(items) < self._max_batch and not self._queue.empty():
            items.append(self._queue.get_nowait())
        stop = _STOP in items
        # the riding intents first: each was made before any record that replaces it
        riding, self._riding = self._riding, []
        self._flush_asked = False
        return riding + [i for i in items if i is not _STOP and i is not _FLUSH], stop  # type: ignore[misc]

    async def _persist(self, batch: list[_Item]) -> None:
        sealed = [s for s, _ in batch if isinstance(s, Sealed)]
        intents = [i for i, _ in batch if isinstance(i, Intent)]
        if len(self._spool) == 0 or await self._replay():
            try:
                started = time.perf_counter()
                beat = self._beat_due() if intents else None
                await self._sequencer.commit(sealed, intents=intents, beat=beat)
                if beat is not None:
                    self.beaten(beat.at)
            except DB_ERRORS as exc:
                log.warning("ledger database unreachable (%s); spooling", type(exc).__name__)
            else:
                self._committed(len(sealed), time.perf_counter() - started, bool(intents))
                _resolve(batch, None)
                return
        await self._to_spool(batch)

    def _committed(self, count: int, seconds: float, intents: bool = False) -> None:
        self.stats.committed += count
        self.stats.batches += 1
        self.stats.last_commit_seconds = seconds
        if not count:  # intents alone: no leaf, no checkpoint due
            self._unavailable = False
            self._tell(0, seconds)
            return
        if self._interval:  # the checkpoint that covers it comes within the interval
            if self._checkpoint_due is None:
                self._checkpoint_due = _now() + self._interval
        else:
            self.stats.last_checkpoint_at = time.time()
        self._unavailable = False
        self._tell(count, seconds)

    def _tell(self, committed: int, seconds: float | None) -> None:
        if self.listener is not None:
            self.listener(WriterEvent(committed, seconds, self._sequencer.size,
                                      len(self._spool), self.stats.last_checkpoint_at))  # fmt: skip

    async def _to_spool(self, batch: list[_Item]) -> None:
        keys = [k for k in self._keys.unsaved.values() if k.dek_id not in self._spooled_keys]
        payloads = [_KEY + k.encode() for k in keys]
        for item, _ in batch:
            payloads += _spool_lines(item)
        try:
            await asyncio.to_thread(self._spool.append, payloads)
        except OSError as exc:
            log.error("ledger spool failed (%s): records refused", type(exc).__name__)
            self._unavailable = True
            self.stats.failed += len(batch)
            _resolve(batch, WriterUnavailable("The audit ledger cannot store records."))
            return
        self._spooled_keys.update(k.dek_id for k in keys)
        self.stats.spooled += sum(isinstance(item, Sealed) for item, _ in batch)
        _resolve(batch, None)
        self._tell(0, None)

    async def _recover(self) -> None:
        if len(self._spool) > 0:
            await self._replay()
        elif await self._sequencer.ping():
            self._unavailable = False

    async def _replay(self) -> bool:
        """Commit the spool to the database, in order; ``False`` when it is still away (or the
        last attempt was less than ``retry_s`` ago)."""
        now = time.monotonic()
        if now - self._last_attempt < self._retry_s:
            return False
        self._last_attempt = now
        keys, records, intents = _parse_spool(await asyncio.to_thread(self._spool.read))
        for key in keys:
            self._keys.unsaved.setdefault(key.dek_id, key)
        try:
            await self._commit_in_chunks(records, intents)
        except DB_ERRORS:
            return False
        await asyncio.to_thread(self._spool.clear)
        self._spooled_keys.clear()
        self.stats.replayed += len(records)
        if self._interval and self._checkpoint_due is None:
            self._checkpoint_due = _now() + self._interval
        elif not self._interval:
            self.stats.last_checkpoint_at = time.time()
        log.info("ledger replayed %d spooled records", len(records))
        self._tell(len(records), None)
        return True

    async def _commit_in_chunks(self, records: Sequence[Sealed], intents: list[Intent]) -> None:
        """The spool's records in order. Its intents whose record it also holds are dropped;
        the others (their exchange has not ended, or never will) go in with the first chunk,
        owned by this replica and under its beat: an exchange still running here keeps its
        intent until its record comes; one of a process that died is recovered by this
        replica's sweep (``Ledger.recover_lost``)."""
        replaced = {s.replaces for s in records if s.replaces}
        # a predecessor's (this replica started again on its spool): adopted, so this
        # replica's own sweep records them, as no exchange of this process holds them
        orphans = [dataclasses.replace(i, owner=self._replica) for i in intents
                   if i.id not in replaced]  # fmt: skip
        beat = self.beat() if orphans else None
        if not records:
            # saves spooled keys, if any
            await self._sequencer.commit([], replay=True, intents=orphans, beat=beat)
        for start in range(0, len(records), self._max_batch):
            chunk = records[start : start + self._max_batch]
            await self._sequencer.commit(chunk, replay=True, intents=orphans, beat=beat)
            orphans, beat = [], None
        self._unavailable = False


def _now() -> float:
    return time.monotonic()


def _spool_lines(item: Sealed | Intent) -> list[bytes]:
    if isinstance(item, Intent):
        return [_INTENT + item.encode()]
    lines = [_RECORD + item.leaf_data()]
    if item.replaces:
        lines.append(_DONE + item.replaces.encode("ascii"))
    return lines


def _parse_spool(
    payloads: Sequence[bytes],
) -> tuple[list[DataKeyRow], list[Sealed], list[Intent]]:
    keys, records, intents = [], [], []
    for payload in payloads:
        kind, data = payload[:1], payload[1:]
        if kind == _KEY:
            keys.append(DataKeyRow.decode(data))
        elif kind == _RECORD:
            records.append(Sealed.from_leaf_data(data))
        elif kind == _DONE and records:  # the record before it replaces that intent
            records[-1] = dataclasses.replace(records[-1], replaces=data.decode("ascii"))
        elif kind == _INTENT:
            intents.append(Intent.decode(data))
    return keys, records, intents


def _resolve(batch: Sequence[_Item], error: Exception | None) -> None:
    for _, done in batch:
        if done is None or done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
