"""Batches as each API's reference shows them (sans-I/O): OpenAI's batch object and its output
and error files' lines, Anthropic's ``message_batch`` and its results' lines.

- OpenAI: ``request_counts.completed`` counts the lines that succeeded, ``failed`` every other
  ended line (errored, cancelled or expired); the output file holds the lines answered with
  status 200, the error file every other one: an endpoint's refusal as its status code and
  error body, a line the batch stopped as ``error.code`` ``batch_cancelled`` or
  ``batch_expired`` (``response`` null). A file with no line is not made (its id stays null).
- Anthropic: ``processing_status`` ``in_progress``, ``canceling`` or ``ended``; a result is
  ``succeeded`` (the message), ``errored`` (the error as the Messages API returned it),
  ``canceled`` or ``expired``; ``results_url`` once ended.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.batch.rows import WINDOW_S, Batch, LineResult

WINDOW = "24h"
__all__ = [
    "WINDOW",
    "WINDOW_S",
    "anthropic_batch",
    "anthropic_result",
    "openai_batch",
    "openai_files",
]


def _at(batch: Batch, status: str, when: float | None) -> int | None:
    return int(when) if batch.status == status and when is not None else None


def openai_batch(batch: Batch) -> dict[str, Any]:
    counts = batch.counts
    ended = batch.ended_at
    cancelling = batch.cancel_at
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": None if batch.errors is None else {"object": "list", "data": batch.errors},
        "input_file_id": batch.input_file_id,
        "completion_window": WINDOW,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": int(batch.created_at),
        "expires_at": int(batch.expires_at),
        "finalizing_at": int(ended) if ended is not None else None,
        "completed_at": _at(batch, "completed", ended),
        "failed_at": _at(batch, "failed", ended),
        "expired_at": _at(batch, "expired", ended),
        "cancelling_at": int(cancelling) if cancelling is not None else None,
        "cancelled_at": _at(batch, "cancelled", ended),
        "request_counts": {
            "total": batch.total,
            "completed": counts.succeeded,
            "failed": counts.errored + counts.canceled + counts.expired,
        },
        "metadata": batch.metadata,
    }


_STOPPED = {
    "canceled": ("batch_cancelled", "The batch was cancelled before this request ran."),
    "expired": ("batch_expired", "The batch's completion window ended before this request ran."),
}


def openai_files(batch: Batch, results: list[LineResult]) -> tuple[bytes | None, bytes | None]:
    """The output and error files' contents (``None`` for a file with no line)."""
    output: list[bytes] = []
    errors: list[bytes] = []
    for result in results:
        line: dict[str, Any] = {
            "id": "batch_req_" + secrets.token_hex(12),
            "custom_id": result.custom_id,
        }
        if result.status_code is None:
            code, message = _STOPPED.get(
                result.outcome, ("server_error", "The request could not be run.")
            )
            line.update(response=None, error={"code": code, "message": message})
        else:
            line.update(
                response={
                    "status_code": result.status_code,
                    "request_id": result.request_id,
                    "body": result.body,
                },
                error=None,
            )
        (output if result.outcome == "succeeded" else errors).append(orjson.dumps(line))
    return _jsonl(output), _jsonl(errors)


def _jsonl(items: list[bytes]) -> bytes | None:
    return b"\n".join(items) + b"\n" if items else None


def _rfc3339(when: float | None) -> str | None:
    if when is None:
        return None
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")


def anthropic_batch(batch: Batch, base_url: str) -> dict[str, Any]:
    counts = batch.counts
    ended = batch.status in ("completed", "expired", "cancelled", "failed")
    status = "ended" if ended else "canceling" if batch.status == "cancelling" else "in_progress"
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": {
            "processing": counts.processing,
            "succeeded": counts.succeeded,
            "errored": counts.errored,
            "canceled": counts.canceled,
            "expired": counts.expired,
        },
        "ended_at": _rfc3339(batch.ended_at),
        "created_at": _rfc3339(batch.created_at),
        "expires_at": _rfc3339(batch.expires_at),
        "archived_at": None,
        "cancel_initiated_at": _rfc3339(batch.cancel_at),
        "results_url": f"{base_url}/v1/messages/batches/{batch.id}/results" if ended else None,
    }


def anthropic_result(result: LineResult) -> bytes:
    """One line of the results."""
    outcome: dict[str, Any]
    if result.outcome == "succeeded":
        outcome = {"type": "succeeded", "message": result.body}
    elif result.outcome in ("canceled", "expired"):
        outcome = {"type": result.outcome}
    else:
        error = (
            result.body
            if isinstance(result.body, dict) and "error" in result.body
            else {
                "type": "error",
                "error": {"type": "api_error", "message": "The request could not be run."},
            }
        )
        outcome = {"type": "errored", "error": error}
    return orjson.dumps({"custom_id": result.custom_id, "result": outcome})
