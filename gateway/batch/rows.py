"""What the batch store keeps and hands out: its two tables (``gateway_batches``,
``gateway_batch_lines``), a batch as it stands, a claimed line, a line's result, and how a
sealed value is bound to its place (``gateway.batch.store`` has the rules)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from sqlalchemy import Column, Float, Index, Integer, LargeBinary, String, Table

from gateway.batch.lines import BatchLine
from gateway.db import metadata

Api = Literal["openai", "anthropic"]
Outcome = Literal["succeeded", "errored", "canceled", "expired"]
ACTIVE = ("in_progress", "cancelling")
ENDED = ("completed", "expired", "cancelled", "failed")
OPEN = ("queued", "running")  # a line's states before it ends (indexed: never "!= done")
WINDOW_S = 24 * 3600.0  # the completion window both APIs have

batches = Table(
    "gateway_batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("key_id", String(32), nullable=False),
    Column("api", String(16), nullable=False),
    Column("endpoint", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("total", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),  # the completion window's end
    Column("cancel_at", Float),
    Column("ended_at", Float),
    Column("input_file_id", String(64)),
    Column("output_file_id", String(64)),
    Column("error_file_id", String(64)),
    Column("purge_at", Float, nullable=False),
    Column("dek_id", String(64), nullable=False),
    Column("salt", LargeBinary, nullable=False),
    Column("sealed", LargeBinary, nullable=False),  # {"metadata": ...}
    Index("ix_gateway_batches_tenant", "tenant", "api", "created_at"),
    Index("ix_gateway_batches_status", "status", "expires_at"),
    Index("ix_gateway_batches_purge_at", "purge_at"),
)

lines = Table(
    "gateway_batch_lines",
    metadata,
    Column("batch_id", String(64), primary_key=True),
    Column("line", Integer, primary_key=True),
    Column("tenant", String(64), nullable=False),
    Column("state", String(8), nullable=False),
    Column("queued_at", Float, nullable=False),
    Column("owner", String(32)),
    Column("lease_until", Float, nullable=False, default=0.0),
    Column("attempts", Integer, nullable=False, default=0),
    Column("outcome", String(16)),
    Column("status_code", Integer),
    Column("request", LargeBinary, nullable=False),  # sealed
    Column("result", LargeBinary),  # sealed
    Index("ix_gateway_batch_lines_claim", "state", "queued_at"),
    Index("ix_gateway_batch_lines_owner", "owner", "state"),
    Index("ix_gateway_batch_lines_open", "batch_id", "state"),
    Index("ix_gateway_batch_lines_tenant", "tenant", "state"),
)


class LimitReached(Exception):
    """A tenant's batches in progress or queued lines are at their limit."""


@dataclass(frozen=True, slots=True)
class LineCounts:
    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch as it stands."""

    id: str
    tenant: str
    key_id: str
    api: Api
    endpoint: str
    status: str
    total: int
    created_at: float
    expires_at: float
    cancel_at: float | None
    ended_at: float | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    purge_at: float
    metadata: dict[str, Any] | None
    counts: LineCounts = field(default_factory=LineCounts)
    errors: list[dict[str, Any]] | None = None  # why its input could not make a batch


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    """A line this replica now runs."""

    batch_id: str
    line: int
    tenant: str
    key_id: str
    attempt: int  # 1 for a first run; more when a replica that ran it before was lost
    request: BatchLine


@dataclass(frozen=True, slots=True)
class LineResult:
    """A line's answer: the endpoint's status code and body, or the batch's own error
    (``canceled``, ``expired``: ``status_code`` None)."""

    line: int
    custom_id: str
    outcome: str
    status_code: int | None
    body: Any
    request_id: str | None

    def encode(self) -> bytes:
        return orjson.dumps(
            {"status_code": self.status_code, "body": self.body, "request_id": self.request_id}
        )


# What an OpenAI batch's end writes: (batch, its results) -> (output, error) file contents
Render = Callable[[Batch, list[LineResult]], tuple[bytes | None, bytes | None]]


def aad(batch_id: str, tenant: str, part: bytes, line: int | None = None) -> bytes:
    where = b"" if line is None else b"\0" + str(line).encode()
    return batch_id.encode() + b"\0" + tenant.encode() + b"\0" + part + where


def new_batch_id(api: Api) -> str:
    return ("msgbatch_" if api == "anthropic" else "batch_") + secrets.token_hex(12)


def batch_from_row(row: Any, sealed: dict[str, Any], counts: LineCounts) -> Batch:
    return Batch(
        row["id"],
        row["tenant"],
        row["key_id"],
        row["api"],
        row["endpoint"],
        row["status"],
        row["total"],
        row["created_at"],
        row["expires_at"],
        row["cancel_at"],
        row["ended_at"],
        row["input_file_id"],
        row["output_file_id"],
        row["error_file_id"],
        row["purge_at"],
        sealed.get("metadata"),
        counts,
        sealed.get("errors"),
    )
