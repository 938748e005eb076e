"""Log lines: the JSON and text formats, the serving process's logging config, and the access
line's fields, which never carry a prompt, reasoning or answer text."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from typing import Any

import orjson
import pytest

from audit.record import Usage
from gateway.ledger.record import CompletionRecord
from gateway.telemetry.logs import (
    ACCESS,
    JsonFormatter,
    TextFormatter,
    access_fields,
    log_completion,
    log_refusal,
)
from tests.records import completion_record

MARKER = "zq-marker-7f3a9"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
ACCESS_KEYS = {
    "request_id", "endpoint", "tenant", "key_id", "model", "upstream", "stream", "status",
    "error_code",
    "client_disconnected", "ttft_ms", "ttfc_ms", "duration_ms", "overhead_ms", "prompt_tokens",
    "completion_tokens", "reasoning_tokens", "finish_reasons", "trace_id",
}  # fmt: skip


def log_record(msg: str = "hello %s", args: Any = ("world",), **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("thinkgate.test", logging.WARNING, __file__, 1, msg, args, None)
    for name, value in extra.items():
        setattr(record, name, value)
    return record


def secret_record(**changes: Any) -> CompletionRecord:
    """A completion whose every text field carries the marker."""
    fields: dict[str, Any] = {
        "request_id": "req_abc", "tenant": "acme", "key_id": "3f2a9c0b1d4e", "model": "m",
        "upstream": "http://engine/v1", "stream": True, "started_at": 1000.0,
        "first_token_at": 1000.25, "ended_at": 1002.0, "status": "ok", "error_code": None,
        "client_disconnected": False,
        "usage": Usage(prompt_tokens=9, completion_tokens=12, reasoning_tokens=5, total_tokens=21),
        "finish_reasons": ("stop",),
        "messages": [{"role": "system", "content": f"sys {MARKER}"},
                     {"role": "user", "content": [{"type": "text", "text": f"ask {MARKER}"}]}],
        "params": {"user": MARKER, "stop": [MARKER], "metadata": {"note": MARKER}},
        "reasoning": (f"thinking {MARKER}",), "content": (f"answer {MARKER}",),
        "traceparent": TRACEPARENT,
    }  # fmt: skip
    return completion_record(**{**fields, **changes})


# -- formatters ------------------------------------------------------------------------------


def test_a_json_line_has_the_standard_keys_and_the_fields() -> None:
    record = log_record(fields={"request_id": "req_1", "ttft_ms": 1.5, "trace_id": None})
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed == {
        "ts": parsed["ts"], "level": "warning", "logger": "thinkgate.test", "msg": "hello world",
        "request_id": "req_1", "ttft_ms": 1.5, "trace_id": None,
    }  # fmt: skip
    assert ISO.fullmatch(parsed["ts"])


def test_a_json_line_without_fields_and_with_an_exception() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        record = log_record(exc_info=sys.exc_info())
    parsed = json.loads(JsonFormatter().format(record))
    assert set(parsed) == {"ts", "level", "logger", "msg", "exc"}
    assert "ValueError: broken" in parsed["exc"]


def test_a_json_line_renders_what_json_cannot_hold_as_text() -> None:
    parsed = json.loads(JsonFormatter().format(log_record(fields={"odd": {1, 2} - {1, 2}})))
    assert parsed["odd"] == "set()"


def test_a_text_line_has_the_message_and_the_fields_that_are_set() -> None:
    record = log_record(fields={"request_id": "req_1", "status": "ok", "error_code": None})
    line = TextFormatter().format(record)
    prefix, rest = line.split(" ", 1)
    assert ISO.fullmatch(prefix)
    assert rest == "WARNING thinkgate.test: hello world request_id=req_1 status=ok"


# -- the serving process's config ------------------------------------------------------------

# dictConfig replaces the process's handlers (pytest's own among them): run it in a child.
CONFIGURED = """
import logging, logging.config, sys
from gateway.telemetry.logs import log_config
from gateway.settings import Settings
logging.config.dictConfig(log_config(Settings(log_level=sys.argv[1], log_format=sys.argv[2])))
logging.getLogger("uvicorn.access").info('127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200')
logging.getLogger("uvicorn.error").info("Application startup complete.")
logging.getLogger("thinkgate.access").info("chat completion", extra={"fields": {"status": "ok"}})
logging.getLogger("thinkgate").debug("a debug line")
logging.getLogger("some.library").warning("a library warning")
"""


def configured_stderr(level: str, fmt: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THINKGATE_")}
    done = subprocess.run(
        [sys.executable, "-c", CONFIGURED, level, fmt],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    return done.stderr.splitlines()


def test_the_json_config_logs_thinkgate_and_uvicorn_but_not_uvicorns_access_log() -> None:
    lines = [json.loads(line) for line in configured_stderr("info", "json")]  # every line JSON
    assert [(line["logger"], line["level"], line["msg"]) for line in lines] == [
        ("uvicorn.error", "info", "Application startup complete."),
        ("thinkgate.access", "info", "chat completion"),
        ("some.library", "warning", "a library warning"),
    ]
    assert lines[1]["status"] == "ok"


def test_the_level_applies_to_thinkgate_and_uvicorn_alike() -> None:
    lines = [json.loads(line) for line in configured_stderr("debug", "json")]
    assert [line["msg"] for line in lines] == [
        "Application startup complete.", "chat completion", "a debug line", "a library warning",
    ]  # fmt: skip
    quiet = [json.loads(line)["logger"] for line in configured_stderr("warning", "json")]
    assert quiet == ["some.library"]  # neither uvicorn's info nor thinkgate's


def test_the_text_config() -> None:
    lines = configured_stderr("info", "text")
    assert len(lines) == 3
    assert lines[2].endswith(" WARNING some.library: a library warning")
    assert lines[0].endswith(" INFO uvicorn.error: Application startup complete.")
    assert lines[1].endswith(" INFO thinkgate.access: chat completion status=ok")


# -- the access line -------------------------------------------------------------------------


def test_the_access_fields_are_the_documented_figures() -> None:
    fields = access_fields(secret_record(), overhead_s=0.0012345, first_content_at=1001.5)
    assert set(fields) == ACCESS_KEYS
    assert fields == {
        "request_id": "req_abc", "endpoint": "chat.completions",
        "tenant": "acme", "key_id": "3f2a9c0b1d4e", "model": "m",
        "upstream": "http://engine/v1", "stream": True, "status": "ok", "error_code": None,
        "client_disconnected": False, "ttft_ms": 250.0, "ttfc_ms": 1500.0,
        "duration_ms": 2000.0, "overhead_ms": 1.234, "prompt_tokens": 9,
        "completion_tokens": 12, "reasoning_tokens": 5, "finish_reasons": ["stop"],
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    }  # fmt: skip


def test_the_access_fields_of_a_request_that_never_got_far() -> None:
    record = secret_record(first_token_at=None, usage=None, traceparent=None, upstream=None,
                           status="upstream_error", error_code="upstream_error",
                           finish_reasons=())  # fmt: skip
    fields = access_fields(record, overhead_s=0.0, first_content_at=None)
    assert set(fields) == ACCESS_KEYS
    assert fields["ttft_ms"] is None and fields["ttfc_ms"] is None
    assert fields["prompt_tokens"] is None and fields["reasoning_tokens"] is None
    assert fields["trace_id"] is None and fields["finish_reasons"] == []


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def access_records() -> Any:
    handler = Collect()
    level, propagate = ACCESS.level, ACCESS.propagate
    ACCESS.addHandler(handler)
    ACCESS.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        ACCESS.removeHandler(handler)
        ACCESS.setLevel(level)
        ACCESS.propagate = propagate


def test_no_text_of_the_record_reaches_the_line(access_records: list[logging.LogRecord]) -> None:
    record = secret_record()
    assert MARKER in repr(record)  # the record does carry it
    log_completion(record, overhead_s=0.001, first_content_at=1001.0)
    log_refusal("req_def", "acme", "3f2a9c0b1d4e", "m", "invalid", "invalid_request", TRACEPARENT)
    assert len(access_records) == 2
    for formatter in (JsonFormatter(), TextFormatter()):
        for logged in access_records:
            line = formatter.format(logged)
            assert MARKER not in line
            assert "req_" in line and "4bf92f3577b34da6a3ce929d0e0e4736" in line
    completed, refused = (orjson.loads(JsonFormatter().format(r)) for r in access_records)
    assert completed["msg"] == "chat completion" and completed["request_id"] == "req_abc"
    assert set(completed) == {"ts", "level", "logger", "msg"} | ACCESS_KEYS
    assert refused["msg"] == "request refused"
    assert {k: refused[k] for k in ("request_id", "status", "error_code", "trace_id")} == {
        "request_id": "req_def", "status": "invalid", "error_code": "invalid_request",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    }  # fmt: skip


def test_nothing_is_built_when_the_access_log_is_off(
    access_records: list[logging.LogRecord],
) -> None:
    ACCESS.setLevel(logging.WARNING)
    log_completion(secret_record(), overhead_s=0.0, first_content_at=None)
    log_refusal("req_def", "acme", "k", "m", "invalid", None, None)
    assert access_records == []


@pytest.mark.parametrize("created", [0.0, 1_767_225_599.9996, 1_767_225_600.0, 1_767_225_600.5,
                                     1_767_225_599.001])  # fmt: skip
def test_the_timestamp_is_the_records_own_whatever_second_came_before(created: float) -> None:
    import time

    expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(created)))
    for before in (created - 1, created + 1, created):  # a cached neighbour second, or itself
        JsonFormatter().format(log_record(created=before))
        line = json.loads(JsonFormatter().format(log_record(created=created)))
        assert line["ts"] == f"{expected}.{int(created % 1 * 1000):03d}Z"


def test_a_lean_record_still_makes_the_whole_line() -> None:
    """``lean_records`` (the serving process) drops caller, thread and process lookups, none
    of which a line prints: the access line is the same."""
    code = (
        "import json, logging, sys\n"
        "from gateway.telemetry.logs import JsonFormatter, lean_records, log_completion\n"
        "from tests.records import completion_record\n"
        "lean_records()\n"
        "handler = logging.StreamHandler(sys.stdout)\n"
        "handler.setFormatter(JsonFormatter())\n"
        "access = logging.getLogger('thinkgate.access')\n"
        "access.addHandler(handler); access.setLevel(logging.INFO)\n"
        "log_completion(completion_record(), overhead_s=0.001, first_content_at=None)\n"
        "assert logging.getLogger().makeRecord('x', 20, 'f', 1, 'm', (), None).threadName "
        "is None\n"
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                          cwd=os.getcwd(), timeout=60)  # fmt: skip
    line = json.loads(done.stdout)
    assert (
        set(line) >= ACCESS_KEYS and line["msg"] == "chat completion" and ISO.fullmatch(line["ts"])
    )
