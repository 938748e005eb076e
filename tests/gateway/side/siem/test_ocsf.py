"""The OCSF mapping (gateway/side/siem/ocsf.py): each kind of ledger record, from the header bytes
the ledger really writes, becomes an API Activity event that the OCSF schema accepts, with the
fields docs/siem.md promises, its integrity fields, and nothing of the sealing."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from audit.record import Facts, Seal, Usage, encode_header
from gateway.side.siem.ocsf import OCSF_VERSION, LedgerRow, TreeHead, event, trace_id
from tests.ocsf import releases, schema_errors

ORIGIN = "thinkgate.test/siem"
SEAL = Seal(ORIGIN, "w-0123456789abcdef", 41, "dek-1", b"s" * 16, b"c" * 32)
HEAD = TreeHead(size=100, root=hashlib.sha256(b"root").digest())
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def completion(**changes: Any) -> Facts:
    fields: dict[str, Any] = {
        "kind": "completion", "tenant": "acme", "key_id": "key-7", "request_id": "req-1",
        "created_at": 1_767_225_600.25, "model": "deepseek-r1", "status": "ok",
        "upstream": "http://vllm:8000/v1", "stream": True, "started_at": 1_767_225_598.0,
        "first_token_at": 1_767_225_598.5, "ended_at": 1_767_225_600.25,
        "usage": Usage(prompt_tokens=12, completion_tokens=30, reasoning_tokens=20,
                       total_tokens=42),
        "finish_reasons": ("stop",), "traceparent": TRACEPARENT, "endpoint": "chat.completions",
        "reasoning_format": "deepseek_r1", "guardrails": ("pii:redact",),
    }  # fmt: skip
    return Facts(**{**fields, **changes})


def mapped(facts: Facts, index: int = 7) -> dict[str, Any]:
    """The event of a record with ``facts`` at leaf ``index``, decoded, after a schema check."""
    row = LedgerRow(index, encode_header(facts, SEAL), hashlib.sha256(b"leaf%d" % index).digest())
    made = event(row, HEAD)
    decoded: dict[str, Any] = orjson.loads(made.json)
    assert schema_errors(decoded) == []
    assert (made.index, made.time_ms, made.severity_id) == (index, decoded["time"],
                                                           decoded["severity_id"])  # fmt: skip
    return decoded


def test_a_completion_is_an_api_create_with_its_metadata_where_ocsf_puts_it() -> None:
    e = mapped(completion())
    assert (e["class_uid"], e["category_uid"], e["activity_id"], e["type_uid"]) == (
        6003, 6, 1, 600301,
    )  # fmt: skip
    assert (e["activity_name"], e["type_name"]) == ("Create", "API Activity: Create")
    assert (e["status_id"], e["status"], e["status_code"]) == (1, "Success", "ok")
    assert (e["severity_id"], e["severity"]) == (1, "Informational")
    assert (e["time"], e["start_time"], e["end_time"], e["duration"]) == (
        1_767_225_600_250, 1_767_225_598_000, 1_767_225_600_250, 2250,
    )  # fmt: skip
    assert e["metadata"] == {
        "version": OCSF_VERSION, "product": {"name": "thinkgate", "vendor_name": "thinkgate"},
        "uid": "w-0123456789abcdef:41", "log_name": ORIGIN, "log_version": "thinkgate-ledger/1",
        "tenant_uid": "acme", "correlation_uid": "4bf92f3577b34da6a3ce929d0e0e4736",
        "sequence": 7,
    }  # fmt: skip
    assert e["api"] == {"operation": "chat.completions", "service": {"name": "thinkgate"},
                        "request": {"uid": "req-1"}}  # fmt: skip
    assert e["actor"] == {"user": {"uid": "key-7", "account": {"uid": "acme"}}}
    assert e["src_endpoint"] == {"name": "unrecorded"}
    unmapped = e["unmapped"]
    assert unmapped["model"] == "deepseek-r1" and unmapped["kind"] == "completion"
    assert unmapped["usage"] == {"prompt_tokens": 12, "completion_tokens": 30,
                                 "reasoning_tokens": 20, "total_tokens": 42}  # fmt: skip
    assert unmapped["guardrails"] == ["pii:redact"]
    assert unmapped["first_token_at"] == 1_767_225_598_500  # times in ms everywhere
    assert unmapped["integrity"] == {
        "leaf_index": 7, "leaf_hash": hashlib.sha256(b"leaf7").hexdigest(),
        "checkpoint": {"tree_size": 100, "root_hash": HEAD.root.hex(), "origin": ORIGIN},
    }  # fmt: skip


def test_the_sealing_parameters_stay_out_and_every_other_header_field_lands_somewhere() -> None:
    facts = completion(error_code="engine_overloaded", status="upstream_error")
    header = orjson.loads(encode_header(facts, SEAL))
    e = mapped(facts)
    text = orjson.dumps(e).decode()
    for sealing in ("dek-1", "salt", "commitment", header["salt"], header["commitment"]):
        assert sealing not in text
    placed = {"v", "origin", "writer", "sequence", "tenant", "key_id", "request_id",
              "created_at", "started_at", "ended_at", "status", "error_code", "endpoint",
              "traceparent", "dek", "salt", "commitment"}  # fmt: skip
    assert set(header) - placed == set(e["unmapped"]) - {"integrity"}


def test_a_failed_completion_is_a_failure_at_low_severity_with_its_error_code() -> None:
    e = mapped(completion(status="upstream_error", error_code="upstream_timeout"))
    assert (e["status_id"], e["status"], e["status_code"], e["status_detail"]) == (
        2, "Failure", "upstream_error", "upstream_timeout",
    )  # fmt: skip
    assert (e["severity_id"], e["severity"]) == (2, "Low")
    invalid = mapped(completion(status="invalid"))  # the client's fault: informational
    assert (invalid["status_id"], invalid["severity_id"]) == (2, 1)
    # an exchange whose replica died before its record (audit.intents): a failure too
    lost = mapped(completion(status="replica_lost", error_code="replica_lost"))
    assert (lost["status_id"], lost["status_code"], lost["severity_id"]) == (2, "replica_lost", 2)


def test_an_auditor_access_is_a_read_of_the_subject_record() -> None:
    facts = Facts(kind="access", tenant="acme", key_id="auditor-1", request_id="req-9",
                  created_at=1_767_225_700.0, subject=3)  # fmt: skip
    e = mapped(facts, index=8)
    assert (e["activity_id"], e["activity_name"], e["type_uid"]) == (2, "Read", 600302)
    assert (e["severity_id"], e["status_id"]) == (2, 1)
    assert e["api"]["operation"] == "ledger.access"
    assert e["actor"]["user"]["uid"] == "auditor-1"
    assert e["unmapped"]["subject"] == 3 and e["unmapped"]["integrity"]["leaf_index"] == 8


def test_a_shred_is_a_delete_at_medium_severity_with_its_signed_statement() -> None:
    facts = Facts(kind="shred", tenant="globex", key_id="operator", request_id="shred-1",
                  created_at=1_767_225_800.0, statement="thinkgate shred\n...")  # fmt: skip
    e = mapped(facts)
    assert (e["activity_id"], e["activity_name"], e["type_uid"]) == (4, "Delete", 600304)
    assert (e["severity_id"], e["severity"]) == (3, "Medium")
    assert e["unmapped"]["statement"] == "thinkgate shred\n..."
    assert e["api"]["operation"] == "ledger.shred"


@pytest.mark.parametrize(
    ("kind", "activity", "severity"),
    [("hold", (1, "Create"), 2), ("release", (4, "Delete"), 3),
     ("retention-set", (3, "Update"), 3), ("retention", (4, "Delete"), 3)],
)  # fmt: skip
def test_records_management_records_are_creates_updates_and_deletes(
    kind: Any, activity: tuple[int, str], severity: int
) -> None:
    terms = {"hold": "h-1", "reason": "case 17"}
    e = mapped(Facts(kind=kind, tenant="acme", key_id="operator", request_id=f"{kind}-1",
                     created_at=1_767_225_900.0, statement="signed", terms=terms))  # fmt: skip
    assert (e["activity_id"], e["activity_name"]) == activity
    assert (e["severity_id"], e["api"]["operation"]) == (severity, f"ledger.{kind}")
    assert e["unmapped"]["terms"] == terms and e["unmapped"]["kind"] == kind


def test_a_kind_this_code_does_not_know_is_other_named_by_its_kind() -> None:
    e = mapped(Facts(kind="audit-note", tenant="acme", key_id="operator",  # type: ignore[arg-type]
                     request_id="n-1", created_at=1_767_225_900.0))  # fmt: skip
    assert (e["activity_id"], e["activity_name"], e["type_uid"]) == (99, "audit-note", 600399)
    assert e["severity_id"] == 1 and e["unmapped"]["kind"] == "audit-note"


@pytest.mark.parametrize("header", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_a_row_whose_header_does_not_parse_is_still_exported_and_flagged(header: bytes) -> None:
    made = event(LedgerRow(5, header, b"\x01" * 32), HEAD)
    e = orjson.loads(made.json)
    assert schema_errors(e) == []
    assert (e["activity_id"], e["activity_name"], e["severity"]) == (99, "Unreadable", "High")
    assert e["status_detail"] == "header_unreadable" and made.kind == "unreadable"
    assert e["unmapped"]["integrity"]["leaf_index"] == 5
    assert e["unmapped"]["integrity"]["leaf_hash"] == "01" * 32


def test_the_schema_check_is_not_vacuous() -> None:
    e = mapped(completion())
    for required in ("src_endpoint", "actor", "time"):
        assert schema_errors({k: v for k, v in e.items() if k != required}) != []
    assert schema_errors({**e, "activity_id": 7}) != []
    assert schema_errors({**e, "api": {"request": {"uid": "r"}}}) != []  # no operation


def test_the_same_row_always_gives_the_same_bytes() -> None:
    row = LedgerRow(3, encode_header(completion(), SEAL), b"\x02" * 32)
    assert event(row, HEAD).json == event(row, HEAD).json


@pytest.mark.parametrize("version", releases())
def test_every_kind_validates_against_each_ocsf_release_from_the_claimed_one(
    version: str,
) -> None:
    kinds = [completion(), completion(status="error"), Facts(kind="access", tenant="t",
             key_id="k", request_id="r", created_at=1.0, subject=0)]  # fmt: skip
    for facts in kinds:
        e = orjson.loads(event(LedgerRow(0, encode_header(facts, SEAL), b"\0" * 32), HEAD).json)
        assert schema_errors(e, version) == []


@pytest.mark.parametrize(
    ("traceparent", "expected"),
    [
        (TRACEPARENT, "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", None),  # the invalid all-zero trace id
        ("00-xyz-00f067aa0ba902b7-01", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_the_correlation_uid_is_the_w3c_trace_id(traceparent: Any, expected: str | None) -> None:
    assert trace_id(traceparent) == expected
