"""W3C Trace Context ``traceparent`` (https://www.w3.org/TR/trace-context/, §3.2), sans-I/O.

thinkgate is not a tracer: it passes the caller's trace context on to the upstream (so vLLM's
own OpenTelemetry spans join the caller's trace) and records it in the ledger header and the
request's log line. Rules: version ``00`` is parsed strictly (``00-<32 hex>-<16 hex>-<2 hex>``,
lowercase, trace id and parent id not all zeros); a later version is accepted if its first four
fields have that shape (§3.2.4, forward compatibility) and passed on as its ``00`` form; anything
else is ignored, as a receiver that cannot parse it must do (§3.2.2.1) — never an error.
"""

from __future__ import annotations

import re

_SHAPE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse_traceparent(value: str | None) -> str | None:
    """The normalised header to pass on, or ``None`` when absent or invalid."""
    if value is None:
        return None
    match = _SHAPE.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return f"00-{trace_id}-{parent_id}-{flags}"


def trace_id(traceparent: str) -> str:
    return traceparent[3:35]
