"""Logs: one line per chat completion (the access log) and the process's other messages.

Rules:

- ``LOG_FORMAT=json`` (default): one JSON object per line, ``ts``, ``level``, ``logger``, ``msg``
  and the record's fields; ``text``: the message and ``key=value`` pairs.
- The access line (logger ``thinkgate.access``) carries request id, tenant, key id, model,
  upstream, status, error code, HTTP stream flag, TTFT, time to first content, duration,
  gateway overhead, token counts, finish reasons and the trace id. It never carries a prompt,
  reasoning or answer text, nor any key: the fields are built from a fixed list of figures, so
  no text can slip in (a test greps every captured line for a marker sent in the prompt and
  returned in the reasoning and the answer).
- uvicorn's own access log is switched off (``access_log=False`` and its logger silenced): this
  line replaces it rather than duplicating it. ``LOG_LEVEL`` applies to thinkgate's and
  uvicorn's loggers alike.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any

import orjson

from gateway.ledger.record import CompletionRecord
from gateway.sections import LogSettings
from gateway.telemetry.traceparent import trace_id

ACCESS = logging.getLogger("thinkgate.access")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = f"{_iso(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            text += "".join(f" {k}={_text_value(v)}" for k, v in fields.items() if v is not None)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def log_config(settings: LogSettings) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the serving process (``uvicorn.run(log_config=)``)."""
    level = settings.log_level.upper()
    chosen = settings.log_format
    if chosen == "auto":
        chosen = "text" if sys.stderr.isatty() else "json"
    formatter = JsonFormatter if chosen == "json" else TextFormatter
    handler = {"class": "logging.StreamHandler", "formatter": "main", "stream": "ext://sys.stderr"}
    quiet = {"handlers": [], "level": "CRITICAL", "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"main": {"()": f"{formatter.__module__}.{formatter.__qualname__}"}},
        "handlers": {"main": handler},
        "root": {"handlers": ["main"], "level": "WARNING"},  # libraries: same format, not raw
        "loggers": {
            "thinkgate": {"handlers": ["main"], "level": level, "propagate": False},
            "uvicorn": {"handlers": ["main"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": quiet,  # replaced by thinkgate.access
        },
    }


def access_fields(
    record: CompletionRecord, *, overhead_s: float, first_content_at: float | None
) -> dict[str, Any]:
    usage = record.usage
    return {
        "request_id": record.request_id,
        "endpoint": record.endpoint,
        "tenant": record.tenant,
        "key_id": record.key_id,
        "model": record.model,
        "upstream": record.upstream,
        "stream": record.stream,
        "status": record.status,
        "error_code": record.error_code,
        "client_disconnected": record.client_disconnected,
        "ttft_ms": _ms(record.first_token_at, record.started_at),
        "ttfc_ms": _ms(first_content_at, record.started_at),
        "duration_ms": _ms(record.ended_at, record.started_at),
        "overhead_ms": round(overhead_s * 1000, 3),
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else None,
        "reasoning_tokens": usage.reasoning_tokens if usage else None,
        "finish_reasons": list(record.finish_reasons),
        "trace_id": trace_id(record.traceparent) if record.traceparent else None,
    }


def log_completion(
    record: CompletionRecord, *, overhead_s: float, first_content_at: float | None
) -> None:
    if ACCESS.isEnabledFor(logging.INFO):
        fields = access_fields(record, overhead_s=overhead_s, first_content_at=first_content_at)
        ACCESS.info("chat completion", extra={"fields": fields})


def log_refusal(
    request_id: str, tenant: str, key_id: str, model: str, status: str, error_code: str | None,
    traceparent: str | None, *, endpoint: str = "chat.completions", param: str | None = None,
) -> None:  # fmt: skip
    """A request refused before any engine was asked: which API, which model it named, and
    (``param``) the field at fault, so an operator sees what a client sent that was refused.
    ``param`` is the error's: a field name, never a value."""
    if ACCESS.isEnabledFor(logging.INFO):
        fields = {
            "request_id": request_id, "tenant": tenant, "key_id": key_id, "model": model,
            "endpoint": endpoint, "status": status, "error_code": error_code, "param": param,
            "trace_id": trace_id(traceparent) if traceparent else None,
        }  # fmt: skip
        ACCESS.info("request refused", extra={"fields": fields})


def _text_value(value: Any) -> str:
    """A field for ``key=value`` text: strings that could forge a line or a field (spaces,
    quotes, ``=``, control characters) are quoted and escaped as JSON strings."""
    if isinstance(value, str) and (not value or any(c in value for c in ' "=') or
                                   not value.isprintable()):  # fmt: skip
        return orjson.dumps(value).decode()
    return str(value)


def lean_records() -> None:
    """Every log record of this process made without what no line here prints: the caller's
    file and line (a stack walk per record), thread, process and multiprocessing names
    (the logging HOWTO's "Optimization"). About a third of an access line's cost."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


@functools.lru_cache(maxsize=2)
def _second(whole: int) -> str:
    """A whole second as text: strftime once a second, not once a line."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))


def _iso(created: float) -> str:
    return f"{_second(int(created))}.{int(created % 1 * 1000):03d}Z"


def _ms(end: float | None, start: float) -> float | None:
    return None if end is None else round((end - start) * 1000, 3)
