"""What one ledger record is, and its canonical bytes (sans-I/O).

A record is a **header** (canonical JSON, readable without any key: who, what, when, how it
ended; never prompt, reasoning or answer text) and a **ciphertext** of the **body** (the request
messages and parameters, the reasoning trace and the answer, as JSON), sealed under a
per-record key with the header as associated data (``audit.crypto``).

Rules:

- The header is encoded once, here, with sorted keys and no whitespace (orjson), and its bytes
  are stored as they are: nobody re-encodes a header, so "canonical" needs no second encoder
  that could disagree. The searchable columns of the store are *derived* from those bytes.
- A record's identity is ``(writer, sequence)``: the gateway process that sealed it and that
  process's counter. It is fixed before the ledger index exists, which lets a record be sealed
  once and then go to the database or, while the database is away, to the spool, unchanged;
  replaying it twice is detected by that pair.
- The Merkle leaf is ``leaf_data = len(header) (4 bytes, big-endian) || header || ciphertext``:
  length-prefixed so no two (header, ciphertext) pairs share a leaf, and over the ciphertext,
  never the plaintext, so destroying a tenant key (crypto-shredding) leaves every proof valid.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from audit.errors import AuditError

SCHEMA_VERSION = 1
MAX_HEADER_BYTES = 1 << 20

Kind = Literal["completion", "access", "shred", "hold", "release", "retention", "retention-set"]
Capture = Literal["full", "reasoning", "metadata"]


class RecordFormatError(AuditError, ValueError):
    """Bytes that are not a record this code wrote (corrupt spool line, tampered row)."""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0
    # counted by the gateway (the engine never reported it: the client left mid-stream);
    # in the header only when true
    counted: bool = False
    # of the prompt's tokens, those the engine found in its prefix cache (its own figure,
    # ``prompt_tokens_details.cached_tokens``); in the header only when some were
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Facts:
    """The header's content, minus what sealing adds (writer, sequence, salt, commitment)."""

    kind: Kind
    tenant: str
    key_id: str
    request_id: str
    created_at: float  # wall clock, seconds since the epoch
    model: str = ""
    status: str = "ok"
    upstream: str | None = None
    stream: bool = False
    started_at: float | None = None
    first_token_at: float | None = None
    ended_at: float | None = None
    usage: Usage | None = None
    finish_reasons: tuple[str | None, ...] = ()
    error_code: str | None = None
    client_disconnected: bool = False
    capture: Capture = "full"
    subject: int | None = None  # access records: the index that was read
    statement: str | None = None  # shred records: the signed note that orders the shredding
    # records management (audit.retention): what a hold, release or retention record did
    terms: dict[str, Any] | None = None
    traceparent: str | None = None  # completions: the caller's W3C trace context, if any
    reasoning_format: str | None = None  # completions: the format that split the answer
    thinking: bool | None = None  # completions: False when the request switched thinking off
    endpoint: str | None = None  # completions: the API it came through ("chat.completions")
    # completions: the guardrail policies that acted, as "policy:action" (never what matched)
    guardrails: tuple[str, ...] | None = None
    # completions: the batch a request was a line of, {"id", "custom_id"} (docs/batches.md)
    batch: dict[str, str] | None = None
    # completions: what it cost, {"amount": decimal string, "currency", "prices": the prices
    # file's digest}, from its usage and the prices in force (docs/spend.md)
    cost: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Body:
    """The encrypted part. Fields left ``None`` were not captured (``AUDIT_CAPTURE``)."""

    # a list and a dict; or as encoded already, keys sorted (``gateway.ledger.record``)
    messages: list[Any] | orjson.Fragment | None = None
    params: dict[str, Any] | orjson.Fragment | None = None
    reasoning: tuple[str, ...] | None = None
    content: tuple[str, ...] | None = None
    tool_calls: tuple[tuple[dict[str, str], ...], ...] | None = None  # per choice, if any
    # what guardrail policies did: {"hash_key": hex, "acts": [{choice, policy, action,
    # channel, detector, hmac}]}, each matched value as HMAC-SHA256 under the record's own key
    guardrails: dict[str, Any] | None = None

    def encode(self) -> bytes:
        return orjson.dumps(
            {k: v for k, v in _body_items(self) if v is not None}, option=orjson.OPT_SORT_KEYS
        )

    @classmethod
    def decode(cls, data: bytes) -> Body:
        raw = orjson.loads(data)
        return cls(
            messages=raw.get("messages"),
            params=raw.get("params"),
            reasoning=_tuple_or_none(raw.get("reasoning")),
            content=_tuple_or_none(raw.get("content")),
            tool_calls=_calls_or_none(raw.get("tool_calls")),
            guardrails=raw.get("guardrails"),
        )


def _body_items(body: Body) -> list[tuple[str, Any]]:
    return [
        ("messages", body.messages),
        ("params", body.params),
        ("reasoning", body.reasoning),
        ("content", body.content),
        ("tool_calls", body.tool_calls),
        ("guardrails", body.guardrails),
    ]


def _tuple_or_none(value: Any) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def _calls_or_none(value: Any) -> tuple[tuple[dict[str, str], ...], ...] | None:
    return None if value is None else tuple(tuple(calls) for calls in value)


def captured(body: Body, capture: Capture) -> Body:
    """What ``AUDIT_CAPTURE`` keeps: ``full`` everything; ``reasoning`` the trace and the answer
    (its tool calls included) but not the prompt (messages and parameters, where personal data
    usually sits); ``metadata`` nothing (the header alone is recorded, the ciphertext seals an
    empty body)."""
    if capture == "full":
        return body
    if capture == "reasoning":
        return Body(reasoning=body.reasoning, content=body.content, tool_calls=body.tool_calls,
                    guardrails=body.guardrails)  # fmt: skip
    return Body()


@dataclass(frozen=True, slots=True)
class Seal:
    """What sealing adds to the header."""

    origin: str
    writer: str
    sequence: int
    dek_id: str
    salt: bytes
    commitment: bytes


def encode_header(facts: Facts, seal: Seal) -> bytes:
    header: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "origin": seal.origin,
        "writer": seal.writer,
        "sequence": seal.sequence,
        "dek": seal.dek_id,
        "salt": _b64(seal.salt),
        "commitment": _b64(seal.commitment),
    }
    for name in Facts.__dataclass_fields__:
        value = getattr(facts, name)
        if value is not None:
            header[name] = _usage_dict(value) if isinstance(value, Usage) else value
    return orjson.dumps(header, option=orjson.OPT_SORT_KEYS)


def _usage_dict(usage: Usage) -> dict[str, int]:
    return {name: getattr(usage, name) for name in Usage.__dataclass_fields__
            if name not in _ONLY_WHEN_SET or getattr(usage, name)}  # fmt: skip


_ONLY_WHEN_SET = ("counted", "cached_tokens")


@dataclass(frozen=True, slots=True)
class Header:
    """A parsed header: the fields the store indexes and the key lookup needs."""

    kind: str
    tenant: str
    key_id: str
    request_id: str
    model: str
    status: str
    created_at: float
    writer: str
    sequence: int
    dek_id: str
    salt: bytes
    commitment: bytes
    fields: dict[str, Any] = field(repr=False, compare=False)


def index_columns(writer: str, sequence: int, facts: Facts) -> tuple[Any, ...]:
    """The columns the store indexes a record by, in ``ENTRY_COLUMNS``' order after ``idx``:
    what ``parse_header`` of its encoded header gives (``header_columns``)."""
    return (writer, sequence, facts.kind, facts.tenant, facts.key_id, facts.request_id,
            facts.model, facts.status, float(facts.created_at))  # fmt: skip


def header_columns(h: Header) -> tuple[Any, ...]:
    return (h.writer, h.sequence, h.kind, h.tenant, h.key_id, h.request_id, h.model, h.status,
            h.created_at)  # fmt: skip


def parse_header(data: bytes) -> Header:
    try:
        raw = orjson.loads(data)
        return Header(
            kind=_str(raw, "kind"),
            tenant=_str(raw, "tenant"),
            key_id=_str(raw, "key_id"),
            request_id=_str(raw, "request_id"),
            model=str(raw.get("model", "")),
            status=str(raw.get("status", "")),
            created_at=float(raw["created_at"]),
            writer=_str(raw, "writer"),
            sequence=int(raw["sequence"]),
            dek_id=_str(raw, "dek"),
            salt=base64.b64decode(raw["salt"], validate=True),
            commitment=base64.b64decode(raw["commitment"], validate=True),
            fields=raw,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise RecordFormatError("not a thinkgate ledger header") from None


def _str(raw: dict[str, Any], name: str) -> str:
    value = raw[name]
    if not isinstance(value, str):
        raise TypeError(name)
    return value


@dataclass(frozen=True, slots=True)
class Sealed:
    """A sealed record, ready for the spool or the store. ``columns``: the header's indexed
    columns (``index_columns``), kept by whoever sealed it so the store need not parse the
    header it just encoded; ``None`` for a record read back (``parse_header`` then)."""

    header: bytes
    ciphertext: bytes
    columns: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)
    # the write-ahead intent this record takes the place of (``audit.intents``): its commit
    # deletes that intent; not part of the record's bytes
    replaces: str | None = field(default=None, compare=False, repr=False)

    def leaf_data(self) -> bytes:
        return len(self.header).to_bytes(4, "big") + self.header + self.ciphertext

    @classmethod
    def from_leaf_data(cls, data: bytes) -> Sealed:
        if len(data) < 4:
            raise RecordFormatError("record too short")
        size = int.from_bytes(data[:4], "big")
        if size > min(MAX_HEADER_BYTES, len(data) - 4):
            raise RecordFormatError("record header length out of range")
        return cls(data[4 : 4 + size], data[4 + size :])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
