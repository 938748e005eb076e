"""``traceparent`` parsing, against the W3C Trace Context rules (§3.2)."""

from __future__ import annotations

import pytest

from gateway.telemetry.traceparent import parse_traceparent, trace_id

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_header_passes_through_and_names_its_trace() -> None:
    assert parse_traceparent(VALID) == VALID
    assert parse_traceparent(f"  {VALID} ") == VALID
    assert trace_id(VALID) == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_later_version_is_passed_on_in_its_version_00_form() -> None:
    assert parse_traceparent(VALID.replace("00-", "01-", 1) + "-future-field") == VALID


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        VALID.upper(),  # uppercase hex is invalid
        VALID + "-extra",  # version 00 has exactly four fields
        "ff" + VALID[2:],  # version ff is forbidden
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
    ],
)
def test_anything_else_is_ignored(value: str | None) -> None:
    assert parse_traceparent(value) is None
