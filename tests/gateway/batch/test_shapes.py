"""Batches in each API's shape (``gateway.batch.shapes``)."""

from __future__ import annotations

import orjson

from gateway.batch.rows import Batch, LineCounts, LineResult
from gateway.batch.shapes import anthropic_batch, anthropic_result, openai_batch, openai_files

T0 = 1_767_225_600.0


def batch(status: str = "completed", **counts: int) -> Batch:
    ended = None if status in ("in_progress", "cancelling") else T0 + 60
    cancel = T0 + 30 if status in ("cancelling", "cancelled") else None
    return Batch("batch_1", "acme", "k1", "openai", "/v1/chat/completions", status, 4, T0,
                 T0 + 86400, cancel, ended, "file-in", "file-out", "file-err", T0 + 9e5,
                 {"a": "b"}, LineCounts(**counts))  # fmt: skip


def test_openai_batch_times_and_counts() -> None:
    done = openai_batch(batch("completed", succeeded=3, errored=1))
    assert done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert (done["completed_at"], done["cancelled_at"], done["errors"]) == (T0 + 60, None, None)
    assert done["completion_window"] == "24h" and done["metadata"] == {"a": "b"}
    stopped = openai_batch(batch("cancelled", succeeded=1, canceled=3))
    assert stopped["request_counts"]["failed"] == 3
    assert (stopped["cancelling_at"], stopped["cancelled_at"]) == (T0 + 30, T0 + 60)
    assert openai_batch(batch("in_progress", processing=4))["finalizing_at"] is None


def test_openai_output_and_error_lines() -> None:
    results = [LineResult(0, "a", "succeeded", 200, {"id": "x"}, "x"),
               LineResult(1, "b", "errored", 400, {"error": {"code": "bad"}}, None),
               LineResult(2, "c", "expired", None, None, None)]  # fmt: skip
    output, errors = openai_files(batch(), results)
    assert output is not None and errors is not None
    [ok] = [orjson.loads(x) for x in output.splitlines()]
    assert ok["custom_id"] == "a" and ok["response"]["status_code"] == 200 and ok["error"] is None
    bad, late = [orjson.loads(x) for x in errors.splitlines()]
    assert bad["response"]["body"]["error"]["code"] == "bad"
    assert late["response"] is None and late["error"]["code"] == "batch_expired"
    assert openai_files(batch(), results[:1])[1] is None  # no error line, no error file


def test_anthropic_batch_and_results() -> None:
    running = anthropic_batch(batch("in_progress", processing=4), "http://gw")
    assert running["processing_status"] == "in_progress" and running["results_url"] is None
    assert running["created_at"] == "2026-01-01T00:00:00Z"
    ended = anthropic_batch(batch("cancelled", canceled=4), "http://gw")
    assert ended["processing_status"] == "ended"
    assert ended["results_url"] == "http://gw/v1/messages/batches/batch_1/results"
    assert ended["request_counts"]["canceled"] == 4
    assert orjson.loads(anthropic_result(LineResult(0, "a", "canceled", None, None, None))) == {
        "custom_id": "a", "result": {"type": "canceled"}}  # fmt: skip
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "m"}}
    errored = orjson.loads(anthropic_result(LineResult(0, "a", "errored", 400, error, None)))
    assert errored["result"] == {"type": "errored", "error": error}
