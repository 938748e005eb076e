"""Background responses in the shell: run detached from the connection, followed from any
replica, cancelled, and never left ``in_progress`` by a replica that died.

``Runner.start(ex, candidates, relay, input_items)`` takes an admitted Responses exchange
whose stream relay (``ResponsesStream``) shapes the events for its key: the response is stored
``queued`` with its first events (``response.created``, ``response.queued``) before the
caller answers, then the exchange runs in a task of this replica (``Forwarder.detached``): it
goes through the same relay, visibility, settlement and ledger record as a foreground stream.

Rules:

- Events are written to the ``BackgroundStore`` (sealed, in the shared database) every
  ``flush_s`` while they come, and the row's heartbeat at least every ``beat_s`` while none
  do (hidden reasoning may take minutes); the final write carries the terminal status and the
  final response object (``completed``, ``incomplete``, ``failed``) with the last events.
- A database that fails a write loses nothing: the events stay buffered and go with the next.
- Cancel (``cancel``): on this replica the run is cancelled at once; on another, the owner
  reads the row's ``cancel_requested`` at its next write (within ``beat_s``). The engine
  request is closed (vLLM aborts it), the limits and the KV lease are settled, the record's
  status is ``cancelled``, and the response ends ``cancelled`` with its output so far; its
  stream simply ends (the reference has no ``response.cancelled`` event).
- Every replica sweeps every ``beat_s``: an active response whose owner's heartbeat is older
  than ``BACKGROUND_STALE_S`` is marked ``failed`` with a terminal ``response.failed`` event
  (``BackgroundStore.sweep``); an owner that finds its row swept stops and records
  ``error`` / ``background_lost``.
- Shutting down, a replica cancels its runs as a cancel would, status ``failed``
  (``server_shutting_down``), so nothing waits for the sweep after a clean stop.
- ``follow(tenant, id, after, shown)``: the stream's events after sequence number ``after``,
  then live until the response ends, on any replica: woken at once by a write of this
  replica, polling every ``POLL_S`` for another's. A hidden key gets no reasoning byte
  (``for_key_event``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy.exc import SQLAlchemyError

from gateway.conversation.background import TERMINAL, BackgroundStore, Event, Lost
from gateway.conversation.visibility import for_key_event
from gateway.errors import NotFound
from gateway.exchange.forward import Forwarder
from gateway.exchange.lifecycle import Exchange
from gateway.relay.apis.responses import ResponsesStream
from gateway.relay.sse import encode_event
from gateway.upstream.engine import Upstream

log = logging.getLogger("thinkgate")
POLL_S = 0.2
_FINAL = ("response.completed", "response.incomplete", "response.failed")
_DB_ERRORS = (SQLAlchemyError, OSError)


def split_events(piece: bytes) -> list[Event]:
    """The SSE events of one relay piece (``event: NAME\\ndata: JSON\\n\\n`` each)."""
    found: list[Event] = []
    for block in piece.split(b"\n\n"):
        if not block.startswith(b"event: "):
            continue  # a comment, or the empty tail
        head, _, data = block.partition(b"\ndata: ")
        found.append((head[7:].decode(), data))
    return found


@dataclass(slots=True)
class _Run:
    ex: Exchange
    relay: ResponsesStream
    tenant: str
    written: int  # events stored
    buffer: list[Event] = field(default_factory=list)
    status: str = "queued"
    last_write: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    stop_as: tuple[str, str] | None = None  # (record status, error code) a stop records
    final: dict[str, Any] | None = None
    consuming: bool = True  # the engine's stream is still read (a stop cancels only that)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # the ticker's signal to go


@dataclass(slots=True)
class Runner:
    store: BackgroundStore
    forwarder: Forwarder
    owner: str  # this replica's id
    flush_s: float = 0.1
    beat_s: float = 1.0
    runs: dict[str, _Run] = field(default_factory=dict)
    # followers waiting here, by response id (an entry goes when no follower holds it)
    _wake: weakref.WeakValueDictionary[str, asyncio.Event] = field(
        default_factory=weakref.WeakValueDictionary
    )

    async def start(
        self, ex: Exchange, candidates: Sequence[Upstream], relay: ResponsesStream,
        input_items: list[dict[str, Any]],
    ) -> dict[str, Any]:  # fmt: skip
        """Store the response ``queued`` and run it; the queued response object."""
        first = split_events(relay.queued())
        queued: dict[str, Any] = orjson.loads(first[0][1])["response"]
        await self.store.create(ex.key.tenant, ex.key.key_id, self.owner, queued, input_items,
                                first)  # fmt: skip
        run = _Run(ex, relay, ex.key.tenant, len(first))
        self.runs[queued["id"]] = run
        run.task = asyncio.create_task(self._run(queued["id"], run, candidates))
        return queued

    async def _run(self, response_id: str, run: _Run, candidates: Sequence[Upstream]) -> None:
        ticking = asyncio.create_task(self._tick(response_id, run))
        try:
            async for piece in self.forwarder.detached(run.ex, candidates):
                for name, data in split_events(piece):
                    run.buffer.append((name, data))
                    if name in _FINAL:
                        run.final = orjson.loads(data)["response"]
        except asyncio.CancelledError:
            pass  # stopped (cancel, lost, shutdown): the exchange is finished by detached
        run.consuming = False  # from here a stop waits: the last write must not be cut
        run.ended.set()
        try:
            await asyncio.shield(ticking)  # it ends its write in progress, if any
            await self._end(response_id, run)
        finally:
            self.runs.pop(response_id, None)
            self._notify(response_id)

    async def _end(self, response_id: str, run: _Run) -> None:
        """The last write: the terminal status and final object, retried while the database
        is away (a write lost here would leave the response to the sweep)."""
        final = run.final
        if final is None or run.stop_as is not None:  # stopped before its terminal event
            final = {**run.relay.final_object(), "status": "cancelled"}
            if run.stop_as is not None and run.stop_as[0] != "cancelled":
                final = {
                    **final,
                    "status": "failed",
                    "error": {
                        "code": run.stop_as[1],
                        "message": "The gateway stopped this response.",
                    },
                }
        for attempt in range(5):
            try:
                await self._write(response_id, run, final["status"], final)
                return
            except Lost:
                return
            except _DB_ERRORS as exc:
                log.warning("storing background response %s failed (attempt %d): %s",
                            response_id, attempt + 1, type(exc).__name__)  # fmt: skip
                await asyncio.sleep(self.beat_s)

    async def _tick(self, response_id: str, run: _Run) -> None:
        while not run.ended.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.ended.wait(), self.flush_s)
            if run.ended.is_set():
                return
            if not run.buffer and time.monotonic() - run.last_write < self.beat_s:
                continue
            status = "in_progress" if run.status == "queued" and _started(run) else None
            try:
                cancel = await self._write(response_id, run, status)
            except Lost:
                log.warning("background response %s was taken over or ended elsewhere; "
                            "stopping it here", response_id)  # fmt: skip
                self._stop(run, ("error", "background_lost"))
                return
            except _DB_ERRORS as exc:
                log.warning("storing background response %s events failed: %s",
                            response_id, type(exc).__name__)  # fmt: skip
                continue
            if cancel:
                self._stop(run, ("cancelled", "cancelled"))
                return

    async def _write(
        self, response_id: str, run: _Run, status: str | None,
        response: dict[str, Any] | None = None,
    ) -> bool:  # fmt: skip
        """One write of the buffered events (never two at once for a run: the ticker writes
        until the stream ends, then the run's last write)."""
        chunk, run.buffer = run.buffer, []
        try:
            cancel = await self.store.write(run.tenant, response_id, self.owner, run.written,
                                            chunk, status=status, response=response)  # fmt: skip
        except BaseException:
            run.buffer = chunk + run.buffer
            raise
        run.written += len(chunk)
        run.last_write = time.monotonic()
        if status is not None:
            run.status = status
        self._notify(response_id)
        return cancel

    def _stop(self, run: _Run, stop_as: tuple[str, str]) -> None:
        # not once the record is on its way: the response is then about to end by itself
        if run.stop_as is None and run.consuming and not run.ex.finishing:
            run.stop_as = stop_as
            run.ex.status, run.ex.error_code = stop_as  # type: ignore[assignment]
            if run.task is not None:
                run.task.cancel()

    async def cancel(self, tenant: str, response_id: str) -> None:
        """Stop the response wherever it runs: here at once, elsewhere at its owner's next
        write. ``NotFound`` for no such response of the tenant."""
        run = self.runs.get(response_id)
        if run is not None and run.tenant == tenant:
            self._stop(run, ("cancelled", "cancelled"))
            if run.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(run.task)
            return
        if not await self.store.request_cancel(tenant, response_id):
            if await self.store.load(tenant, response_id) is None:
                raise NotFound(f"No response found with id '{response_id}'.")
            return  # ended already: cancelling again returns it as it is
        await self._await_end(tenant, response_id)

    async def _await_end(self, tenant: str, response_id: str) -> None:
        """Wait (a bounded while) until the owner stopped it, so the answer shows the end."""
        deadline = time.monotonic() + self.store.stale_s + 2 * self.beat_s
        while time.monotonic() < deadline:
            found = await self.store.load(tenant, response_id)
            if found is None or not found.active:
                return
            await self._wait(response_id, POLL_S)

    async def stop_all(self) -> None:
        """Shutdown: every run here ends ``failed`` (``server_shutting_down``) and is
        recorded, rather than waiting for another replica's sweep."""
        runs = list(self.runs.values())
        for run in runs:
            self._stop(run, ("error", "server_shutting_down"))
        await asyncio.gather(*(r.task for r in runs if r.task is not None),
                             return_exceptions=True)  # fmt: skip

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.beat_s)
            try:
                swept = await self.store.sweep(_failed_events)
            except _DB_ERRORS as exc:
                log.warning("sweeping background responses failed: %s", type(exc).__name__)
                continue
            for response_id in swept:
                log.warning("background response %s failed: its replica stopped beating",
                            response_id)  # fmt: skip
                self._notify(response_id)

    # -- following ---------------------------------------------------------------------------

    async def follow(
        self, tenant: str, response_id: str, after: int, shown: bool
    ) -> AsyncIterator[bytes]:
        """Every event after ``after``, then live until the response ends."""
        while True:
            found = await self.store.events_after(tenant, response_id, after)
            if found is None:
                return
            status, new = found
            for seq, (name, data) in new:
                after = seq
                shown_data = for_key_event(name, data, shown)
                if shown_data is not None:
                    yield encode_event(name, shown_data)
            if status in TERMINAL:
                return
            await self._wait(response_id, POLL_S)

    def _notify(self, response_id: str) -> None:
        wake = self._wake.pop(response_id, None)
        if wake is not None:
            wake.set()

    async def _wait(self, response_id: str, timeout_s: float) -> None:
        wake = self._wake.setdefault(response_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout_s)


def _started(run: _Run) -> bool:
    return any(name == "response.in_progress" for name, _ in run.buffer)


def _failed_events(response: dict[str, Any], seq: int) -> list[Event]:
    """The terminal event of a response swept as failed, numbered ``seq``."""
    data = orjson.dumps({"type": "response.failed", "sequence_number": seq,
                         "response": response})  # fmt: skip
    return [("response.failed", data)]
