"""Write-ahead intents: no answer without its record, even when the process dies (sans-I/O).

Before the first byte of a streamed answer reaches its client, the gateway makes the
exchange's **intent** durable: the facts a record's header would carry at that moment and the
sealed request (messages and parameters, under the tenant's data key and ``AUDIT_CAPTURE``,
exactly as a record seals them), through the ledger writer's group commit (or its spool while
the database is away). An intent is not a ledger leaf: it lives in ``ledger_intents`` until
the exchange's record takes its place. That record's commit deletes the intent in the same
transaction, so an exchange still has one leaf.

Each replica beats (``ledger_replicas.heartbeat_at``) about once a second, and in every
transaction that inserts intents, so an intent is never in the database without a beat at
least as new as it. When a replica dies (``kill -9``, a node lost), its intents stay; any
replica's sweep finds those whose owner has not beaten for ``stale_s``, **claims** each one
(an update of its owner from the dead replica to itself, so exactly one replica wins it and
its own beat now covers it) and appends the exchange's record with status ``replica_lost``:
the request, its start, first-token time and the tokens counted so far (``progress``, written
by the owner's beats), sealed like any record. Its commit deletes the intent, as an ordinary
record's does.

What is known, stated honestly: a replica presumed dead that was only cut off from the
database for longer than ``stale_s`` may still commit its own record after the sweep made a
``replica_lost`` one; the auditor then finds both under the request id, the real one after.

This module holds the intent's bytes (for the spool and the table) and its progress; the
writer (``audit.writer``), the commit script (``audit.commit``) and the ledger
(``audit.ledger``) move them.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from audit.record import Sealed

LOST = "replica_lost"  # the status of a record a sweep made from an intent


def new_intent_id() -> str:
    return f"int-{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class Intent:
    """One exchange's intent: ``sealed`` is a record-shaped header and the sealed request."""

    id: str
    owner: str  # the replica (ledger writer id) that runs the exchange
    tenant: str
    request_id: str
    created_at: float
    sealed: Sealed

    def row(self) -> tuple[Any, ...]:
        """In ``INTENT_COLUMNS``' order."""
        return (self.id, self.owner, self.tenant, self.request_id, self.created_at,
                self.sealed.header, self.sealed.ciphertext)  # fmt: skip

    def encode(self) -> bytes:
        """For the spool (its lines hold already sealed bytes only)."""
        return orjson.dumps({
            "id": self.id, "owner": self.owner, "tenant": self.tenant,
            "request_id": self.request_id, "created_at": self.created_at,
            "leaf": base64.b64encode(self.sealed.leaf_data()).decode("ascii"),
        })  # fmt: skip

    @classmethod
    def decode(cls, data: bytes) -> Intent:
        raw = orjson.loads(data)
        sealed = Sealed.from_leaf_data(base64.b64decode(raw["leaf"], validate=True))
        return cls(raw["id"], raw["owner"], raw["tenant"], raw["request_id"],
                   float(raw["created_at"]), sealed)  # fmt: skip


INTENT_COLUMNS = ("id", "owner", "tenant", "request_id", "created_at", "header", "ciphertext")


@dataclass(frozen=True, slots=True)
class Progress:
    """What the owner knew of a running exchange at its last beat."""

    upstream: str | None = None
    first_token_at: float | None = None
    prompt_tokens: int = 0  # the gateway's estimate (the engine reports it only at the end)
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    at: float | None = None  # when the owner last reported it

    def encode(self) -> str:
        return orjson.dumps({k: getattr(self, k) for k in Progress.__dataclass_fields__}).decode()

    @classmethod
    def decode(cls, text: str | None) -> Progress:
        if not text:
            return cls()
        try:
            raw = orjson.loads(text)
            return cls(**{k: raw.get(k) for k in Progress.__dataclass_fields__
                          if raw.get(k) is not None})  # fmt: skip
        except (orjson.JSONDecodeError, TypeError, AttributeError):
            return cls()  # a row a replica could not finish writing: what the intent says


@dataclass(frozen=True, slots=True)
class Beat:
    """A replica's heartbeat, written in the transaction it rides on."""

    replica: str
    at: float
    started_at: float


def cancel_pairs(intents: list[Intent], replaced: list[str]) -> tuple[list[Intent], list[str]]:
    """An intent whose record is in the same commit need not be written at all: both drop out
    (a quick exchange in one group commit, a spool replayed)."""
    done = set(replaced)
    both = {i.id for i in intents} & done
    if not both:
        return intents, replaced
    return [i for i in intents if i.id not in both], [r for r in replaced if r not in both]
