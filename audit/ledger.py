"""The ledger as the rest of thinkgate sees it: append, read, prove, shred.

``Ledger.open`` migrates the schema, loads the keys and starts the writer; ``append`` seals a
record (per-record key from the tenant's data key, header as associated data) and hands it to
the writer; the read side answers the auditor API and the CLI.

System records (``access``: an auditor read a record; ``shred``: a tenant's keys were destroyed)
carry everything in their header and seal an empty body under a throw-away key (``dek`` is
``"none"``): they must stay readable after any shredding and must not create tenant keys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Collection, Container, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError

from audit import crypto, intentstore, merkle, migrate, retention, schema, store, tiles
from audit.crypto import KeyProvider
from audit.datakeys import DataKeys
from audit.errors import AuditError
from audit.intents import LOST, Intent, Progress, new_intent_id
from audit.note import NoteSigner, parse_checkpoint
from audit.record import (
    Body,
    Facts,
    Kind,
    Seal,
    Sealed,
    Usage,
    encode_header,
    index_columns,
    parse_header,
)
from audit.sequencer import Sequencer
from audit.spool import claim
from audit.sqlasync import AsyncEngine
from audit.writer import LedgerWriter, Mode, WriterEvent, WriterStats

log = logging.getLogger("thinkgate.ledger")
NO_KEY = "none"
T = TypeVar("T")


class ProofUnavailable(AuditError, ValueError):
    """A proof was asked for sizes or an index the ledger does not (yet) have."""


@dataclass(frozen=True, slots=True)
class Listed:
    index: int
    header: dict[str, Any]
    leaf_hash: bytes


@dataclass(frozen=True, slots=True)
class Opened:
    """One record read back: ``body`` is ``None`` when its key was destroyed (or it has none)."""

    index: int
    header: dict[str, Any]
    leaf_hash: bytes
    body: Body | None
    destroyed: bool


@dataclass(frozen=True, slots=True)
class Inclusion:
    index: int
    tree_size: int
    leaf_hash: bytes
    hashes: list[bytes]


class LedgerReader:
    """The read side that needs no secret: listing, sealed records, checkpoints, proofs.
    ``ledger export`` and the verifiers use it alone; ``Ledger`` adds writing and decryption."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def find(self, where: store.Filter, limit: int) -> list[Listed]:
        async with self._engine.connect() as conn:
            rows = await store.find(conn, where, limit)
        return [Listed(i, parse_header(h).fields, leaf) for i, h, leaf in rows]

    async def last_index(self, where: store.Filter) -> int | None:
        """The largest index ``where`` matches, ``None`` if it matches none."""
        async with self._engine.connect() as conn:
            return await store.last_index(conn, where)

    async def sealed(self, index: int) -> Sealed:
        async with self._engine.connect() as conn:
            row = await store.entry(conn, index)
        if row is None:
            raise ProofUnavailable(f"the ledger has no record {index}")
        return Sealed(row[0], row[1])

    async def checkpoint(self, size: int | None = None) -> str | None:
        """The latest checkpoint (or the one of ``size``), with the witnesses' cosignature
        lines stored for it appended to its signatures."""
        async with self._engine.connect() as conn:
            if size is None:
                note = await store.latest_checkpoint(conn)
            else:
                note = await store.checkpoint_at(conn, size)
            return None if note is None else await _cosigned(conn, note)

    async def published(
        self, witnesses: Collection[str] = (), quorum: int = 0, stamped: bool = False
    ) -> str | None:
        """The newest checkpoint that carries cosignatures by ``quorum`` of ``witnesses`` and,
        if ``stamped``, a trusted timestamp, with its cosignatures; with neither asked, the
        latest checkpoint. ``None`` if none qualifies yet."""
        if not quorum and not stamped:
            return await self.checkpoint()
        async with self._engine.connect() as conn:
            note = await store.published_checkpoint(conn, witnesses, quorum, stamped)
            return None if note is None else await _cosigned(conn, note)

    async def timestamps(self, sizes: list[int]) -> dict[int, bytes]:
        """The stored RFC 3161 replies of those checkpoints (``audit.timestamps``)."""
        async with self._engine.connect() as conn:
            return await store.timestamp_replies(conn, sizes)

    async def all_timestamps(self) -> list[tuple[int, bytes, str]]:
        async with self._engine.connect() as conn:
            return await store.all_timestamps(conn)

    async def checkpoints(self, size: int, limit: int) -> list[tuple[int, float, str]]:
        """``(size, created_at, note)`` of stored checkpoints of ``size`` or more, smallest
        first (every commit stores one, so ``size`` itself is there unless it was never a
        tree size: a commit appended several records at once)."""
        async with self._engine.connect() as conn:
            found = await store.checkpoints_from(conn, size, limit)
            return [(s, at, await _cosigned(conn, note)) for s, at, note in found]

    async def add_timestamp(self, size: int, reply: bytes) -> None:
        """Keep a (checked) RFC 3161 reply for the checkpoint of ``size``; once per size."""
        row = {"size": size, "reply": reply, "created_at": time.time()}
        try:
            async with self._engine.begin() as conn:
                await conn.execute(schema.timestamps.insert().values(**row))
        except IntegrityError:
            pass

    async def add_cosignature(self, size: int, witness: str, line: str) -> None:
        """Keep a witness's (verified) cosignature of the checkpoint of ``size``; a second one
        by the same witness for that size is ignored."""
        row = {"size": size, "witness": witness, "line": line, "created_at": time.time()}
        try:
            async with self._engine.begin() as conn:
                await conn.execute(schema.cosignatures.insert().values(**row))
        except IntegrityError:
            pass

    async def tile(self, ref: tiles.TileRef) -> tuple[str, bytes] | None:
        """The latest checkpoint and ``ref``'s bytes, read in one transaction so that they
        agree; ``None`` if the log has no checkpoint yet or that tree lacks the tile.
        ``tiles.EntryTooLarge`` if an entry of a bundle does not fit the format."""
        async with self._engine.connect() as conn, conn.begin():
            note = await store.latest_checkpoint(conn)
            if note is None:
                return None
            size = parse_checkpoint(note.split("\n\n", 1)[0] + "\n").size
            if not ref.exists_in(size):
                return None
            if ref.level is None:
                data = tiles.bundle(await store.leaf_data(conn, ref.start, ref.width))
            else:
                found = await store.level_hashes(conn, ref.nodes_level(), ref.start, ref.width)
                if len(found) != ref.width:
                    return None
                data = b"".join(found)
        return note, data

    async def inclusion(self, index: int, tree_size: int) -> Inclusion:
        plan = _plan(lambda: merkle.inclusion_plan(index, tree_size))
        leaf = merkle.NodeID(0, index)
        async with self._engine.connect() as conn:  # one query, O(log n) primary-key reads
            found = await store.node_hashes(conn, {leaf, *merkle.plan_nodes(plan)})
            if len(found) < len(set(merkle.plan_nodes(plan)) | {leaf}):
                await self._check_size(conn, tree_size)  # say so, rather than a missing node
        # The leaf and its path cover the whole tree of ``tree_size``: a size beyond the
        # ledger lacks the node over its last leaf, so no separate size check is needed.
        if leaf not in found:
            raise ProofUnavailable(f"the ledger has no record {index}")
        return Inclusion(index, tree_size, found[leaf], _plan(lambda: merkle.assemble(plan, found)))

    async def consistency(self, first: int, second: int) -> list[bytes]:
        plan = _plan(lambda: merkle.consistency_plan(first, second))
        async with self._engine.connect() as conn:
            await self._check_size(conn, second)
            found = await store.node_hashes(conn, merkle.plan_nodes(plan))
        return merkle.assemble(plan, found)

    async def _check_size(self, conn: Any, size: int) -> None:
        current = await store.tree_size(conn)
        if size > current:
            raise ProofUnavailable(f"the ledger has {current} records, fewer than {size}")


async def _cosigned(conn: Any, note: str) -> str:
    size = parse_checkpoint(note.split("\n\n", 1)[0] + "\n").size
    return note + "".join(await store.cosignature_lines(conn, size))


class Ledger(LedgerReader):
    def __init__(
        self,
        engine: AsyncEngine,
        keys: DataKeys,
        signer: NoteSigner,
        writer: LedgerWriter,
        origin: str,
        writer_id: str | None = None,
    ) -> None:
        super().__init__(engine)
        self._keys = keys
        self._signer = signer
        self._writer = writer
        self.origin = origin
        # this process's records' writer, and the replica its intents and heartbeat name
        self.writer_id = writer_id or new_writer_id()
        self._sequence = itertools.count()

    @classmethod
    async def open(
        cls,
        engine: AsyncEngine,
        provider: KeyProvider,
        signer: NoteSigner,
        *,
        origin: str,
        spool_path: Path,
        mode: Mode = "strict",
        max_batch: int = 1024,
        retry_s: float = 1.0,
        checkpoint_interval_s: float = 0.0,
        wall: Callable[[], float] = time.time,
    ) -> Ledger:
        """``checkpoint_interval_s``: 0 signs a checkpoint per commit, else one per interval
        over everything committed in it (``audit.writer``)."""
        await migrate.upgrade(engine)
        keys = DataKeys(engine, provider, wall=wall)  # ``wall``: whose day a record's key is
        sequencer = Sequencer(engine, signer, origin, keys,
                              sign_each_commit=not checkpoint_interval_s)  # fmt: skip
        spool = claim(spool_path)  # this process's own file (several workers share a path)
        writer_id = new_writer_id()
        writer = LedgerWriter(
            sequencer, spool, keys, mode=mode, max_batch=max_batch, retry_s=retry_s,
            checkpoint_interval_s=checkpoint_interval_s, replica=writer_id,
        )  # fmt: skip
        writer.start()
        return cls(engine, keys, signer, writer, origin, writer_id)

    async def aclose(self) -> None:
        await self._writer.aclose()

    @property
    def keys(self) -> DataKeys:
        """The tenants' data keys (the gateway seals reasoning tokens with them too)."""
        return self._keys

    @property
    def stats(self) -> WriterStats:
        return self._writer.stats

    @property
    def listener(self) -> Callable[[WriterEvent], None] | None:
        return self._writer.listener

    @listener.setter
    def listener(self, listener: Callable[[WriterEvent], None] | None) -> None:
        self._writer.listener = listener

    @property
    def spool_pending(self) -> int:
        return self._writer.spool_pending

    def accepting(self) -> bool:
        """The writer takes records and the tenant keys can be opened (``DataKeys.healthy``;
        while not, the key file is looked at again, at most once a second)."""
        return self._writer.accepting() and (self._keys.healthy or self._keys.recover())

    def verifier_key(self) -> str:
        return self._signer.verifier_key()

    async def append(self, facts: Facts, body: Body, *, replaces: str | None = None) -> None:
        """Seal and submit; returns when the writer's mode says the record is safe.
        ``replaces``: the write-ahead intent this record takes the place of."""
        await self._writer.submit(await self.seal(facts, body, replaces=replaces))

    async def intend(self, facts: Facts, body: Body) -> tuple[str, asyncio.Future[None]]:
        """Seal an exchange's write-ahead intent (``audit.intents``) and put it aboard the
        writer's next commit, asked for at once: its id, and what ``confirm`` waits for. The
        exchange's record names the id (``append(..., replaces=...)``)."""
        sealed = await self.seal(facts, body)
        intent = Intent(new_intent_id(), self.writer_id, facts.tenant, facts.request_id,
                        facts.created_at, sealed)  # fmt: skip
        return intent.id, self._writer.ride(intent)

    async def confirm(self, durable: asyncio.Future[None]) -> None:
        """Return once an intent ``intend`` queued is as safe as the mode says."""
        self._writer.hurry(durable)
        await durable

    @property
    def beaten_at(self) -> float:
        """When (wall clock) a beat of this replica's last reached the database, by ``beat``
        or riding a commit of intents; -inf before the first."""
        return self._writer.beaten_at

    async def beat(self, progress: Mapping[str, Progress] | None = None) -> None:
        """This replica's heartbeat, with its running exchanges' progress by intent id."""
        beat = self._writer.beat()
        await intentstore.beat(self._engine, beat, progress or {})
        self._writer.beaten(beat.at)

    async def recover_lost(self, stale_s: float, running: Container[str] = (),
                           now: float | None = None) -> list[str]:  # fmt: skip
        """Append a ``replica_lost`` record for every intent whose owner has not beaten for
        ``stale_s`` (or this replica's own that no ``running`` exchange holds and that is as
        old), each claimed first so exactly one replica writes it; the request ids."""
        cutoff = (time.time() if now is None else now) - stale_s
        done = []
        for intent_id, owner in await intentstore.lost(self._engine, self.writer_id, cutoff,
                                                       running):  # fmt: skip
            claimed = await intentstore.claim(self._engine, self._writer.beat(), intent_id,
                                              owner, cutoff)  # fmt: skip
            if claimed is None:
                continue
            facts, body = await self._lost_record(claimed)
            # durable before the next claim, whatever the mode: an intent of this replica's
            # whose record is only queued would look lost again to the next sweep
            sealed = await self.seal(facts, body, replaces=claimed.id)
            await (await self._writer.enqueue(sealed, durable=True))
            done.append(claimed.request_id)
        if done:
            await intentstore.forget_replicas(self._engine, cutoff)
        return done

    async def _lost_record(self, claimed: intentstore.Claimed) -> tuple[Facts, Body]:
        """The record of an exchange whose replica died: the intent's facts, status
        ``replica_lost``, what its last beat knew; its sealed request opened (an empty body
        when the tenant's key was destroyed meanwhile)."""
        header = parse_header(claimed.sealed.header)
        progress = claimed.progress
        body = Body()
        dek = None if header.dek_id == NO_KEY else await self._keys.opening(header.dek_id)
        if dek is not None:
            try:
                plain = crypto.unseal(dek, header.salt, header.commitment,
                                      claimed.sealed.header, claimed.sealed.ciphertext)  # fmt: skip
            except crypto.DecryptionError:  # never the sweep's end: the header is recorded
                log.error("the intent of request %s cannot be opened: recorded without its "
                          "request", claimed.request_id)  # fmt: skip
            else:
                body = Body.decode(plain)
        return lost_facts(header.fields, progress, claimed.created_at), body

    async def seal(self, facts: Facts, body: Body, *, replaces: str | None = None) -> Sealed:
        if facts.kind == "completion":
            dek_id, dek = await self._keys.for_sealing(facts.tenant, facts.created_at)
        else:
            dek_id, dek = NO_KEY, crypto.new_data_key()
        plain = body.encode()  # first: a body that cannot be encoded takes no sequence number
        key = crypto.record_key(dek)
        seal = Seal(self.origin, self.writer_id, next(self._sequence), dek_id, key.salt,
                    key.commitment)  # fmt: skip
        header = encode_header(facts, seal)
        columns = index_columns(seal.writer, seal.sequence, facts)
        return Sealed(header, crypto.seal(key, plain, header), columns, replaces)

    async def read(self, index: int) -> Opened | None:
        async with self._engine.connect() as conn:
            row = await store.entry(conn, index)
        if row is None:
            return None
        header_bytes, ciphertext, leaf = row
        header = parse_header(header_bytes)
        dek = None if header.dek_id == NO_KEY else await self._keys.opening(header.dek_id)
        if dek is None:
            return Opened(index, header.fields, leaf, None, header.dek_id != NO_KEY)
        plain = crypto.unseal(dek, header.salt, header.commitment, header_bytes, ciphertext)
        return Opened(index, header.fields, leaf, Body.decode(plain), False)

    async def shred(self, tenant: str) -> int:
        """Destroy every data key of ``tenant`` and append the signed shred record;
        ``ShredBlocked`` naming the holds while a legal hold is in force for it."""
        async with self._engine.connect() as conn:
            held = (await retention.read_register(conn, tenant)).active(tenant)
        if held:
            raise retention.ShredBlocked(tenant, held)
        now = time.time()
        destroyed = await self._keys.shred(tenant, now)
        statement = self._signer.sign(f"thinkgate shred\n{self.origin}\n{tenant}\n{int(now)}\n")
        facts = Facts(
            kind="shred", tenant=tenant, key_id="operator", request_id=f"shred-{int(now)}",
            created_at=now, status="ok", statement=statement,
        )  # fmt: skip
        await self.append(facts, Body())
        return destroyed

    async def rotate_keys(self) -> int:
        return await self._keys.rewrap_all()

    # -- records management (audit.retention) ------------------------------------------------

    async def register(self, tenant: str | None = None) -> retention.Register:
        """The holds and retention settings in force (of ``tenant``, or of all)."""
        async with self._engine.connect() as conn:
            return await retention.read_register(conn, tenant)

    async def _act(self, kind: Kind, tenant: str, terms: dict[str, Any], now: float,
                   request_id: str) -> None:  # fmt: skip
        """Append a records-management record and return once it is **in the database**
        (what every replica reads the holds from), whatever ``AUDIT_MODE`` says: a hold that
        is only spooled or queued is not yet in force, so this waits (a bounded while) and
        raises ``RecordsNotInForce`` rather than report it placed."""
        signed = self._signer.sign(retention.statement(kind, self.origin, tenant, terms, now))
        await self.append(Facts(kind=kind, tenant=tenant, key_id="operator",
                                request_id=request_id, created_at=now, status="ok",
                                statement=signed, terms=terms), Body())  # fmt: skip
        where = store.Filter(request_id=request_id, kind=kind)
        deadline = time.monotonic() + COMMIT_WAIT_S
        while not await self.find(where, 1):
            if time.monotonic() > deadline:
                raise retention.RecordsNotInForce(
                    f"the {kind} record {request_id} is not in the database yet (it is "
                    "spooled or queued): it is in force once committed; check before relying "
                    "on it")  # fmt: skip
            await asyncio.sleep(0.05)  # the writer's commit, another task: polled, bounded

    async def place_hold(self, tenant: str, reason: str, *, key_id: str | None = None,
                         since: float | None = None, until: float | None = None,
                         now: float | None = None) -> retention.Hold:  # fmt: skip
        """A legal hold, in force once its signed record is in the ledger."""
        when = time.time() if now is None else now
        hold = retention.new_hold(tenant, reason, key_id, since, until, when)
        await self._act("hold", tenant, hold.terms(), when, hold.id)
        return hold

    async def release_hold(self, hold_id: str, reason: str = "",
                           now: float | None = None) -> retention.Hold:  # fmt: skip
        """Release a hold in force (``HoldNotFound`` otherwise) with a signed record."""
        retention.check_reason(reason)
        held = {h.id: h for h in (await self.register()).active()}
        if hold_id not in held:
            raise retention.HoldNotFound(f"no hold {hold_id!r} is in force")
        when = time.time() if now is None else now
        hold = held[hold_id]
        await self._act("release", hold.tenant, {"hold": hold_id, "reason": reason}, when,
                        f"release-{hold_id}")  # fmt: skip
        return retention.Hold(hold.id, hold.tenant, hold.reason, hold.placed_at, hold.key_id,
                              hold.since, hold.until, when)  # fmt: skip

    async def set_retention(self, tenant: str, days: int | None,
                            now: float | None = None) -> None:  # fmt: skip
        """A tenant's retention in days (``None``: kept forever), with a signed record."""
        if days is not None and days < 1:
            raise ValueError("retention is at least one day")
        when = time.time() if now is None else now
        await self._act("retention-set", tenant, {"days": days}, when,
                        f"retention-set-{int(when)}")  # fmt: skip

    async def apply_retention(self, default_days: int | None,
                              now: float | None = None) -> list[retention.Expiry]:  # fmt: skip
        """One retention run: every tenant's data keys of the days past its retention are
        destroyed unless held; each tenant where this run destroyed any gets a signed
        ``retention`` record naming the days. Replicas may run it at once: a key is
        destroyed (and counted) by one of them."""
        when = time.time() if now is None else now
        async with self._engine.connect() as conn:
            register = await retention.read_register(conn)
            tenants = await retention.tenants_with_keys(conn)
            plans = []
            for tenant in tenants:
                days = register.days(tenant, default_days)
                if days is not None:
                    plans.append(await retention.expiring(conn, tenant, days, when,
                                                          register.active(tenant)))  # fmt: skip
        done = []
        for plan in plans:
            if not plan.dek_ids:
                continue
            # the holds read again right before destroying: one placed during the run counts
            async with self._engine.connect() as conn:
                held = (await retention.read_register(conn, plan.tenant)).active(plan.tenant)
                plan = await retention.expiring(conn, plan.tenant, plan.days, when, held)
            destroyed = await self._keys.destroy(plan.dek_ids, when) if plan.dek_ids else []
            if not destroyed:
                continue
            gone = set(destroyed)
            periods = sorted({p for d, p in zip(plan.dek_ids, plan.dek_periods, strict=True)
                              if d in gone})  # fmt: skip
            run = dataclasses.replace(plan, dek_ids=tuple(destroyed), periods=tuple(periods))
            terms = {"days": run.days, "before": run.before, "periods": list(run.periods),
                     "keys": len(destroyed), "kept_by": list(run.kept_by)}  # fmt: skip
            await self._act("retention", run.tenant, terms, when, f"retention-{int(when)}")
            done.append(run)
        return done


COMMIT_WAIT_S = 5.0  # how long a records-management act waits for its record's commit


def new_writer_id() -> str:
    return f"w-{secrets.token_hex(8)}"


# the intent's header fields a ``replica_lost`` record keeps (the rest is what sealing adds)
_KEPT = ("tenant", "key_id", "request_id", "model", "upstream", "stream", "started_at",
         "capture", "traceparent", "reasoning_format", "thinking", "endpoint", "batch")  # fmt: skip


def lost_facts(intent: dict[str, Any], progress: Progress, created_at: float) -> Facts:
    """A ``replica_lost`` record's header facts: the intent's, and what the owner's last beat
    said (upstream, first token, tokens counted so far). Its time is the last one known."""
    kept = {k: intent[k] for k in _KEPT if intent.get(k) is not None}
    if progress.upstream:
        kept["upstream"] = progress.upstream
    prompt, tokens = progress.prompt_tokens, progress.completion_tokens
    usage = Usage(prompt, tokens, min(progress.reasoning_tokens, tokens), prompt + tokens,
                  counted=True)  # fmt: skip
    last = progress.at or created_at
    return Facts(kind="completion", created_at=last, status=LOST, error_code=LOST,
                 first_token_at=progress.first_token_at, usage=usage, **kept)  # fmt: skip


def _plan(make: Callable[[], list[T]]) -> list[T]:
    """``make()``, with the Merkle module's misuse error as the ledger's ``ProofUnavailable``."""
    try:
        return make()
    except merkle.ProofError as exc:
        raise ProofUnavailable(str(exc)) from None
