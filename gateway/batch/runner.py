"""Running batches' lines in the capacity interactive traffic leaves (every replica).

``BatchRunner.run_forever()`` claims lines from the shared ``BatchStore`` and runs each as an
ordinary request of its batch's key, **through the app itself** (``call``: an in-process ASGI
request to the line's endpoint, its key and line named in the scope, ``gateway.batch.lines.
BatchOrigin``), so a line goes through exactly what the same request sent alone would: the
same parse, reasoning split, visibility (a hidden key's results hold no reasoning byte),
guardrails, limits (its tokens count against its key's and tenant's) and one ledger record,
which names the batch and the line's ``custom_id``.

Rules:

- **Idle capacity only.** A line asks at ``x-thinkgate-priority: sheddable``: KV admission
  refuses it at once under pressure instead of queueing it, so an interactive request never
  waits behind one. A line refused for now (429: the capacity is taken or a limit reached;
  503: no engine, the database or ledger away) goes back in the queue, unrun and uncounted,
  and this replica halves how many lines it runs at once. Refused for the cluster's sake
  (KV capacity, which frees as requests end: a quarter of a second; a 503: its
  ``retry-after``), it pauses; refused by a limit of the batch's own key or tenant (a rate
  limit, a budget in money), only that batch waits here, the refusal's ``retry-after`` but
  at most ``HOLD_MAX_S`` (a budget raised meanwhile is seen: at once on the replica where it
  was set, ``unhold``), and the other batches go on. Each line that ends grows the window by
  one again, up to ``BATCH_MAX_CONCURRENCY`` (additive
  increase, multiplicative decrease: how many lines run follows the free budget). KV
  admission keeps sheddable work below three quarters of its pressure line
  (``ratelimit.fairness``), so lines never fill the budget up to where interactive work waits.
- **The process's CPU is capacity too**: while the event loop runs more than ``LAG_S`` late,
  the window halves and does not grow for a second.
- **Leases.** Claimed lines are this replica's while it renews them (every third of
  ``BATCH_LEASE_S``); a replica that dies leaves them to the first other replica that claims
  them once the lease ran out. Its exchange in flight was on the ledger as a write-ahead
  intent: it is recorded ``replica_lost`` (``gateway.ledger``), and the line runs again. Only
  the holder of the lease stores a result (``BatchStore.finish``): each line has one answer.
  A replica killed after a line's record committed but before its result was stored (results
  are written together, ``WRITE_EVERY_S``) leaves that line to run again too: the engine
  answers it twice and the ledger holds both ``ok`` records; the output file, one.
- **Stopping.** A renewal names the batches being cancelled or past their window: their
  running lines here are stopped (the exchange is cut as a client's disconnect would cut it,
  and recorded so) and end ``canceled`` or ``expired``. On shutdown the lines running here go
  back to the queue for another replica.
- **The end.** Every ``POLL_S`` each replica expires batches past their window and ends those
  with no open line (``BatchStore.finalize``, one transaction: a batch ends once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message

from gateway.batch.lines import ORIGIN, BatchOrigin
from gateway.batch.rows import ClaimedLine, LineResult
from gateway.batch.shapes import openai_files
from gateway.batch.store import BatchStore
from gateway.telemetry.metrics import Metrics

log = logging.getLogger("thinkgate")
POLL_S = 1.0
KV_RETRY_S = 0.25  # after a refusal for KV capacity: requests end every few ms under load
LAG_S = 0.01  # the event loop this late: the gateway's CPU is taken, fewer lines run here
HOLD_MAX_S = 60.0  # a batch its own key's limit refused waits at most this long to ask again
CLAIM_AT_ONCE = 16
CLAIM_EVERY_S = 0.05  # claims at most this often: lines ending meanwhile are replaced at once
WRITE_EVERY_S = 0.05  # lines' results are stored together, this long after the first ends
_DB_ERRORS = (SQLAlchemyError, OSError)
_LATER = (429, 503)  # refused for now: the line goes back in the queue
_RELEASE = "release"  # a stop that puts the line back (this replica shuts down)


@dataclass(frozen=True, slots=True)
class LineAnswer:
    status: int
    body: bytes
    retry_after: float


async def call(app: ASGIApp, claimed: ClaimedLine, key_id: str) -> LineAnswer:
    """The line, asked of ``app`` in process as a request of ``key_id``."""
    body = orjson.dumps(claimed.request.body)
    path = claimed.request.url
    request_id = "req_" + secrets.token_hex(12)
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"thinkgate-batch"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-thinkgate-priority", b"sheddable"),
            (b"x-request-id", request_id.encode()),
        ],
        "client": ("127.0.0.1", 0),
        "server": ("thinkgate-batch", 0),
        "state": {"request_id": request_id},
        ORIGIN: BatchOrigin(key_id, claimed.batch_id, claimed.request.custom_id, body),
    }
    sent = False
    forever = asyncio.Event()  # a line's client never leaves: a stop cancels the call

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await forever.wait()
        return {"type": "http.disconnect"}

    status, headers, chunks = 500, [], []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    retry = next((v for k, v in headers if k.lower() == b"retry-after"), b"1")
    try:
        retry_after = min(max(float(retry), 0.1), 30.0)
    except ValueError:
        retry_after = 1.0
    return LineAnswer(status, b"".join(chunks), retry_after)


@dataclass(slots=True)
class _Run:
    claimed: ClaimedLine
    task: asyncio.Task[None] | None = None
    stop_as: str | None = None  # "canceled" or "expired" when the batch stops it


@dataclass(slots=True)
class BatchRunner:
    store: BatchStore
    app: Callable[[], ASGIApp]  # the app the lines are asked of (known once it is made)
    owner: str  # this replica's id
    most: int  # BATCH_MAX_CONCURRENCY
    metrics: Metrics | None = None
    poll_s: float = POLL_S
    window: int = 1  # lines at once now: grows by one per line ended, halves when shed
    runs: dict[tuple[str, int], _Run] = field(default_factory=dict)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _paused_until: float = 0.0
    _held: dict[str, float] = field(default_factory=dict)  # batch id -> waits until (monotonic)
    _calm_until: float = 0.0  # the loop ran late: the window does not grow before then
    # results waiting for their write: the line, its result, told whether it was kept
    _ended: list[tuple[ClaimedLine, LineResult, asyncio.Future[bool]]] = field(default_factory=list)
    _writing: asyncio.Future[None] | None = None  # the write of the last results taken

    def wake(self) -> None:
        """Look for lines now (a batch was made here)."""
        self._wake.set()

    def unhold(self) -> None:
        """The batches a limit of their own held may ask again now (a budget was changed)."""
        self._held.clear()
        self._wake.set()

    def _holding(self) -> list[str]:
        now = time.monotonic()
        self._held = {b: until for b, until in self._held.items() if until > now}
        return list(self._held)

    async def run_forever(self) -> None:
        tasks = [
            asyncio.create_task(self._renew_forever()),
            asyncio.create_task(self._sweep_forever()),
            asyncio.create_task(self._watch_lag()),
        ]
        try:
            await self._claim_forever()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _claim_forever(self) -> None:
        last = -CLAIM_EVERY_S
        while True:
            since = time.monotonic() - last
            if since < CLAIM_EVERY_S:  # one transaction for the lines that ended meanwhile
                await asyncio.sleep(CLAIM_EVERY_S - since)
            last = time.monotonic()
            room = min(self.window, self.most) - len(self.runs)
            paused = time.monotonic() < self._paused_until
            claimed: list[ClaimedLine] = []
            if room > 0 and not paused:
                try:
                    claimed = await self.store.claim(self.owner, min(room, CLAIM_AT_ONCE),
                                                     skip=self._holding())  # fmt: skip
                except _DB_ERRORS as exc:
                    log.warning("claiming batch lines failed: %s", type(exc).__name__)
            for c in claimed:
                run = _Run(c)
                self.runs[(c.batch_id, c.line)] = run
                run.task = asyncio.create_task(self._line(run))
            if claimed and len(claimed) == min(room, CLAIM_AT_ONCE):
                continue  # there may be more
            self._wake.clear()
            wait_s = max(self._paused_until - time.monotonic(), 0.0) if paused else self.poll_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s or self.poll_s)

    async def _line(self, run: _Run) -> None:
        c = run.claimed
        key = (c.batch_id, c.line)
        try:
            answer = None
            try:  # a stop cancels the call (the exchange may also end it as a disconnect)
                answer = await call(self.app(), c, c.key_id)
            except asyncio.CancelledError:
                if run.stop_as is None:  # not ours (the loop closes): the line goes back
                    await asyncio.shield(self.store.release(self.owner, [c]))
                    raise
            if run.stop_as not in (None, _RELEASE):  # its batch was cancelled or expired
                stopped = LineResult(c.line, c.request.custom_id, run.stop_as, None, None, None)
                await self._finish(c, stopped)
                return
            if answer is None or run.stop_as == _RELEASE:  # this replica stops: another runs it
                await self.store.release(self.owner, [c])
                return
            if answer.status in _LATER:
                # the cluster's capacity is taken: look again soon (it frees as requests end);
                # an outage: when the gateway says; the key's own limit: this batch waits
                kv = answer.status == 429 and b"kv_budget_exhausted" in answer.body
                if answer.status == 429 and not kv:
                    self._hold(c.batch_id, answer.retry_after)
                else:
                    self._shed(min(answer.retry_after, KV_RETRY_S) if kv else answer.retry_after)
                await self.store.release(self.owner, [c])
                return
            body: Any = orjson.loads(answer.body) if answer.body else None
            outcome = "succeeded" if answer.status == 200 else "errored"
            request_id = None
            if isinstance(body, dict):
                request_id = body.get("id") if outcome == "succeeded" else None
            await self._finish(
                c, LineResult(c.line, c.request.custom_id, outcome, answer.status, body, request_id)
            )
            if asyncio.get_running_loop().time() >= self._calm_until:
                self.window = min(self.window + 1, self.most)
        except Exception as exc:  # never lose the runner to one line: it is retried
            log.error(
                "batch %s line %d failed to run: %s",
                c.batch_id,
                c.line,
                type(exc).__name__,
                exc_info=exc,
            )
            with contextlib.suppress(*_DB_ERRORS):
                await self.store.release(self.owner, [c])
            self._shed(1.0)
        finally:
            self.runs.pop(key, None)
            self._wake.set()

    async def _watch_lag(self, every_s: float = 0.1) -> None:
        """The process's own CPU is capacity too: while the event loop runs late (requests,
        lines and records all share it), the window halves and stops growing, so batch lines
        never stand between an interactive request and its next step."""
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(every_s)
            if self.runs and loop.time() - asked - every_s > LAG_S:
                self.window = max(1, self.window // 2)
                self._calm_until = loop.time() + 1.0

    def _shed(self, retry_after: float, pause: bool = True) -> None:
        self.window = max(1, self.window // 2)
        if pause:
            self._paused_until = max(self._paused_until, time.monotonic() + retry_after)
        if self.metrics is not None:
            self.metrics.batch_lines_shed.inc()

    def _hold(self, batch_id: str, retry_after: float) -> None:
        until = time.monotonic() + min(max(retry_after, 0.0), HOLD_MAX_S)
        self._held[batch_id] = max(self._held.get(batch_id, 0.0), until)
        self._shed(0.0, pause=False)

    async def _finish(self, c: ClaimedLine, result: LineResult) -> None:
        """Store the result, with those of the lines that end within ``WRITE_EVERY_S``: one
        transaction for them all (a line's own exchange already paid its ledger commit)."""
        done = asyncio.get_running_loop().create_future()
        self._ended.append((c, result, done))
        if len(self._ended) == 1:
            asyncio.get_running_loop().call_later(WRITE_EVERY_S, self._write_ended)
        if await done and self.metrics is not None:
            self.metrics.batch_lines_done.labels(result.outcome).inc()

    def _write_ended(self) -> None:
        ended, self._ended = self._ended, []
        self._writing = asyncio.ensure_future(self._write(ended))

    async def _write(
        self, ended: list[tuple[ClaimedLine, LineResult, asyncio.Future[bool]]]
    ) -> None:
        try:
            kept = await self.store.finish_many(self.owner, [(c, r) for c, r, _ in ended])
        except BaseException as exc:  # each line's run handles it (its line goes back)
            for _, _, done in ended:
                if not done.done():
                    done.set_exception(exc)
            return
        for (_, _, done), was in zip(ended, kept, strict=True):
            if not done.done():
                done.set_result(was)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.store.lease_s / 3)
            if not self.runs:
                continue
            try:
                stopping = await self.store.renew(self.owner)
            except _DB_ERRORS as exc:
                log.warning("renewing batch leases failed: %s", type(exc).__name__)
                continue
            self.stop(stopping)

    def stop(self, stopping: dict[str, str]) -> None:
        """Stop the lines running here of these batches (id -> the outcome they end with)."""
        for (batch_id, _), run in list(self.runs.items()):
            outcome = stopping.get(batch_id)
            if outcome is not None and run.stop_as is None and run.task is not None:
                run.stop_as = outcome
                run.task.cancel()

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except _DB_ERRORS as exc:
                log.warning("sweeping batches failed: %s", type(exc).__name__)
            await asyncio.sleep(self.poll_s)

    async def sweep(self) -> None:
        """Expire batches past their window, end those with no open line, and report. Without
        an active batch there is nothing to expire or end and no line open: one query, the
        idle replica's whole sweep (it was four each second, through the async engine)."""
        oldest = await self.store.oldest_active()
        if oldest is not None:
            expired = await self.store.expire()
            if expired:
                self.stop(dict.fromkeys(expired, "expired"))
            for batch_id, tenant, api in await self.store.unfinished():
                await self.store.finalize(tenant, batch_id, api, openai_files)  # type: ignore[arg-type]
        if self.metrics is not None:
            queued, running = (0, 0) if oldest is None else await self.store.open_lines()
            self.metrics.batch_lines.labels("queued").set(queued)
            self.metrics.batch_lines.labels("running").set(running)
            age = 0.0 if oldest is None else max(time.time() - oldest, 0.0)
            self.metrics.batch_oldest_age.set(age)

    async def stop_all(self) -> None:
        """Shutdown: the lines running here go back in the queue for another replica."""
        runs = [r for r in self.runs.values() if r.task is not None]
        for run in runs:
            run.stop_as = _RELEASE
            run.task.cancel()  # type: ignore[union-attr]
        await asyncio.gather(*(r.task for r in runs if r.task is not None), return_exceptions=True)
        with contextlib.suppress(*_DB_ERRORS):
            await self.store.release(self.owner)
