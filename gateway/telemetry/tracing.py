"""OpenTelemetry traces and GenAI metrics, configured by the standard ``OTEL_*`` variables.

``open_tracing(environ)`` is ``None`` (tracing off, nothing imported from the SDK at request
time) unless an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and ``OTEL_SDK_DISABLED`` is not ``true``. Then the
SDK reads the rest itself: ``OTEL_SERVICE_NAME`` (default ``thinkgate``),
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` / ``_ARG`` (default parent-based
always-on), ``OTEL_EXPORTER_OTLP_HEADERS``, timeouts; spans go out over OTLP/HTTP
(protobuf) in batches, from a thread of the SDK's. GenAI metrics go the same way (every
``OTEL_METRIC_EXPORT_INTERVAL``), unless ``OTEL_METRICS_EXPORTER`` is ``none``; the
Prometheus endpoint is unchanged.

Per completion request (``ExchangeSpan``), following the GenAI semantic conventions:

- a **server span** ``{operation} {model}`` (``gen_ai.operation.name`` ``chat``,
  ``text_completion`` or ``embeddings``), child of the caller's ``traceparent`` when it sent
  one, from the request's arrival to its record, with ``gen_ai.provider.name`` (``vllm``),
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.usage.input_tokens``,
  ``gen_ai.usage.output_tokens``, ``gen_ai.usage.reasoning.output_tokens``,
  ``gen_ai.response.finish_reasons``, ``gen_ai.response.id`` (the request id), the tenant and
  outcome (``thinkgate.*``), ``error.type`` and an error status on failure; events
  ``gen_ai.first_token`` and ``thinkgate.reasoning.end`` (the first answer text);
- child spans ``thinkgate.admission`` (the wait for rate limits and KV budget),
  ``thinkgate.upstream`` (a client span from the request to the engine to its last byte,
  whose context is the ``traceparent`` the engine gets: vLLM started with
  ``--otlp-traces-endpoint`` continues the same trace) and ``thinkgate.ledger.commit``.

Never a byte of a prompt, reasoning or answer, and nothing of a key but its id.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the OpenTelemetry SDK is imported only when tracing is configured
    from gateway.telemetry.spans import Tracing


def open_tracing(environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """Tracing as the ``OTEL_*`` variables configure it, or ``None`` when they do not (and then
    nothing of OpenTelemetry is imported)."""
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint or environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    from gateway.telemetry.spans import start_tracing

    return start_tracing(environ)
