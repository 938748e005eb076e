"""The OpenTelemetry side of ``gateway.telemetry.tracing``: the SDK's providers, the spans of a
request and the GenAI metrics. Imported only when an OTLP endpoint is configured (the SDK and
its exporter are ~3 MB of RSS a gateway without tracing does not carry); what is traced, and
how, is in ``gateway.telemetry.tracing``'s docstring.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("thinkgate")
PROVIDER = "vllm"
_PROPAGATOR = TraceContextTextMapPropagator()
OPERATIONS = {"completions": "text_completion", "embeddings": "embeddings"}  # else chat


def _ns(wall_s: float) -> int:
    return int(wall_s * 1e9)


@dataclass(slots=True)
class GenAIMetrics:
    """The GenAI semantic conventions' metric instruments (``gen_ai.*``)."""

    tokens: Histogram
    ttft: Histogram
    per_token: Histogram
    duration: Histogram


@dataclass(slots=True)
class Tracing:
    tracer: trace.Tracer
    providers: list[Any]  # shut down (flushed) at exit
    metrics: GenAIMetrics | None = None

    def start(self, *, request_id: str, operation: str, model: str, started_at: float,
              traceparent: str | None) -> ExchangeSpan:  # fmt: skip
        """The spans of one completion request that arrived at ``started_at`` (wall clock)."""
        parent = (_PROPAGATOR.extract({"traceparent": traceparent}) if traceparent
                  else Context())  # fmt: skip
        name = OPERATIONS.get(operation, "chat")
        server = self.tracer.start_span(
            f"{name} {model}", context=parent, kind=SpanKind.SERVER,
            start_time=_ns(started_at),
            attributes={"gen_ai.operation.name": name, "gen_ai.provider.name": PROVIDER,
                        "gen_ai.request.model": model, "gen_ai.response.id": request_id,
                        "thinkgate.endpoint": operation},
        )  # fmt: skip
        return ExchangeSpan(self, server, name, model)

    def shutdown(self) -> None:
        for provider in self.providers:
            try:
                provider.shutdown()
            except Exception:  # an exporter that cannot flush at exit loses its last batch
                log.warning("OpenTelemetry: %s did not shut down cleanly",
                            type(provider).__name__)  # fmt: skip


@dataclass(slots=True)
class ExchangeSpan:
    tracing: Tracing
    server: Span
    operation: str
    model: str
    upstream: Span | None = None
    events: list[tuple[str, float]] = field(default_factory=list)

    @property
    def sampled(self) -> bool:
        return bool(self.server.get_span_context().trace_flags.sampled)

    @property
    def trace_id(self) -> str | None:
        """The trace id (hex) when this request is sampled (an exemplar's label)."""
        context = self.server.get_span_context()
        return f"{context.trace_id:032x}" if context.trace_flags.sampled else None

    def admission(self, start: float, end: float) -> None:
        """The admission wait, ``start``-``end`` (wall clock)."""
        context = trace.set_span_in_context(self.server)
        span = self.tracing.tracer.start_span("thinkgate.admission", context=context,
                                              start_time=_ns(start))  # fmt: skip
        span.end(end_time=_ns(end))

    def upstream_traceparent(self, upstream: str | None = None) -> str | None:
        """The ``traceparent`` the engine gets: the upstream client span's (started now)."""
        if self.upstream is None:
            context = trace.set_span_in_context(self.server)
            self.upstream = self.tracing.tracer.start_span(
                "thinkgate.upstream", context=context, kind=SpanKind.CLIENT,
                attributes={"gen_ai.operation.name": self.operation,
                            "gen_ai.provider.name": PROVIDER, "gen_ai.request.model": self.model},
            )  # fmt: skip
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self.upstream))
        return carrier.get("traceparent")

    def event(self, name: str, at: float) -> None:
        self.events.append((name, at))

    def ledger(self, start: float, end: float) -> None:
        context = trace.set_span_in_context(self.server)
        span = self.tracing.tracer.start_span("thinkgate.ledger.commit", context=context,
                                              start_time=_ns(start))  # fmt: skip
        span.end(end_time=_ns(end))

    def finish(self, outcome: Outcome) -> None:
        """End the spans with what the request came to; record the GenAI metrics."""
        attributes: dict[str, Any] = {
            "gen_ai.response.model": self.model,
            "gen_ai.usage.input_tokens": outcome.input_tokens,
            "gen_ai.usage.output_tokens": outcome.output_tokens,
            "gen_ai.usage.reasoning.output_tokens": outcome.reasoning_tokens,
            "gen_ai.response.finish_reasons": [r or "" for r in outcome.finish_reasons],
            "thinkgate.tenant": outcome.tenant,
            "thinkgate.key_id": outcome.key_id,
            "thinkgate.status": outcome.status,
            "thinkgate.stream": outcome.stream,
        }
        if outcome.upstream:
            attributes["server.address"] = outcome.upstream
        for name, at in self.events:
            self.server.add_event(name, timestamp=_ns(at))
        for span in (self.upstream, self.server):
            if span is None:
                continue
            span.set_attributes(attributes)
            if outcome.status != "ok":
                span.set_attribute("error.type", outcome.error_code or outcome.status)
                span.set_status(Status(StatusCode.ERROR, outcome.status))
        if self.upstream is not None:
            self.upstream.end(end_time=_ns(outcome.ended_at))
        self.server.end(end_time=_ns(outcome.recorded_at))
        self._measure(outcome)

    def _measure(self, outcome: Outcome) -> None:
        metrics = self.tracing.metrics
        if metrics is None:
            return
        base: dict[str, Any] = {
            "gen_ai.operation.name": self.operation, "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": self.model, "gen_ai.response.model": self.model,
        }  # fmt: skip
        if outcome.status != "ok":
            base["error.type"] = outcome.error_code or outcome.status
        for kind, count in (("input", outcome.input_tokens), ("output", outcome.output_tokens),
                            ("reasoning", outcome.reasoning_tokens)):  # fmt: skip
            metrics.tokens.record(count, {**base, "gen_ai.token.type": kind})
        metrics.duration.record(outcome.ended_at - outcome.started_at, base)
        if outcome.first_token_at is not None:
            metrics.ttft.record(outcome.first_token_at - outcome.started_at, base)
            if outcome.output_tokens > 1:
                per = (outcome.ended_at - outcome.first_token_at) / (outcome.output_tokens - 1)
                metrics.per_token.record(per, base)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a request came to, as its spans and metrics carry it (never its text)."""

    tenant: str
    key_id: str
    status: str
    error_code: str | None
    stream: bool
    upstream: str | None
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    finish_reasons: Sequence[str | None]
    started_at: float
    first_token_at: float | None
    ended_at: float
    recorded_at: float = field(default_factory=time.time)


def start_tracing(environ: Mapping[str, str]) -> Tracing:
    """Tracing as the ``OTEL_*`` variables configure it (``tracing.open_tracing`` saw an OTLP
    endpoint)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    resource = Resource.create({})  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "thinkgate"}))
    traces = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    traces.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    tracing = Tracing(traces.get_tracer("thinkgate"), [traces])
    # metrics where an endpoint says where (a traces-only endpoint means traces only)
    metrics_to = environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if metrics_to and environ.get("OTEL_METRICS_EXPORTER", "otlp").lower() != "none":
        tracing.metrics = _genai_metrics(resource, tracing)
    return tracing


def _genai_metrics(resource: Resource, tracing: Tracing) -> GenAIMetrics:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    tracing.providers.append(provider)
    meter = provider.get_meter("thinkgate")
    seconds = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
               81.92]  # fmt: skip
    return GenAIMetrics(
        tokens=meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Tokens used per request, by gen_ai.token.type (input, output, and "
                        "reasoning: the output tokens spent reasoning)",
            explicit_bucket_boundaries_advisory=[1, 4, 16, 64, 256, 1024, 4096, 16384, 65536,
                                                 262144, 1048576, 4194304, 16777216]),
        ttft=meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s",
            description="Time to generate the first token",
            explicit_bucket_boundaries_advisory=[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                                 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]),
        per_token=meter.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s",
            description="Time per output token after the first",
            explicit_bucket_boundaries_advisory=[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                                                 0.4, 0.5, 0.75, 1.0, 2.5]),
        duration=meter.create_histogram(
            "gen_ai.server.request.duration", unit="s",
            description="Duration of a GenAI request, arrival to last byte",
            explicit_bucket_boundaries_advisory=seconds),
    )  # fmt: skip
