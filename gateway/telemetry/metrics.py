"""The gateway's Prometheus metrics: one ``Metrics`` object per app, created in its lifespan.

Rules:

- Names follow Prometheus conventions (``_total`` counters, ``_seconds`` and ``_tokens`` units)
  and, where one exists, the OpenTelemetry GenAI conventions in spirit (time to first token,
  time per output token as inter-token latency, token usage split by kind).
- Label values are bounded: ``model`` (what the upstreams serve), ``tenant`` (the tenants named
  in the settings, plus the first ``METRICS_TENANTS`` others seen, then ``other``), ``status``,
  ``stream``, ``upstream`` (configured URLs), ``kind``.
- Nothing is looked up per chunk. The relay counts inter-token gaps into a ``GapCounts`` (one
  bisect per upstream read) and ``observe_completion`` adds them to the histogram once, at the
  end of the request, with the request's other figures: labelled children are resolved once
  per request.
- Known label values start at zero (Prometheus's "avoid missing metrics"): every rejection
  kind, and every failure kind of every configured upstream, is exported before the first
  event, so ``rate()`` and alerts see the series from the start. The ``_created`` series
  prometheus-client adds to counters and histograms are off (they double the series count and
  no dashboard here reads them).
- Several workers (``--workers N``): prometheus-client's multiprocess mode, selected by
  ``PROMETHEUS_MULTIPROC_DIR`` (``thinkgate serve`` sets it); counters and histograms add up
  across workers, each gauge says how (``multiprocess_mode``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.multiprocess import MultiProcessCollector

from audit.record import Usage
from audit.writer import WriterEvent
from gateway.errors import (
    GatewayError,
    RateLimited,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from gateway.ledger.record import CompletionRecord
from gateway.spend.prices import Prices

# 1 ms to 60 s: inter-token gaps of a fast engine up to a reasoning model's first token.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
OTHER = "other"
_KINDS: dict[type[UpstreamError], str] = {
    UpstreamConnectError: "connect", UpstreamTimeout: "timeout", UpstreamProtocolError: "protocol",
}  # fmt: skip
FAILURE_KINDS = ("connect", "timeout", "protocol", "status")
REJECTION_KINDS = ("requests", "tokens", "kv_budget")


@dataclass(slots=True)
class GapCounts:
    """Inter-token gaps of one request, counted into the latency buckets as they come."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    last: float | None = None

    def tick(self, now: float) -> None:
        """An upstream read arrived at ``now``: the gap since the previous one is counted."""
        if self.last is not None:
            gap = now - self.last
            self.counts[bisect.bisect_left(LATENCY_BUCKETS, gap)] += 1
            self.total += gap
        self.last = now


@dataclass(slots=True)
class TenantLabels:
    """Tenant label values: named tenants always, the first ``limit`` others, then ``other``."""

    named: frozenset[str]
    limit: int
    seen: set[str] = field(default_factory=set)

    def __call__(self, tenant: str) -> str:
        if tenant in self.named or tenant in self.seen:
            return tenant
        if len(self.seen) < self.limit:
            self.seen.add(tenant)
            return tenant
        return OTHER


class Metrics:
    def __init__(
        self, tenants: Iterable[str] = (), tenant_limit: int = 20, *, multiprocess: bool = False
    ) -> None:
        """``multiprocess``: ``PROMETHEUS_MULTIPROC_DIR`` is set (prometheus-client reads it
        itself to keep values in files; here it decides what ``/metrics`` serves)."""
        disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = multiprocess
        self.tenant = TenantLabels(frozenset(tenants), tenant_limit)
        self._cache: dict[tuple[str, str, bool, str, str], _Children] = {}
        r = self.registry
        self._exchanges(r)
        self._upstream_errors_and_admission(r)
        self._ledger(r)
        self._engines(r)
        self._siem(r)
        self._batches(r)
        if not self.multiprocess:
            ProcessCollector(registry=r)
        for kind in REJECTION_KINDS:
            self.rejections.labels(kind)

    def _exchanges(self, r: CollectorRegistry) -> None:
        """Requests, latencies, tokens, disconnects: one per exchange."""
        self.requests = Counter("thinkgate_requests", "Completions by API and outcome.",
                                ["model", "tenant", "status", "stream", "endpoint"],
                                registry=r)  # fmt: skip
        self.duration = Histogram(
            "thinkgate_request_duration_seconds", "From request to the last byte.",
            ["model", "tenant", "stream"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "thinkgate_time_to_first_token_seconds",
            "From request to the first token from the model, reasoning included.",
            ["model", "tenant"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttfc = Histogram(
            "thinkgate_time_to_first_content_token_seconds",
            "From request to the first answer token (after the reasoning): what a client whose "
            "reasoning is hidden waits for.",
            ["model", "tenant"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram("thinkgate_inter_token_latency_seconds",
                             "Gaps between the model's streamed chunks.", ["model"],
                             buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.prompt_tokens = Counter("thinkgate_prompt_tokens", "Prompt tokens (upstream usage).",
                                     ["model", "tenant"], registry=r)  # fmt: skip
        self.engine_prompt_tokens = Counter(
            "thinkgate_upstream_prompt_tokens", "Prompt tokens per engine (its usage).",
            ["upstream"], registry=r)  # fmt: skip
        self.prefix_cache_hits = Counter(
            "thinkgate_prefix_cache_hit_tokens",
            "Prompt tokens an engine found in its prefix cache (its cached_tokens).",
            ["upstream"], registry=r)  # fmt: skip
        self.routing = Counter(
            "thinkgate_routing_decisions", "How the first engine was chosen: prefix (the "
            "cached prompt), session (a session's engine), load (the least loaded).",
            ["reason"], registry=r)  # fmt: skip
        self.reasoning_tokens = Counter("thinkgate_reasoning_tokens", "Reasoning tokens.",
                                        ["model", "tenant"], registry=r)  # fmt: skip
        self.content_tokens = Counter("thinkgate_content_tokens",
                                      "Answer tokens (completion minus reasoning).",
                                      ["model", "tenant"], registry=r)  # fmt: skip
        self.reasoning_ratio = Histogram(
            "thinkgate_reasoning_ratio", "Share of a completion's tokens spent reasoning.",
            ["model"], buckets=RATIO_BUCKETS, registry=r,
        )  # fmt: skip

    def _upstream_errors_and_admission(self, r: CollectorRegistry) -> None:
        """Engines' failures, the limits' refusals, the KV budget, request fields and guardrails."""
        self.upstream_errors = Counter("thinkgate_upstream_errors",
                                       "Failures of a model server, by kind.",
                                       ["upstream", "kind"], registry=r)  # fmt: skip
        self.disconnects = Counter("thinkgate_client_disconnects",
                                   "Clients that went away before the end.",
                                   ["model", "tenant"], registry=r)  # fmt: skip
        self.rejections = Counter("thinkgate_ratelimit_rejections",
                                  "Requests refused by a limit: requests, tokens, kv_budget, "
                                  "budget (money).",
                                  ["kind"], registry=r)  # fmt: skip
        self.fallback = Gauge(
            "thinkgate_ratelimit_fallback_active",
            "1 while Redis is away and this replica limits in process (RATELIMIT_FAIL=open).",
            ["backend"], registry=r, multiprocess_mode="max",
        )  # fmt: skip
        self.kv_budget = Gauge(
            "thinkgate_kv_budget_tokens",
            "KV budget per engine: capacity, admitted limit (AIMD), reserved by leases.",
            ["upstream", "state"], registry=r, multiprocess_mode="mostrecent",
        )  # fmt: skip
        self.unknown_fields = Counter(
            "thinkgate_unknown_fields",
            "Request fields no API reference names, accepted (UNKNOWN_FIELDS=ignore); the "
            "first 100 names a process sees are labelled, the rest are `other`.",
            ["endpoint", "field"], registry=r,
        )  # fmt: skip
        self.field_names = TenantLabels(frozenset(), 100)
        self.guardrail_actions = Counter(
            "thinkgate_guardrail_actions",
            "Matches a guardrail policy acted on (GUARDRAILS_FILE), by policy, action "
            "(redact, block, flag) and scope (reasoning, answer).",
            ["policy", "action", "scope"], registry=r,
        )  # fmt: skip
        self.guard_model = Histogram(
            "thinkgate_guard_model_seconds",
            "Time a guard model took to judge a text (GUARDRAILS_FILE), by policy and outcome "
            "(safe, unsafe, error).",
            ["policy", "outcome"], registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )  # fmt: skip
        self.admission_wait = Histogram("thinkgate_admission_wait_seconds",
                                        "Time a request waited for KV budget.",
                                        buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip

    def _ledger(self, r: CollectorRegistry) -> None:
        """The audit ledger's writer."""
        self.ledger_records = Counter(
            "thinkgate_ledger_records", "Records committed to the audit ledger.", registry=r
        )
        self.ledger_replica_lost = Counter(
            "thinkgate_ledger_replica_lost",
            "Records this replica appended for exchanges whose replica died first "
            "(write-ahead intents, status replica_lost).", registry=r,
        )  # fmt: skip
        self.ledger_commit = Histogram("thinkgate_ledger_commit_seconds",
                                       "One group commit of the ledger writer.",
                                       buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.ledger_spool = Gauge("thinkgate_ledger_spool_records",
                                  "Sealed records waiting in the spool for the database.",
                                  registry=r, multiprocess_mode="livesum")  # fmt: skip
        self.ledger_tree_size = Gauge("thinkgate_ledger_tree_size",
                                      "Records in the ledger's Merkle tree.", registry=r,
                                      multiprocess_mode="max")  # fmt: skip
        self.ledger_checkpoint = Gauge(
            "thinkgate_ledger_last_checkpoint_timestamp_seconds",
            "When the last signed checkpoint was written (Unix time).", registry=r,
            multiprocess_mode="max",
        )  # fmt: skip

    def _engines(self, r: CollectorRegistry) -> None:
        """The gateway's own overhead, and what each engine reports."""
        self.overhead = Histogram(
            "thinkgate_overhead_seconds",
            "Time spent inside the gateway per request, waiting for the upstream excluded.",
            ["stream"], buckets=OVERHEAD_BUCKETS, registry=r,
        )  # fmt: skip
        self.upstream_kv_usage = Gauge(
            "thinkgate_upstream_kv_cache_usage_ratio", "The engine's own KV-cache usage (0..1).",
            ["upstream"], registry=r, multiprocess_mode="mostrecent",
        )  # fmt: skip
        self.upstream_waiting = Gauge(
            "thinkgate_upstream_requests_waiting", "Requests queued inside the engine.",
            ["upstream"], registry=r, multiprocess_mode="mostrecent",
        )  # fmt: skip
        self.upstream_healthy = Gauge(
            "thinkgate_upstream_healthy", "1 while the engine is in rotation.",
            ["upstream"], registry=r, multiprocess_mode="min",
        )  # fmt: skip

    def _siem(self, r: CollectorRegistry) -> None:
        """The SIEM export."""
        self.siem_events = Counter(
            "thinkgate_siem_events", "OCSF events the SIEM export handed to each sink (syslog, "
            "file, hec), by outcome: sent, or failed (the batch is retried).",
            ["sink", "outcome"], registry=r,
        )  # fmt: skip
        self.siem_dropped = Counter(
            "thinkgate_siem_dropped_events", "Ledger records the SIEM export skipped: its "
            "backlog exceeded SIEM_MAX_BACKLOG.", registry=r,
        )  # fmt: skip
        self.siem_backlog = Gauge(
            "thinkgate_siem_backlog_records", "Checkpointed ledger records not yet exported to "
            "the SIEM (reported by the replica holding the export's lease; 0 elsewhere).",
            registry=r, multiprocess_mode="max",
        )  # fmt: skip

    def spent(self, tenant: str, model: str, usage: Usage | None, prices: Prices | None) -> None:
        """Count what an exchange cost, when there are prices and they price its model."""
        cost = None if prices is None else prices.cost(model, usage)
        if cost is not None and prices is not None:
            self.spend.labels(tenant, model, prices.currency).inc(float(cost))

    def _batches(self, r: CollectorRegistry) -> None:
        """Batches (docs/batches.md)."""
        self.batch_lines = Gauge(
            "thinkgate_batch_lines", "Batch lines not ended, every replica's, by state: queued "
            "or running (read from the database by each replica).",
            ["state"], registry=r, multiprocess_mode="max",
        )  # fmt: skip
        self.batch_lines_done = Counter(
            "thinkgate_batch_lines_done", "Batch lines this replica ran to their end, by "
            "outcome: succeeded, errored, canceled, expired.", ["outcome"], registry=r,
        )  # fmt: skip
        self.batch_lines_shed = Counter(
            "thinkgate_batch_lines_shed", "Batch lines admission refused for now (the "
            "cluster's capacity is taken, or a limit): put back in the queue.", registry=r,
        )  # fmt: skip
        self.batch_oldest_age = Gauge(
            "thinkgate_batch_oldest_age_seconds", "How long ago the oldest batch in progress "
            "was created (0 with none).", registry=r, multiprocess_mode="max",
        )  # fmt: skip
        self.spend = Counter(
            "thinkgate_spend", "What exchanges cost, by tenant, model and currency (PRICES_FILE; "
            "the ledger's records hold each cost exactly: docs/spend.md).",
            ["tenant", "model", "currency"], registry=r,
        )  # fmt: skip
        self.budget_used = Gauge(
            "thinkgate_budget_used_ratio", "What each budget's subject spent and holds reserved "
            "in its current window, over the budget (1: spent; the ThinkgateBudget alerts).",
            ["scope", "subject", "period"], registry=r, multiprocess_mode="max",
        )  # fmt: skip
        for state in ("queued", "running"):
            self.batch_lines.labels(state)
        for outcome in ("succeeded", "errored", "canceled", "expired"):
            self.batch_lines_done.labels(outcome)

    def know_upstreams(self, urls: Iterable[str]) -> None:
        """Export every failure kind of these upstreams at zero, and their tokens."""
        for url in urls:
            for kind in FAILURE_KINDS:
                self.upstream_errors.labels(url, kind)
            self.engine_prompt_tokens.labels(url)
            self.prefix_cache_hits.labels(url)
        for reason in ("prefix", "session", "load"):
            self.routing.labels(reason)

    def siem_sinks(self, names: Iterable[str]) -> None:
        """Export both outcomes of these SIEM sinks at zero."""
        for name in names:
            for outcome in ("sent", "failed"):
                self.siem_events.labels(name, outcome)

    def exposition_registry(self) -> CollectorRegistry:
        """What ``/metrics`` serves: this process's registry, or every worker's figures."""
        if not self.multiprocess:
            return self.registry
        merged = CollectorRegistry()
        MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        return merged

    def ledger_event(self, event: WriterEvent) -> None:
        if event.committed:
            self.ledger_records.inc(event.committed)
        if event.commit_seconds is not None:
            self.ledger_commit.observe(event.commit_seconds)
        self.ledger_tree_size.set(event.tree_size)
        self.ledger_spool.set(event.spool_pending)
        if event.last_checkpoint_at is not None:
            self.ledger_checkpoint.set(event.last_checkpoint_at)

    # -- per request ---------------------------------------------------------------------

    def observe_completion(self, done: CompletedRequest) -> None:
        record = done.record
        c = self._children(record.model, self.tenant(record.tenant), record.stream, done.status,
                           record.endpoint)  # fmt: skip
        c.requests.inc()
        # a traced request's trace id on the latency histograms (OpenMetrics exemplars)
        exemplar = {"trace_id": done.trace_id} if done.trace_id else None
        c.duration.observe(record.ended_at - record.started_at, exemplar)
        c.overhead.observe(done.overhead_s)
        if record.first_token_at is not None:
            c.ttft.observe(record.first_token_at - record.started_at, exemplar)
        if done.first_content_at is not None:
            c.ttfc.observe(done.first_content_at - record.started_at)
        if done.gaps is not None and done.gaps.last is not None:
            add_counts(c.itl, done.gaps)
        if record.client_disconnected:
            c.disconnects.inc()
        self._tokens(record, c)

    def _children(
        self, model: str, tenant: str, stream: bool, status: str, endpoint: str
    ) -> _Children:
        """The labelled children of one (model, tenant, stream, status, endpoint), made once:
        label lookups cost more than the observations themselves."""
        key = (model, tenant, stream, status, endpoint)
        found = self._cache.get(key)
        if found is None:
            flag = "true" if stream else "false"
            found = self._cache[key] = _Children(
                requests=self.requests.labels(model, tenant, status, flag, endpoint),
                duration=self.duration.labels(model, tenant, flag),
                overhead=self.overhead.labels(flag),
                ttft=self.ttft.labels(model, tenant),
                ttfc=self.ttfc.labels(model, tenant),
                itl=self.itl.labels(model),
                disconnects=self.disconnects.labels(model, tenant),
                prompt=self.prompt_tokens.labels(model, tenant),
                reasoning=self.reasoning_tokens.labels(model, tenant),
                content=self.content_tokens.labels(model, tenant),
                ratio=self.reasoning_ratio.labels(model),
            )
        return found

    def _tokens(self, record: CompletionRecord, c: _Children) -> None:
        usage = record.usage
        if usage is None:
            return
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        reasoning = usage.reasoning_tokens
        if prompt:
            c.prompt.inc(prompt)
        if reasoning:
            c.reasoning.inc(reasoning)
        if completion - reasoning:
            c.content.inc(completion - reasoning)
        if completion:
            c.ratio.observe(reasoning / completion)
        if record.upstream is not None and prompt:
            self.engine_prompt_tokens.labels(record.upstream).inc(prompt)
            if usage.cached_tokens:
                self.prefix_cache_hits.labels(record.upstream).inc(usage.cached_tokens)

    def refused(
        self, error: GatewayError, model: str, tenant: str, stream: bool,
        endpoint: str = "chat.completions",
    ) -> None:  # fmt: skip
        """A request that ended before it reached an upstream: invalid, rate-limited, ..."""
        if isinstance(error, RateLimited):
            kind = _REFUSED_BY.get(error.code or "", error.type)
            self.rejections.labels(kind).inc()
        flag = "true" if stream else "false"
        status = refusal_status(error)
        self.requests.labels(model, self.tenant(tenant), status, flag, endpoint).inc()

    def guardrail_acted(self, policy: str, action: str, scope: str) -> None:
        self.guardrail_actions.labels(policy, action, scope).inc()

    def guard_model_answered(self, policy: str, outcome: str, seconds: float) -> None:
        self.guard_model.labels(policy, outcome).observe(seconds)

    def unknown(self, endpoint: str, names: Iterable[str]) -> list[str]:
        """Count unknown fields by name; the names labelled for the first time (the caller
        logs each once, not per request; past the first 100 names, none is)."""
        new = []
        for name in names:
            first = name not in self.field_names.seen
            label = self.field_names(name)
            if first and label == name:
                new.append(name)
            self.unknown_fields.labels(endpoint, label).inc()
        return new

    def upstream_failed(self, upstream: str, error: UpstreamError) -> None:
        self.upstream_errors.labels(upstream, _KINDS.get(type(error), "status")).inc()


@dataclass(frozen=True, slots=True)
class _Children:
    requests: Any
    duration: Any
    overhead: Any
    ttft: Any
    ttfc: Any
    itl: Any
    disconnects: Any
    prompt: Any
    reasoning: Any
    content: Any
    ratio: Any


@dataclass(frozen=True, slots=True)
class CompletedRequest:
    """One request's figures beyond its ledger record."""

    record: CompletionRecord
    status: str
    overhead_s: float
    first_content_at: float | None = None  # wall clock, like the record's times
    gaps: GapCounts | None = None
    trace_id: str | None = None  # when the request was traced and sampled (its exemplar)


_REFUSED_BY = {"kv_budget_exhausted": "kv_budget", "budget_exceeded": "budget"}


def refusal_status(error: GatewayError) -> str:
    """The ``status`` of a request refused before any upstream answered it: its outcome."""
    return error.outcome


def add_counts(child: Histogram, gaps: GapCounts) -> None:
    """Add a request's counted gaps to a histogram child at once: what ``observe`` would have
    done for each gap (prometheus-client keeps non-cumulative bucket values and sums them at
    exposition; the last count is above every bound, the ``+Inf`` bucket)."""
    buckets: list[Any] = child._buckets
    for index, count in enumerate(gaps.counts):
        if count:
            buckets[index].inc(count)
    child._sum.inc(gaps.total)
