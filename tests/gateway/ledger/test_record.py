"""The typed completion record: usage read once, and the record status of an error's outcome."""

from __future__ import annotations

from typing import Any

import pytest

from audit.record import Usage
from gateway.errors import (
    ClientClosedRequest,
    GatewayError,
    LedgerUnavailable,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.ledger.record import parse_usage, status_of


@pytest.mark.parametrize(
    ("raw", "usage"),
    [
        (None, None),
        ({}, None),
        ({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
          "completion_tokens_details": {"reasoning_tokens": 2}}, Usage(3, 5, 2, 8)),
        ({"completion_tokens": 5, "completion_tokens_details": None}, Usage(0, 5, 0, 0)),
        ({"completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": 9}},
         Usage(0, 5, 5, 0)),  # never more reasoning than completion
        ({"prompt_tokens": True, "completion_tokens": "5", "total_tokens": -1},
         Usage(0, 0, 0, 0)),  # not whole numbers >= 0: nothing
        ({"prompt_tokens": 405, "completion_tokens": 5, "total_tokens": 410,
          "prompt_tokens_details": {"cached_tokens": 384}}, Usage(405, 5, 0, 410, False, 384)),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}},
         Usage(10, 0, 0, 0, False, 10)),  # never more cached than the prompt
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": "3"}},
         Usage(10, 0, 0, 0)),
    ],
)  # fmt: skip
def test_usage_is_read_once_whatever_the_engine_sent(
    raw: dict[str, Any] | None, usage: Usage | None
) -> None:
    assert parse_usage(raw) == usage


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (UpstreamStatusError(503, "busy", param=None, code=None), "upstream_error"),
        (UpstreamStatusError(400, "too long", param=None, code=None), "invalid"),  # relayed 4xx
        (UpstreamTimeout("slow"), "upstream_error"),
        (ClientClosedRequest("gone"), "client_disconnected"),
        (LedgerUnavailable("down"), "error"),
        (GatewayError("bug"), "error"),
    ],
)
def test_the_record_status_follows_the_errors_outcome(error: GatewayError, status: str) -> None:
    assert status_of(error.outcome) == status
