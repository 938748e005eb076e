"""One completion's life in the shell, whatever API it came through: timing, outcome, and
the single ``finish``.

An ``Exchange`` knows its request only as ``Forwarded`` (the model, the body sent upstream and
what the record keeps of it), the ``endpoint`` it came through (``chat.completions``, written
into the record) and the upstream ``path`` it goes to.

``finish`` settles the rate limit and hands the record to the ledger exactly once, however the
request ended (completed, upstream error, client disconnect). It runs as its own task, shielded
from its callers' cancellation, so a client that goes away cannot make a completion vanish
from the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from audit.intents import Progress
from gateway.admission.gate import Gate, Ticket
from gateway.auth.keys import KeyInfo
from gateway.errors import GatewayError, UpstreamError
from gateway.ledger.record import (
    CompletionRecord,
    RecordSink,
    RequestPart,
    Status,
    Usage,
    parse_usage,
    status_of,
)
from gateway.relay.choice import ChoiceState
from gateway.relay.guarding import GuardAct
from gateway.relay.rewrite import Rewriter
from gateway.spend.prices import Prices
from gateway.telemetry.logs import log_completion
from gateway.telemetry.metrics import CompletedRequest, GapCounts, Metrics

if TYPE_CHECKING:
    from gateway.exchange.screening import ScreenPlan
    from gateway.telemetry.spans import ExchangeSpan

log = logging.getLogger("thinkgate")


class Forwarded(Protocol):
    """What the exchange needs of a parsed request, whatever its API."""

    @property
    def model(self) -> str: ...
    @property
    def stream(self) -> bool: ...
    @property
    def messages(self) -> list[Any]: ...
    @property
    def params(self) -> dict[str, Any]: ...
    @property
    def upstream_body(self) -> bytes: ...


@dataclass(slots=True)
class Exchange:
    request_id: str
    key: KeyInfo
    request: Forwarded
    endpoint: str  # the API it came through: "chat.completions"
    path: str  # the upstream path it goes to: "/chat/completions"
    rewriter: Rewriter
    ticket: Ticket
    gate: Gate
    sink: RecordSink
    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    upstream: str | None = None
    status: Status = "error"
    error_code: str | None = None
    client_disconnected: bool = False
    metrics: Metrics | None = None
    traceparent: str | None = None
    overhead_s: float = 0.0  # inside the gateway, waiting for the upstream excluded
    first_content_at: float | None = None
    gaps: GapCounts = field(default_factory=GapCounts)
    # run with the record once the completion ended ok (the Responses API stores it there)
    after: Callable[[CompletionRecord], Awaitable[None]] | None = None
    # response headers the request's parse decided (x-thinkgate-ignored, a clamped max_tokens)
    notes: tuple[tuple[str, str], ...] = ()
    prompt_acts: tuple[GuardAct, ...] = ()  # what guardrail policies did to the prompt
    request_part: RequestPart | None = None  # the record's request part, encoded at admission
    screen: ScreenPlan | None = None  # guard models over the output (exchange.screening)
    span: ExchangeSpan | None = None  # its OpenTelemetry spans (telemetry.tracing), if traced
    intention: Any = None  # its write-ahead intent, once queued (``RecordSink.intend``)
    batch: tuple[str, str] | None = None  # (batch id, custom_id) when it is a batch's line
    prices: Prices | None = None  # PRICES_FILE's: what it cost, counted in the metrics
    _finishing: asyncio.Future[None] | None = None

    async def intend(self) -> None:
        """Seal and queue the exchange's write-ahead intent (``audit.intents``), committed at
        once; nothing waits for it here: ``confirm`` does, once the engine's first bytes are
        in. Run as the request goes to the engine, so the engine's time to first token hides
        the sealing and the commit. Raises what the record would (its key unavailable)."""
        self.intention = await self.sink.intend(self._record(), self.progress)

    async def confirm(self) -> None:
        """Return once the intent is durable (before the answer's first byte goes out)."""
        if self.intention is not None:
            await self.sink.confirm(self.intention)

    def progress(self) -> Progress:
        """What a heartbeat tells of the running exchange (what a ``replica_lost`` record
        would say if this replica died now): the engine, the first token, tokens so far."""
        choices = self.rewriter.choices
        completion = sum(c.deltas for c in choices.values())
        reasoning = sum(c.reasoning_tokens for c in choices.values())
        return Progress(self.upstream, self.first_token_at,
                        len(self.request.upstream_body) // 4, completion, reasoning,
                        time.time())  # fmt: skip

    def mark_first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = self.started_at + (time.perf_counter() - self.t0)

    def mark_first_content(self) -> None:
        if self.first_content_at is None:
            self.first_content_at = self.started_at + (time.perf_counter() - self.t0)

    def observe_read(self, arrived: float) -> None:
        """One upstream read, which arrived at ``arrived``, was processed: count its gap, note
        the first answer text, add the time it cost (nothing when not measured)."""
        if self.metrics is None:
            return
        self.gaps.tick(arrived)
        if self.first_content_at is None and self.rewriter.has_content:
            self.mark_first_content()
        self.overhead_s += time.perf_counter() - arrived

    def fail(self, error: GatewayError) -> None:
        self.status = status_of(error.outcome)
        self.error_code = error.code
        upstream_fault = isinstance(error, UpstreamError) and error.outcome != "invalid"
        if self.metrics is not None and upstream_fault and self.upstream:
            self.metrics.upstream_failed(self.upstream, error)  # type: ignore[arg-type]

    def disconnected(self) -> None:
        self.client_disconnected = True
        self.status = "client_disconnected"

    @property
    def upstream_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """This request's own headers for the upstream: the trace context (the gateway's
        upstream span's when traced, else the caller's as it came)."""
        traceparent = self.traceparent
        if self.span is not None:
            traceparent = self.span.upstream_traceparent() or traceparent
        if traceparent is None:
            return ()
        return ((b"traceparent", traceparent.encode()),)

    @property
    def finishing(self) -> bool:
        """Whether the record is already on its way (its outcome is then fixed)."""
        return self._finishing is not None

    def finish(self) -> Awaitable[None]:
        """Settle and record, once: every caller awaits the same shielded task, so neither a
        second call nor a cancelled caller can repeat or interrupt it."""
        if self._finishing is None:
            self._finishing = asyncio.ensure_future(self._settle_and_record())
        return asyncio.shield(self._finishing)

    async def _settle_and_record(self) -> None:
        """Refund, release and record at once (with Redis, the first two share one round
        trip). Only the record's fate reaches the caller: a settlement that fails (Redis away)
        costs the client nothing, since unrefunded tokens refill and a lease expires."""
        record = self._record()
        if self.metrics is not None:
            done = CompletedRequest(
                record,
                record.status,
                self.overhead_s,
                self.first_content_at,
                self.gaps,
                self.span.trace_id if self.span is not None else None,
            )
            self.metrics.observe_completion(done)
            for _, act in record.guardrails:
                self.metrics.guardrail_acted(act.policy, act.action, act.channel)
            self.metrics.spent(record.tenant, record.model, record.usage, self.prices)
        log_completion(record, overhead_s=self.overhead_s, first_content_at=self.first_content_at)
        # What the engine produced, never the reservation: a request that failed or was left
        # before its first token is charged its prompt alone (``_counted``), so an engine
        # outage does not drain every client's token budget.
        used = record.usage.total_tokens if record.usage is not None else 0
        # The record (a ledger commit) runs beside the settlement: one task, not a gather's
        # two; the settlement runs here, and collects its own failures.
        committing, committed = time.time(), [0.0]
        recording = asyncio.ensure_future(self.sink.submit(record))
        recording.add_done_callback(lambda _: committed.__setitem__(0, time.time()))
        keeping = (asyncio.ensure_future(self.after(record))
                   if self.after is not None and record.status == "ok" else None)  # fmt: skip
        failures = await self._settle(record, used)
        for failure in failures:
            log.warning("settling request %s failed: %s", self.request_id, type(failure).__name__)
        if keeping is not None:
            try:
                await keeping
            except Exception as exc:  # the record has the exchange, so nothing is lost
                log.warning("keeping request %s failed: %s", self.request_id,
                            type(exc).__name__)  # fmt: skip
        refused: str | None = None
        try:
            await recording
        except GatewayError as exc:
            refused = exc.code or "ledger_unavailable"
            raise
        finally:
            if self.span is not None:
                try:
                    self._traced(self.span, record, (committing, committed[0] or time.time()),
                                 refused)  # fmt: skip
                except Exception:  # tracing never costs a request its answer or its record
                    log.exception("tracing request %s failed", self.request_id)

    async def _settle(self, record: CompletionRecord, used: int) -> list[BaseException]:
        """The rate limits (tokens, and the budgets' money by the usage) and the KV lease: what
        the engine produced (with Redis, in one pipelined round trip)."""
        try:
            return list(await self.gate.settle(self.ticket, used, record.usage))
        except Exception as exc:
            return [exc]

    def _traced(self, span: ExchangeSpan, record: CompletionRecord,
                commit: tuple[float, float], refused: str | None) -> None:  # fmt: skip
        """End the request's spans with what its record says (never its text); ``refused``:
        the ledger refused the record (the request then failed)."""
        from gateway.telemetry.spans import Outcome  # loaded with tracing (``span`` is its)

        span.ledger(*commit)
        if record.first_token_at is not None:
            span.event("gen_ai.first_token", record.first_token_at)
        if self.first_content_at is not None and record.usage and record.usage.reasoning_tokens:
            span.event("thinkgate.reasoning.end", self.first_content_at)
        usage = record.usage
        span.finish(Outcome(
            tenant=record.tenant, key_id=record.key_id,
            status="error" if refused else record.status,
            error_code=refused or record.error_code, stream=record.stream,
            upstream=record.upstream,
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
            reasoning_tokens=usage.reasoning_tokens if usage else 0,
            finish_reasons=record.finish_reasons, started_at=record.started_at,
            first_token_at=record.first_token_at, ended_at=record.ended_at,
        ))  # fmt: skip

    def _counted(self, choices: list[ChoiceState]) -> Usage:
        """The usage of an exchange the engine never reported on (the client left, it broke
        off, it failed before the first byte): the engine spent what it streamed, and the
        prompt when nothing was, so that is counted, recorded and settled."""
        return _streamed_usage(len(self.request.upstream_body) // 4, choices)

    def _finish_reasons(self, choices: list[ChoiceState]) -> tuple[str | None, ...]:
        """Each choice's finish reason; after a disconnect an unfinished choice's is
        ``client_disconnected`` (a request that made no choice yet has one such)."""
        if not self.client_disconnected:
            return tuple(c.finish_reason for c in choices)
        return tuple(c.finish_reason or "client_disconnected" for c in choices) or (
            "client_disconnected",
        )

    def _record(self) -> CompletionRecord:
        choices = [self.rewriter.choices[i] for i in sorted(self.rewriter.choices)]
        return CompletionRecord(
            request_id=self.request_id,
            tenant=self.key.tenant,
            key_id=self.key.key_id,
            endpoint=self.endpoint,
            model=self.request.model,
            upstream=self.upstream,
            stream=self.request.stream,
            started_at=self.started_at,
            first_token_at=self.first_token_at,
            ended_at=self.started_at + (time.perf_counter() - self.t0),
            status=self.status,
            error_code=self.error_code,
            client_disconnected=self.client_disconnected,
            usage=parse_usage(self.rewriter.usage) or self._counted(choices),
            finish_reasons=self._finish_reasons(choices),
            messages=self.request.messages,
            params=self.request.params,
            reasoning=tuple("".join(c.reasoning) for c in choices),
            content=tuple("".join(c.content) for c in choices),
            traceparent=self.traceparent,
            reasoning_format=self.rewriter.policy.format.name,
            thinking=self.rewriter.policy.thinking,
            tool_calls=_tool_calls(choices),
            guardrails=(*((None, act) for act in self.prompt_acts),
                        *((i, act) for i, c in enumerate(choices) if c.guard is not None
                          for act in c.guard.acts)),
            intent=getattr(self.intention, "id", None),
            batch=self.batch,
            request=self.request_part,
        )  # fmt: skip


def _streamed_usage(prompt_estimate: int, choices: list[ChoiceState]) -> Usage:
    """What was streamed, counted by the gateway: one token per upstream delta (vLLM's), the
    prompt estimated (bytes / 4); the prompt alone when nothing was."""
    completion = sum(c.deltas for c in choices)
    reasoning = min(sum(c.reasoning_tokens for c in choices), completion)
    return Usage(prompt_estimate, completion, reasoning, prompt_estimate + completion,
                 counted=True)  # fmt: skip


def _tool_calls(choices: list[ChoiceState]) -> tuple[tuple[dict[str, str], ...], ...] | None:
    calls = tuple(tuple(call.as_dict() for call in c.tools.calls) for c in choices)
    return calls if any(calls) else None
