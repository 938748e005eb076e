"""Batches and their lines, in the gateway's database: every replica runs any batch's lines.

- ``gateway_batches``: one row per batch (OpenAI's Batch API or Anthropic's Message Batches,
  ``api``). Clear: the id, tenant, the key whose requests the lines are, ``endpoint``,
  ``status`` (``in_progress``, ``cancelling``, then ``completed``, ``expired``,
  ``cancelled``; ``failed`` only for an input that could not be read), the times, the line
  count, the files. Sealed: the client's ``metadata``.
- ``gateway_batch_lines``: one row per request. ``state`` ``queued`` → ``running`` (claimed by
  a replica, ``owner``, until ``lease_until``) → ``done`` with its ``outcome``
  (``succeeded``, ``errored``, ``canceled``, ``expired``). Sealed: the request (custom id,
  path, body) and its result (the endpoint's status code and body).

Rules:

- **Claims are leases.** ``claim`` takes queued lines, and running lines whose lease ran out
  (their replica died), in one transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so two
  replicas never take the same line); the owner renews its leases (``renew``) every third of
  the lease. Only the owner of a running line can finish it (``finish``: the update checks
  owner and state), so a line has exactly one result however many replicas ran it.
- **Cancel and expiry stop the queue at once**: the batch's queued lines end ``canceled`` or
  ``expired`` in the same transaction; its running lines end as their runs end (a renewal
  tells their owner which batches are stopping).
- **The end is one transaction**: when no line is open, ``finalize`` moves the batch to its
  final status (``completed``; ``cancelled`` when a cancel was asked; ``expired`` past its
  window) and, for OpenAI's API, writes the output and error files in the same transaction,
  so a batch is never ended without its files nor given them twice.
- Sealing: AES-256-GCM under ``HKDF-SHA256(the tenant's data key, salt,
  "thinkgate/batches/v1")``, each value bound to its batch, tenant, line and part. Retention,
  hold and shred act on them as on stored responses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import (
    and_,
    delete,
    func,
    or_,
    select,
    update,
)

from audit.datakeys import DataKeys
from audit.sqlasync import AsyncConnection, AsyncEngine
from gateway.batch.files import FileStore, files, past
from gateway.batch.lines import BatchLine, decode_line, encode_lines
from gateway.batch.rows import (
    ACTIVE,
    OPEN,
    WINDOW_S,
    Api,
    Batch,
    ClaimedLine,
    LimitReached,
    LineCounts,
    LineResult,
    Outcome,
    Render,
    aad,
    batch_from_row,
    batches,
    lines,
    new_batch_id,
)
from gateway.conversation.retention import EVERY_S, purge_forever
from gateway.conversation.sealedstore import SealedStore

# The runner's sweep asks these every second: built once, not per call.
_OLDEST_ACTIVE = select(func.min(batches.c.created_at)).where(batches.c.status.in_(ACTIVE))
_OPEN_LINES = (
    select(lines.c.state, func.count()).where(lines.c.state.in_(OPEN)).group_by(lines.c.state)
)


class BatchStore(SealedStore):
    info = b"thinkgate/batches/v1"

    def __init__(
        self,
        engine: AsyncEngine,
        keys: DataKeys,
        retention_s: float,
        files: FileStore,
        lease_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(engine, keys, retention_s, clock)
        self.files = files
        self.lease_s = lease_s
        self._boxes: dict[str, AESGCM] = {}  # batch id -> its box (ids are random)
        self._postgres = engine.dialect.name == "postgresql"

    # -- creating ------------------------------------------------------------------------

    async def create(
        self,
        tenant: str,
        key_id: str,
        api: Api,
        endpoint: str,
        requests: Sequence[BatchLine],
        *,
        window_s: float,
        metadata: dict[str, Any] | None = None,
        input_file_id: str | None = None,
        limits: tuple[int, int],
    ) -> Batch:
        """A new batch, ``in_progress``, its lines queued. ``limits``: the tenant's most
        batches in progress and queued lines (``LimitReached`` beyond)."""
        await self._within(tenant, len(requests), limits)
        batch_id, box, row = await self._new(
            tenant,
            key_id,
            api,
            endpoint,
            len(requests),
            window_s,
            input_file_id,
            {"metadata": metadata},
        )
        now = row["created_at"]
        rows = [
            {
                "batch_id": batch_id,
                "line": index,
                "tenant": tenant,
                "state": "queued",
                "queued_at": now,
                "owner": None,
                "lease_until": 0.0,
                "attempts": 0,
                "request": self.seal(box, plain, aad(batch_id, tenant, b"request", index)),
            }
            for index, plain in enumerate(encode_lines(requests))
        ]
        async with self._engine.begin() as conn:
            await conn.execute(batches.insert().values(**row))
            for start in range(0, len(rows), 1000):
                await conn.execute(lines.insert(), rows[start : start + 1000])
        return batch_from_row(row, {"metadata": metadata}, LineCounts(processing=len(requests)))

    async def _within(self, tenant: str, adding: int, limits: tuple[int, int]) -> None:
        """``LimitReached`` when the tenant's batches in progress or waiting lines (with
        ``adding`` more) pass ``limits``."""
        most_batches, most_lines = limits
        active_batches = (
            select(func.count())
            .select_from(batches)
            .where(batches.c.tenant == tenant, batches.c.status.in_(ACTIVE))
        )
        waiting = (
            select(func.count())
            .select_from(lines)
            .where(lines.c.tenant == tenant, lines.c.state.in_(OPEN))
        )
        async with self._engine.connect() as conn:
            active = (await conn.execute(active_batches)).scalar_one()
            queued = (await conn.execute(waiting)).scalar_one()
        if active >= most_batches:
            raise LimitReached(f"This tenant has {active} batches in progress, its limit.")
        if queued + adding > most_lines:
            raise LimitReached(
                f"This tenant has {queued} batch requests waiting; {adding} "
                f"more would pass its limit of {most_lines}."
            )

    async def failed(
        self, tenant: str, key_id: str, endpoint: str, input_file_id: str,
        metadata: dict[str, Any] | None, error: dict[str, Any],
    ) -> Batch:  # fmt: skip
        """A batch whose input could not be read: ``failed`` at once, with why."""
        sealed = {"metadata": metadata, "errors": [error]}
        _, _, row = await self._new(tenant, key_id, "openai", endpoint, 0, WINDOW_S,
                                    input_file_id, sealed, status="failed")  # fmt: skip
        async with self._engine.begin() as conn:
            await conn.execute(batches.insert().values(**row))
        return batch_from_row(row, sealed, LineCounts())

    async def _new(
        self, tenant: str, key_id: str, api: Api, endpoint: str, total: int, window_s: float,
        input_file_id: str | None, sealed: dict[str, Any], status: str = "in_progress",
    ) -> tuple[str, AESGCM, dict[str, Any]]:  # fmt: skip
        batch_id = new_batch_id(api)
        dek_id, salt, box = await self.new_box(tenant)
        self._boxes[batch_id] = box
        now = self._clock()
        row = {
            "id": batch_id,
            "tenant": tenant,
            "key_id": key_id,
            "api": api,
            "endpoint": endpoint,
            "status": status,
            "total": total,
            "created_at": now,
            "expires_at": now + window_s,
            "cancel_at": None,
            "ended_at": now if status == "failed" else None,
            "input_file_id": input_file_id,
            "output_file_id": None,
            "error_file_id": None,
            "purge_at": now + self._retention_s,
            "dek_id": dek_id,
            "salt": salt,
            "sealed": self.seal(box, orjson.dumps(sealed), aad(batch_id, tenant, b"batch")),
        }
        return batch_id, box, row

    # -- reading -------------------------------------------------------------------------

    async def _box(self, conn: AsyncConnection, batch_id: str, tenant: str) -> AESGCM | None:
        box = self._boxes.get(batch_id)
        if box is not None:
            return box
        row = (
            await conn.execute(
                select(batches.c.dek_id, batches.c.salt).where(
                    batches.c.id == batch_id, batches.c.tenant == tenant
                )
            )
        ).first()
        if row is None:
            return None
        dek = await self._keys.opening(row.dek_id, tenant=tenant)
        if dek is None:
            return None
        box = self.box(dek, bytes(row.salt))
        if len(self._boxes) > 10_000:
            self._boxes.clear()
        self._boxes[batch_id] = box
        return box

    def _open(self, box: AESGCM, sealed: bytes, aad: bytes) -> bytes | None:
        try:
            return self.open(box, sealed, aad)
        except InvalidTag:
            return None

    async def _counts(
        self, conn: AsyncConnection, batch_ids: Sequence[str]
    ) -> dict[str, LineCounts]:
        query = (
            select(lines.c.batch_id, lines.c.state, lines.c.outcome, func.count())
            .where(lines.c.batch_id.in_(batch_ids))
            .group_by(lines.c.batch_id, lines.c.state, lines.c.outcome)
        )
        tallies: dict[str, dict[str, int]] = {}
        for batch_id, state, outcome, count in (await conn.execute(query)).all():
            name = outcome if state == "done" and outcome else "processing"
            tally = tallies.setdefault(batch_id, {})
            tally[name] = tally.get(name, 0) + int(count)
        return {batch_id: LineCounts(**tally) for batch_id, tally in tallies.items()}

    async def _opened(self, conn: AsyncConnection, rows: Sequence[Any]) -> list[Batch]:
        counts = await self._counts(conn, [row.id for row in rows]) if rows else {}
        found = []
        for row in rows:
            box = await self._box(conn, row.id, row.tenant)
            plain = (
                None
                if box is None
                else self._open(box, bytes(row.sealed), aad(row.id, row.tenant, b"batch"))
            )
            if plain is None:
                continue  # its key was destroyed: it reads as gone
            found.append(
                batch_from_row(row._mapping, orjson.loads(plain), counts.get(row.id, LineCounts()))
            )
        return found

    async def load(self, tenant: str, batch_id: str, api: Api) -> Batch | None:
        """The tenant's batch of that API; ``None`` when unknown, gone or unreadable."""
        query = select(batches).where(
            batches.c.id == batch_id,
            batches.c.tenant == tenant,
            batches.c.api == api,
            batches.c.purge_at > self._clock(),
        )
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
            found = await self._opened(conn, rows)
        return found[0] if found else None

    async def page(
        self,
        tenant: str,
        api: Api,
        *,
        limit: int,
        after: str | None = None,
        before: str | None = None,
    ) -> tuple[list[Batch], bool]:
        """The tenant's batches, newest first: those older than ``after`` (or newer than
        ``before``, nearest it first, then returned newest first), and whether more follow."""
        query = select(batches).where(
            batches.c.tenant == tenant, batches.c.api == api, batches.c.purge_at > self._clock()
        )
        async with self._engine.connect() as conn:
            cursor_id = after or before
            if cursor_id is not None:
                beyond = await past(conn, batches, tenant, cursor_id, newer=after is None)
                if beyond is not None:
                    query = query.where(beyond)
            if before is not None:
                query = query.order_by(batches.c.created_at, batches.c.id)
            else:
                query = query.order_by(batches.c.created_at.desc(), batches.c.id.desc())
            rows = (await conn.execute(query.limit(limit + 1))).all()
            more = len(rows) > limit
            found = await self._opened(conn, rows[:limit])
        if before is not None:
            found.reverse()
        return found, more

    async def results(self, batch: Batch) -> list[LineResult]:
        """The ended lines' results, in line order (a line whose key was destroyed is
        left out)."""
        query = (
            select(
                lines.c.line, lines.c.outcome, lines.c.status_code, lines.c.request, lines.c.result
            )
            .where(lines.c.batch_id == batch.id, lines.c.state == "done")
            .order_by(lines.c.line)
        )
        async with self._engine.connect() as conn:
            box = await self._box(conn, batch.id, batch.tenant)
            rows = (await conn.execute(query)).all()
        return [] if box is None else self._results(box, batch, rows)

    def _results(self, box: AESGCM, batch: Batch, rows: Sequence[Any]) -> list[LineResult]:
        found = []
        for row in rows:
            request = self._open(
                box, bytes(row.request), aad(batch.id, batch.tenant, b"request", row.line)
            )
            if request is None:
                continue
            answer: dict[str, Any] = {"body": None, "request_id": None}
            if row.result is not None:
                opened = self._open(
                    box, bytes(row.result), aad(batch.id, batch.tenant, b"result", row.line)
                )
                answer = orjson.loads(opened) if opened is not None else answer
            found.append(
                LineResult(
                    row.line,
                    decode_line(request).custom_id,
                    row.outcome,
                    row.status_code,
                    answer["body"],
                    answer["request_id"],
                )
            )
        return found

    # -- running ---------------------------------------------------------------------------

    async def claim(self, owner: str, most: int, skip: Sequence[str] = ()) -> list[ClaimedLine]:
        """Up to ``most`` lines for ``owner`` to run: queued ones first come, and running
        ones whose owner's lease ran out; none of the batches in ``skip``."""
        now = self._clock()
        open_ = or_(
            lines.c.state == "queued", and_(lines.c.state == "running", lines.c.lease_until < now)
        )
        pick = (
            select(lines.c.batch_id, lines.c.line)
            .where(open_, *([lines.c.batch_id.not_in(skip)] if skip else []))
            .order_by(lines.c.queued_at, lines.c.batch_id, lines.c.line)
            # PostgreSQL skips the rows another claim holds; elsewhere a claim racing this
            # one takes some of the same candidates first: more of them keep this one useful
            .limit(most if self._postgres else most * 4)
        )
        if self._postgres:
            pick = pick.with_for_update(skip_locked=True)
        taken: list[ClaimedLine] = []
        async with self._engine.begin() as conn:
            for batch_id, line in (await conn.execute(pick)).all():
                if len(taken) == most:
                    break
                claimed = await self._take(conn, owner, batch_id, line, open_, now)
                if claimed is not None:
                    taken.append(claimed)
        return taken

    async def _take(
        self, conn: AsyncConnection, owner: str, batch_id: str, line: int, open_: Any, now: float
    ) -> ClaimedLine | None:
        """The line, now ``owner``'s, opened; ``None`` when another claim took it first, or
        its key was destroyed (then it ends: nothing can be run or answered)."""
        where = (lines.c.batch_id == batch_id, lines.c.line == line)
        result = await conn.execute(
            update(lines).where(*where, open_)
            .values(state="running", owner=owner, lease_until=now + self.lease_s,
                    attempts=lines.c.attempts + 1)
            .returning(lines.c.tenant, lines.c.attempts, lines.c.request)
        )  # fmt: skip
        row = result.first()
        if row is None:
            return None
        key_id = (await conn.execute(select(batches.c.key_id).where(
            batches.c.id == batch_id))).scalar_one()  # fmt: skip
        box = await self._box(conn, batch_id, row.tenant)
        bound = aad(batch_id, row.tenant, b"request", line)
        plain = None if box is None else self._open(box, bytes(row.request), bound)
        if plain is None:
            await conn.execute(update(lines).where(*where).values(
                state="done", outcome="errored", owner=None))  # fmt: skip
            return None
        return ClaimedLine(batch_id, line, row.tenant, key_id, row.attempts, decode_line(plain))

    async def renew(self, owner: str) -> dict[str, str]:
        """Extend ``owner``'s leases; the batches of its running lines that are stopping,
        with the outcome their lines end with (``canceled``, or ``expired``: past the
        window)."""
        now = self._clock()
        async with self._engine.begin() as conn:
            await conn.execute(
                update(lines)
                .where(
                    lines.c.owner == owner,
                    lines.c.state == "running",
                )
                .values(lease_until=now + self.lease_s)
            )
            stopping = (
                await conn.execute(
                    select(batches.c.id, batches.c.status).where(
                        batches.c.id.in_(
                            select(lines.c.batch_id).where(
                                lines.c.owner == owner, lines.c.state == "running"
                            )
                        ),
                        or_(batches.c.status != "in_progress", batches.c.expires_at <= now),
                    )
                )
            ).all()
        return {row.id: "canceled" if row.status == "cancelling" else "expired" for row in stopping}

    async def finish(self, owner: str, claimed: ClaimedLine, result: LineResult) -> bool:
        """The line's result, kept if the line is still ``owner``'s (else another replica
        took it over: this run's result is dropped, the other's counts)."""
        return (await self.finish_many(owner, [(claimed, result)]))[0]

    async def finish_many(
        self, owner: str, ended: Sequence[tuple[ClaimedLine, LineResult]]
    ) -> list[bool]:
        """``finish`` for several lines in one transaction; whether each was kept."""
        kept: list[bool] = []
        async with self._engine.begin() as conn:
            for claimed, result in ended:
                box = await self._box(conn, claimed.batch_id, claimed.tenant)
                if box is None:
                    kept.append(False)
                    continue
                place = aad(claimed.batch_id, claimed.tenant, b"result", claimed.line)
                done = await conn.execute(update(lines).where(
                    lines.c.batch_id == claimed.batch_id, lines.c.line == claimed.line,
                    lines.c.owner == owner, lines.c.state == "running",
                ).values(state="done", outcome=result.outcome, status_code=result.status_code,
                         result=self.seal(box, result.encode(), place)))  # fmt: skip
                kept.append(bool(done.rowcount))
        return kept

    async def release(self, owner: str, claimed: Sequence[ClaimedLine] | None = None) -> int:
        """Put ``owner``'s running lines (``claimed``, or all of them) back in the queue: they
        did not run (shed by admission, or this replica stops)."""
        where = [lines.c.owner == owner, lines.c.state == "running"]
        async with self._engine.begin() as conn:
            if claimed is None:
                result = await conn.execute(
                    update(lines).where(*where).values(state="queued", owner=None, lease_until=0.0)
                )
                return int(result.rowcount or 0)
            released = 0
            for c in claimed:
                result = await conn.execute(
                    update(lines)
                    .where(
                        *where,
                        lines.c.batch_id == c.batch_id,
                        lines.c.line == c.line,
                    )
                    .values(
                        state="queued", owner=None, lease_until=0.0, attempts=lines.c.attempts - 1
                    )
                )
                released += int(result.rowcount or 0)
        return released

    # -- stopping and ending -----------------------------------------------------------------

    async def cancel(self, tenant: str, batch_id: str, api: Api) -> Batch | None:
        """Ask the batch to stop: its queued lines end ``canceled`` now, its running lines as
        they end; ``None`` when there is no such batch."""
        now = self._clock()
        async with self._engine.begin() as conn:
            moved = await conn.execute(
                update(batches)
                .where(
                    batches.c.id == batch_id,
                    batches.c.tenant == tenant,
                    batches.c.api == api,
                    batches.c.status == "in_progress",
                )
                .values(status="cancelling", cancel_at=now)
            )
            if moved.rowcount:
                await self._stop_queued(conn, batch_id, "canceled")
        return await self.load(tenant, batch_id, api)

    @staticmethod
    async def _stop_queued(conn: AsyncConnection, batch_id: str, outcome: Outcome) -> None:
        await conn.execute(
            update(lines)
            .where(
                lines.c.batch_id == batch_id,
                lines.c.state == "queued",
            )
            .values(state="done", outcome=outcome)
        )

    async def expire(self) -> list[str]:
        """Batches past their window: their queued lines end ``expired``; the ids."""
        now = self._clock()
        async with self._engine.connect() as conn:
            due = (
                (
                    await conn.execute(
                        select(batches.c.id).where(
                            batches.c.status == "in_progress",
                            batches.c.expires_at <= now,
                        )
                    )
                )
                .scalars()
                .all()
            )
        for batch_id in due:
            async with self._engine.begin() as conn:
                await self._stop_queued(conn, batch_id, "expired")
        return list(due)

    async def unfinished(self) -> list[tuple[str, str, str]]:
        """Active batches with no line left open: (id, tenant, api), for ``finalize``."""
        open_lines = (
            select(lines.c.batch_id)
            .where(lines.c.batch_id == batches.c.id, lines.c.state.in_(OPEN))
            .exists()
        )
        async with self._engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(batches.c.id, batches.c.tenant, batches.c.api).where(
                        batches.c.status.in_(ACTIVE), ~open_lines
                    )
                )
            ).all()
        return [(row.id, row.tenant, row.api) for row in rows]

    async def finalize(self, tenant: str, batch_id: str, api: Api, render: Render) -> bool:
        """End the batch if no line is open: its final status and (OpenAI's) files, in one
        transaction; whether this call ended it."""
        batch = await self.load(tenant, batch_id, api)
        if batch is None or batch.status not in ACTIVE or batch.counts.processing:
            return False
        results = await self.results(batch)
        output, errors = render(batch, results) if api == "openai" else (None, None)
        now = self._clock()
        status = (
            "cancelled"
            if batch.status == "cancelling"
            else "expired"
            if batch.counts.expired  # some line did not run in time; all did: completed
            else "completed"
        )
        made: list[dict[str, Any]] = []
        ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        for name, content, column in (
            (f"{batch_id}_output.jsonl", output, "output_file_id"),
            (f"{batch_id}_error.jsonl", errors, "error_file_id"),
        ):
            if content is not None:
                stored, row = await self.files.rows(
                    tenant, batch.key_id, "batch_output", name, content
                )
                made.append(row)
                ids[column] = stored.id
        open_lines = (
            select(lines.c.batch_id)
            .where(lines.c.batch_id == batch_id, lines.c.state.in_(OPEN))
            .exists()
        )
        async with self._engine.begin() as conn:
            ended = await conn.execute(
                update(batches)
                .where(
                    batches.c.id == batch_id,
                    batches.c.status.in_(ACTIVE),
                    ~open_lines,
                )
                .values(status=status, ended_at=now, **ids)
            )
            if not ended.rowcount:
                return False  # another replica ended it, or a line reopened
            for row in made:
                await conn.execute(files.insert().values(**row))
        return True

    async def delete(self, tenant: str, batch_id: str, api: Api) -> bool:
        async with self._engine.begin() as conn:
            gone = await conn.execute(
                delete(batches).where(
                    batches.c.id == batch_id, batches.c.tenant == tenant, batches.c.api == api
                )
            )
            await conn.execute(
                delete(lines).where(lines.c.batch_id == batch_id, lines.c.tenant == tenant)
            )
        self._boxes.pop(batch_id, None)
        return bool(gone.rowcount)

    async def oldest_active(self) -> float | None:
        """When the oldest active batch was made (every replica's); ``None``: there is none,
        and so no line open either (a batch ends only once none of its lines is open)."""
        async with self._engine.connect() as conn:
            oldest = (await conn.execute(_OLDEST_ACTIVE)).scalar()
        return None if oldest is None else float(oldest)

    async def open_lines(self) -> tuple[int, int]:
        """Lines queued and running (every replica's)."""
        async with self._engine.connect() as conn:
            rows = (await conn.execute(_OPEN_LINES)).all()
        states = {state: count for state, count in rows}
        return int(states.get("queued", 0)), int(states.get("running", 0))

    async def purge_forever(self, every_s: float = EVERY_S) -> None:
        await purge_forever(self.purge, "batches", every_s)

    async def purge(self) -> int:
        """Delete the batches past retention, with their lines."""
        now = self._clock()
        async with self._engine.begin() as conn:
            gone = select(batches.c.id).where(batches.c.purge_at <= now)
            await conn.execute(delete(lines).where(lines.c.batch_id.in_(gone)))
            result = await conn.execute(delete(batches).where(batches.c.purge_at <= now))
        return int(result.rowcount or 0)
