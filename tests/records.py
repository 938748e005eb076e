"""One factory of ``CompletionRecord`` for every test that needs one (metrics, logs, sinks)."""

from __future__ import annotations

from typing import Any

from audit.record import Usage
from gateway.ledger.record import CompletionRecord


def completion_record(**changes: Any) -> CompletionRecord:
    """A finished, streamed chat completion; ``changes`` replace any field."""
    fields: dict[str, Any] = {
        "request_id": "req_1", "endpoint": "chat.completions", "tenant": "acme", "key_id": "k1",
        "model": "m", "upstream": "http://engine/v1", "stream": True, "started_at": 100.0,
        "first_token_at": 100.5, "ended_at": 103.0, "status": "ok", "error_code": None,
        "client_disconnected": False,
        "usage": Usage(prompt_tokens=7, completion_tokens=10, reasoning_tokens=4, total_tokens=17),
        "finish_reasons": ("stop",), "messages": [{"role": "user", "content": "hi"}],
        "params": {}, "reasoning": ("r",), "content": ("a",),
    }  # fmt: skip
    return CompletionRecord(**{**fields, **changes})
