"""Ledger records as OCSF API Activity events (class 6003), from their headers alone (sans-I/O).

Rules:

- **Metadata, never content.** An event is made from the record's *header* (who, what, when,
  how it ended: ``audit.record``), which by design holds no prompt, reasoning or answer text,
  and from the row's integrity fields. The ciphertext is never read, let alone opened.
- **Every header field lands somewhere**, so a field added to the header later reaches the SIEM
  without a change here: the fields in ``MAPPED`` go to their OCSF attributes (table in
  docs/siem.md); the sealing parameters in ``HIDDEN`` (data key id, salt, key commitment: of no
  use to an analyst) are left out; every other field goes to ``unmapped`` under its own name,
  as OCSF prescribes for source attributes the class has no place for. Times are epoch
  milliseconds everywhere (OCSF ``timestamp_t``), ``*_at`` fields in ``unmapped`` included.
- **Activity** (``activity_id``): a completion is *Create* (1): every API it comes through
  names the call "create" (chat completion, response, message, embeddings); an auditor's
  decrypting read is *Read* (2); a shred and a retention run destroy keys, *Delete* (4); a
  legal hold placed is *Create*, released *Delete*, a retention setting changed
  (``retention-set``) *Update* (3); any other kind is *Other* (99) with the kind as
  ``activity_name``. ``unmapped.kind`` keeps the kind itself, since kinds share activities.
- **Severity**: Informational for completions, Low for an auditor's read (personal data was
  decrypted), for a failed completion (``error``, ``upstream_error``) and for a hold placed;
  Medium for what lets data go (shred, retention run, hold released, retention changed);
  High for an unreadable row.
- **Status**: ``ok`` is Success (1), any other recorded status Failure (2), none Unknown (0);
  ``status_code`` is the record's status word and ``status_detail`` its error code.
- **Integrity** (``unmapped.integrity``): the Merkle leaf index and leaf hash (hex) of the
  record and the checkpoint (tree size, root hash hex, the log's origin) the export read it
  under, which includes it (``leaf_index < tree_size``): ``GET /audit/v1/proof/inclusion?index=
  &tree_size=`` proves it. ``metadata.sequence`` repeats the leaf index, ``metadata.uid`` is the
  record's identity ``writer:sequence``, so a SIEM can drop the duplicates at-least-once
  delivery may bring.
- **Deterministic**: the same row and checkpoint give the same bytes (sorted keys), so a
  duplicate is byte for byte the first copy.
- A header that does not parse (a tampered row) still becomes an event, *Other*
  ``Unreadable`` at severity High with its integrity fields: skipping it would hide the one
  record an analyst most needs to see, and stopping on it would stop the export for good.
- ``src_endpoint`` is required by the class but the ledger keeps no client address (an IP
  address is personal data; DESIGN §6): it is the placeholder ``{"name": "unrecorded"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

OCSF_VERSION: Final = "1.5.0"  # the schema the events are validated against (tests)
CLASS_UID, CLASS_NAME = 6003, "API Activity"
CATEGORY_UID, CATEGORY_NAME = 6, "Application Activity"
PRODUCT: Final = {"name": "thinkgate", "vendor_name": "thinkgate"}
SERVICE: Final = {"name": "thinkgate"}
SRC_ENDPOINT: Final = {"name": "unrecorded"}

ACTIVITIES: Final = {
    "completion": (1, "Create"),
    "access": (2, "Read"),
    "shred": (4, "Delete"),
    "retention": (4, "Delete"),
    "hold": (1, "Create"),
    "release": (4, "Delete"),
    "retention-set": (3, "Update"),
}
OTHER = 99
SEVERITIES: Final = {0: "Unknown", 1: "Informational", 2: "Low", 3: "Medium", 4: "High",
                     5: "Critical", 6: "Fatal", 99: "Other"}  # fmt: skip
# Reading a record's plaintext is an access to personal data; destroying keys is irreversible.
KIND_SEVERITY: Final = {"completion": 1, "access": 2, "shred": 3, "retention": 3, "hold": 2,
                        "release": 3, "retention-set": 3}  # fmt: skip
FAILED_SEVERITY = 2  # a completion that failed on the gateway's or an engine's side
FAILURES: Final = frozenset({"error", "upstream_error", "replica_lost"})
UNREADABLE_SEVERITY = 4

MAPPED: Final = frozenset({"v", "origin", "writer", "sequence", "tenant", "key_id", "request_id",
                           "created_at", "started_at", "ended_at", "status", "error_code",
                           "endpoint", "traceparent"})  # fmt: skip
HIDDEN: Final = frozenset({"dek", "salt", "commitment"})


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One ``ledger_entries`` row, as far as the export reads it (never the ciphertext)."""

    index: int
    header: bytes  # the canonical header JSON, as stored
    leaf_hash: bytes


@dataclass(frozen=True, slots=True)
class TreeHead:
    """The checkpoint an export round read under: its tree size and root hash."""

    size: int
    root: bytes


@dataclass(frozen=True, slots=True)
class OcsfEvent:
    """One event, encoded, with what the envelopes need (syslog severity, HEC time)."""

    index: int
    time_ms: int
    severity_id: int
    kind: str
    json: bytes


def event(row: LedgerRow, head: TreeHead) -> OcsfEvent:
    """The OCSF event of ``row``, read under the checkpoint ``head`` (``row.index < head.size``)."""
    header = _parse(row.header)
    body = _unreadable(row) if header is None else _readable(header)
    origin = header.get("origin") if header else None
    body["unmapped"]["integrity"] = _integrity(row, head, origin)
    body["metadata"]["sequence"] = row.index
    encoded = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    kind = str(body["unmapped"].get("kind", "unreadable"))
    return OcsfEvent(row.index, body["time"], body["severity_id"], kind, encoded)


def _parse(header: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(header)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _readable(h: dict[str, Any]) -> dict[str, Any]:
    kind = str(h.get("kind", ""))
    activity_id, activity_name = ACTIVITIES.get(kind, (OTHER, kind or "Unknown"))
    status = h.get("status")
    severity_id = KIND_SEVERITY.get(kind, 1)
    if kind == "completion" and status in FAILURES:
        severity_id = FAILED_SEVERITY
    out = _frame(activity_id, activity_name, _ms(h.get("created_at")), severity_id)
    out.update(_status(status, h.get("error_code")))
    out.update(_span(h.get("started_at"), h.get("ended_at")))
    out["metadata"] = _metadata(h)
    operation = str(h.get("endpoint") or f"ledger.{kind}")
    out["api"] = {"operation": operation, "service": dict(SERVICE),
                  "request": {"uid": str(h.get("request_id", ""))}}  # fmt: skip
    out["actor"] = {"user": {"uid": str(h.get("key_id", "")),
                             "account": {"uid": str(h.get("tenant", ""))}}}  # fmt: skip
    out["unmapped"] = _unmapped(h)
    return out


def _unreadable(row: LedgerRow) -> dict[str, Any]:
    out = _frame(OTHER, "Unreadable", 0, UNREADABLE_SEVERITY)
    out.update(_status(None, "header_unreadable"))
    out["metadata"] = {
        "version": OCSF_VERSION,
        "product": dict(PRODUCT),
        "uid": f"index:{row.index}",
    }
    out["api"] = {"operation": "ledger.unreadable", "service": dict(SERVICE),
                  "request": {"uid": f"index:{row.index}"}}  # fmt: skip
    out["actor"] = {"app_name": "thinkgate"}
    out["unmapped"] = {"kind": "unreadable"}
    return out


def _frame(activity_id: int, activity_name: str, time_ms: int, severity_id: int
           ) -> dict[str, Any]:  # fmt: skip
    return {
        "class_uid": CLASS_UID, "class_name": CLASS_NAME,
        "category_uid": CATEGORY_UID, "category_name": CATEGORY_NAME,
        "activity_id": activity_id, "activity_name": activity_name,
        "type_uid": CLASS_UID * 100 + activity_id, "type_name": f"{CLASS_NAME}: {activity_name}",
        "time": time_ms, "severity_id": severity_id, "severity": SEVERITIES[severity_id],
        "src_endpoint": dict(SRC_ENDPOINT),
    }  # fmt: skip


def _status(status: Any, error_code: Any) -> dict[str, Any]:
    if not status:
        out: dict[str, Any] = {"status_id": 0, "status": "Unknown"}
    elif status == "ok":
        out = {"status_id": 1, "status": "Success", "status_code": "ok"}
    else:
        out = {"status_id": 2, "status": "Failure", "status_code": str(status)}
    if error_code:
        out["status_detail"] = str(error_code)
    return out


def _span(started_at: Any, ended_at: Any) -> dict[str, int]:
    out = {}
    if isinstance(started_at, int | float):
        out["start_time"] = _ms(started_at)
    if isinstance(ended_at, int | float):
        out["end_time"] = _ms(ended_at)
    if len(out) == 2:
        out["duration"] = max(0, out["end_time"] - out["start_time"])
    return out


def _metadata(h: dict[str, Any]) -> dict[str, Any]:
    out = {
        "version": OCSF_VERSION,
        "product": dict(PRODUCT),
        "uid": f"{h.get('writer', '')}:{h.get('sequence', '')}",
        "log_name": str(h.get("origin", "")),
        "log_version": f"thinkgate-ledger/{h.get('v', '')}",
        "tenant_uid": str(h.get("tenant", "")),
    }
    trace = trace_id(h.get("traceparent"))
    if trace is not None:
        out["correlation_uid"] = trace
    return out


def trace_id(traceparent: Any) -> str | None:
    """The trace id of a W3C ``traceparent`` (``version-traceid-parentid-flags``), if it has one."""
    if not isinstance(traceparent, str):
        return None
    parts = traceparent.split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1].lower()


def _unmapped(h: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in h.items():
        if name in MAPPED or name in HIDDEN:
            continue
        timed = name.endswith("_at") and isinstance(value, int | float)
        out[name] = _ms(value) if timed else value
    return out


def _integrity(row: LedgerRow, head: TreeHead, origin: Any) -> dict[str, Any]:
    checkpoint: dict[str, Any] = {"tree_size": head.size, "root_hash": head.root.hex()}
    if isinstance(origin, str):
        checkpoint["origin"] = origin
    return {"leaf_index": row.index, "leaf_hash": row.leaf_hash.hex(), "checkpoint": checkpoint}


def _ms(seconds: Any) -> int:
    return round(float(seconds) * 1000) if isinstance(seconds, int | float) else 0
