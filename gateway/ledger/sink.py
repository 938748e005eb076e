"""The audit ledger behind the gateway's ``RecordSink`` port, and opening it with its keys.

``LedgerSink`` turns a ``CompletionRecord`` into the ledger's header facts and body, trims the
body to ``AUDIT_CAPTURE``, and maps the ledger's failure to the gateway's error tree: with
``AUDIT_FAIL=closed`` a record that neither the database nor the spool can take fails the
request (503 ``ledger_unavailable``) and new requests are refused while that lasts; with
``open`` the loss is logged and the request goes on.

Key files: the gateway never invents production keys. ``--demo`` creates missing ones (with a
warning, under ``THINKGATE_HOME``, ``./var/`` by default); otherwise a missing file stops the
start with a message naming ``thinkgate ledger init`` and where it looked, because a key made
up at start-up and lost with the pod would make every record written under it unreadable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from audit import migrate as audit_migrate
from audit import store
from audit.crypto import FileKeyProvider, KeyFileError, ReloadingKeyProvider
from audit.datakeys import KeysUnavailable
from audit.ledger import Ledger
from audit.note import NoteSigner, create_signing_key, default_origin, load_signing_key
from audit.record import Body, Facts, captured
from audit.sqlasync import AsyncEngine
from audit.writer import WriterUnavailable
from gateway.ledger.intents import ProgressOf, Running
from gateway.ledger.record import CompletionRecord, request_fields
from gateway.ledger.translate import translate
from gateway.relay.guarding import GuardAct
from gateway.sections import LedgerSettings
from gateway.spend.prices import Prices

log = logging.getLogger("thinkgate")


class LedgerKeysMissing(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Intention:
    """An exchange's write-ahead intent, queued: its id (the record names it) and what
    resolves once it is as durable as ``AUDIT_MODE`` says."""

    id: str
    durable: asyncio.Future[None]


class LedgerSink:
    def __init__(
        self, ledger: Ledger, settings: LedgerSettings, prices: Prices | None = None
    ) -> None:
        self.ledger = ledger
        self._capture = settings.audit_capture
        self._prices = prices
        self._fail_open = settings.audit_fail == "open"
        # the exchanges whose intents wait for their records
        self.running = Running(grace_s=settings.background_stale_s)

    async def intend(self, record: CompletionRecord, progress: ProgressOf) -> Intention | None:
        """Seal and queue the exchange's write-ahead intent (``audit.intents``): ``record``
        is the exchange as it stands before its first token. Raises what ``submit`` would
        when its key cannot be had; ``None`` when the ledger fails open and failed."""
        facts = record_facts(record, self._capture, self._prices, intent=True)
        messages, params = request_fields(record)
        body = captured(Body(messages=messages, params=params), self._capture)
        try:
            try:
                intent_id, durable = await self.ledger.intend(facts, body)
            except orjson.JSONEncodeError:  # never expected (recordable): the header
                intent_id, durable = await self.ledger.intend(facts, Body())
        except (KeysUnavailable, KeyFileError) as exc:
            if self._fail_open:
                log.error("intent lost (request %s): %s", record.request_id, type(exc).__name__)
                return None
            raise translate(exc) from None
        self.running.add(intent_id, progress)
        return Intention(intent_id, durable)

    async def confirm(self, intention: Intention | None) -> None:
        """Return once the intent is durable; ``ledger_unavailable`` (503) when neither the
        database nor the spool took it (logged only when the ledger fails open)."""
        if intention is None:
            return
        try:
            await self.ledger.confirm(intention.durable)
        except WriterUnavailable as exc:
            if not self._fail_open:
                raise translate(exc) from None
            log.error("intent lost (request %s): ledger unavailable", intention.id)

    def accepting(self) -> bool:
        return self._fail_open or self.ledger.accepting()

    async def prepare(self, tenant: str) -> None:
        """Before the engine is asked: the tenant's data key can be had (cached for a second),
        so a completion is never generated and then lost for want of a key to seal it."""
        if self._fail_open:
            return
        try:
            await self.ledger.keys.for_sealing(tenant)
        except (KeysUnavailable, KeyFileError) as exc:
            raise translate(exc) from None

    async def submit(self, record: CompletionRecord) -> None:
        try:
            await self._submit(record)
        finally:
            if record.intent is not None:
                self.running.discard(record.intent)

    async def _submit(self, record: CompletionRecord) -> None:
        try:
            await self._append(record)
        except KeysUnavailable as exc:
            if not self._fail_open:
                raise translate(exc) from None
            log.error("audit record lost (request %s): ledger keys unavailable", record.request_id)
        except WriterUnavailable as exc:
            if not self._fail_open:
                raise translate(exc) from None
            log.error("audit record lost (request %s): ledger unavailable", record.request_id)

    async def _append(self, record: CompletionRecord) -> None:
        facts, replaces = record_facts(record, self._capture, self._prices), record.intent
        try:
            await self.ledger.append(facts, captured(record_body(record), self._capture),
                                     replaces=replaces)  # fmt: skip
        except orjson.JSONEncodeError:
            # Never expected (``recordable`` ran before the engine was asked), and never
            # a reason to lose the record: its header, without the body, saying why.
            log.error("audit record of request %s kept without its body: it cannot be encoded",
                      record.request_id)  # fmt: skip
            unencodable = dataclasses.replace(facts, error_code="record_body_unencodable")
            await self.ledger.append(unencodable, Body(), replaces=replaces)


def record_facts(record: CompletionRecord, capture: Any, prices: Prices | None = None,
                 intent: bool = False) -> Facts:  # fmt: skip
    """The record's header facts; with ``prices``, its cost (a model they do not price, served
    under ``UNPRICED_MODELS=allow``, has none). ``intent``: those of the exchange's write-ahead
    intent (status ``started``, made when it started, not ended)."""
    amount = None if prices is None else prices.cost(record.model, record.usage)
    cost = None if amount is None or prices is None else {
        "amount": f"{amount:f}", "currency": prices.currency, "prices": prices.digest}  # fmt: skip
    return Facts(
        kind="completion",
        tenant=record.tenant,
        key_id=record.key_id,
        request_id=record.request_id,
        created_at=record.started_at if intent else record.ended_at,
        model=record.model,
        status="started" if intent else record.status,
        upstream=record.upstream,
        stream=record.stream,
        started_at=record.started_at,
        first_token_at=record.first_token_at,
        ended_at=None if intent else record.ended_at,
        usage=record.usage,
        finish_reasons=record.finish_reasons,
        error_code=record.error_code,
        client_disconnected=record.client_disconnected,
        capture=capture,
        traceparent=record.traceparent,
        reasoning_format=record.reasoning_format,
        endpoint=record.endpoint,
        thinking=None if record.thinking else False,
        guardrails=tuple(sorted({f"{a.policy}:{a.action}" for _, a in record.guardrails}))
        or None,
        batch=None if record.batch is None else {"id": record.batch[0],
                                                 "custom_id": record.batch[1]},
        cost=cost,
    )  # fmt: skip


def record_body(record: CompletionRecord) -> Body:
    messages, params = request_fields(record)
    return Body(
        messages=messages,
        params=params,
        reasoning=record.reasoning,
        content=record.content,
        tool_calls=record.tool_calls,
        guardrails=guardrail_body(record.guardrails) if record.guardrails else None,
    )


def guardrail_body(acts: tuple[tuple[int | None, GuardAct], ...]) -> dict[str, Any]:
    """The record's account of its guardrail acts: each matched value as HMAC-SHA256 under a
    key of this record's own (sealed with it, shredded with it), so an auditor who holds a
    value can show it was there, and nobody learns it from the record (docs/guardrails.md)."""
    key = secrets.token_bytes(32)
    return {"hash_key": key.hex(), "acts": [
        {"choice": choice, "policy": a.policy, "action": a.action, "channel": a.channel,
         "detector": a.detector,
         "hmac": hmac.new(key, a.value.encode(), hashlib.sha256).hexdigest()}
        for choice, a in acts
    ]}  # fmt: skip


KEY_FILES = {"ledger_key_file": FileKeyProvider.create, "signing_key_file": create_signing_key}


def ensure_keys(
    settings: LedgerSettings, *, create: bool, names: tuple[str, ...] = tuple(KEY_FILES)
) -> list[str]:
    """Create the missing key files (``names``: settings of ``KEY_FILES``) when ``create``;
    else refuse to start without them. Returns the files created."""
    made = []
    for name in names:
        maker = KEY_FILES[name]
        path: Path = getattr(settings, name)
        if path.exists():
            continue
        if not create:
            raise LedgerKeysMissing(
                f"ledger key file {path} is missing: run 'thinkgate ledger init' once "
                f"(or mount the keys from your secret store; to look elsewhere, "
                f"{settings.file_hint(name)})"
            )
        maker(path)
        made.append(str(path))
    return made


async def log_origin(settings: LedgerSettings, engine: AsyncEngine) -> str:
    """The log's name: ``AUDIT_ORIGIN`` if set; else the origin its stored checkpoints carry
    (a log keeps its name); else, for a new log, the one its signing key implies
    (``audit.note.default_origin``): unique per deployment, the same on every replica."""
    if settings.audit_origin:
        return settings.audit_origin
    await audit_migrate.upgrade(engine)
    async with engine.connect() as conn:
        first = await store.first_checkpoint(conn)
    if first is not None:
        return first.split("\n", 1)[0]
    return default_origin(load_signing_key(settings.signing_key_file))


async def open_ledger(settings: LedgerSettings, engine: AsyncEngine,
                      wall: Callable[[], float] = time.time) -> Ledger:  # fmt: skip
    """The ledger the settings name; ``wall``: the clock whose UTC day a record's key is (a
    test seeds records of days past with it)."""
    origin = await log_origin(settings, engine)
    provider = ReloadingKeyProvider(settings.ledger_key_file)
    signer = NoteSigner(origin, load_signing_key(settings.signing_key_file))
    return await Ledger.open(
        engine,
        provider,
        signer,
        origin=origin,
        spool_path=settings.audit_spool_file,
        mode=settings.audit_mode,
        max_batch=settings.audit_batch_max,
        checkpoint_interval_s=settings.checkpoint_interval_ms / 1000,
        wall=wall,
    )
