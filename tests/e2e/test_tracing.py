"""OpenTelemetry end to end: a real OTLP/HTTP receiver (``tests/otlp.py``, decoding the
protobuf) gets the gateway's spans and GenAI metrics for chat, Responses and Messages,
checked against the GenAI semantic conventions; the caller's trace is continued and handed to
the engine; and no exported byte carries a prompt, reasoning or answer, or a key's secret."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import httpx
import openai
import pytest

from gateway.edge.servers import BackgroundServer
from tests.e2e.conftest import Stack, StackFactory
from tests.e2e.scripted import Scripted
from tests.otlp import Receiver, Span
from tests.waiting import eventually

# markers planted in everything a span must never carry
PROMPT, REASONING, ANSWER = "prompt-marker-q7", "reasoning-marker-k2", "answer-marker-z9"
CHUNKS = [f"Think {REASONING}", " more.", "</think>", f"\n\nSay {ANSWER}", " done."]
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SERVER, CLIENT = 2, 3  # OTLP's SpanKind numbers


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Receiver]:
    received = Receiver()
    async with BackgroundServer(received) as server:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "thinkgate-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export spans every 50 ms
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
        yield received


async def traffic(stack: Stack) -> None:
    """A streamed chat request with the caller's trace context, a Responses request and a
    Messages request, by the visible key."""
    question = [{"role": "user", "content": f"Explain {PROMPT}"}]
    caller = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0, default_headers=caller) as client:  # fmt: skip
        stream = await client.chat.completions.create(model="deepseek-r1", messages=question,  # type: ignore[arg-type]
                                                      stream=True)  # fmt: skip
        [c async for c in stream]
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        await client.responses.create(model="deepseek-r1", input=f"Explain {PROMPT}")
    async with anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["visible"],
                                        max_retries=0) as claude:  # fmt: skip
        await claude.messages.create(model="deepseek-r1", max_tokens=200, messages=question)  # type: ignore[arg-type]


def servers(received: Receiver) -> list[Span]:
    return [s for s in received.spans if s.kind == SERVER]


async def test_spans_follow_the_genai_conventions_and_continue_the_callers_trace(
    receiver: Receiver, stack_factory: StackFactory
) -> None:  # the receiver first: it outlives the stack, whose exit flushes the last spans
    engine = Scripted({"chunks": CHUNKS})
    stack = await stack_factory(upstream_apps=[engine])
    await traffic(stack)
    await eventually(lambda: len(servers(receiver)) >= 3
                     and sum(s.name == "thinkgate.ledger.commit" for s in receiver.spans) >= 3,
                     within_s=10)  # fmt: skip
    by_endpoint = {s.attributes["thinkgate.endpoint"]: s for s in servers(receiver)}
    assert set(by_endpoint) == {"chat.completions", "responses", "messages"}
    for endpoint, server in by_endpoint.items():
        a = server.attributes
        assert server.name == "chat deepseek-r1" and server.service == "thinkgate-test"
        assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"]) == ("chat", "vllm")
        assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "deepseek-r1"
        assert a["gen_ai.usage.input_tokens"] > 0
        assert a["gen_ai.usage.output_tokens"] > a["gen_ai.usage.reasoning.output_tokens"] > 0
        assert a["gen_ai.response.finish_reasons"] == ["stop"], endpoint
        assert a["thinkgate.status"] == "ok" and a["gen_ai.response.id"]
        assert server.events == ["gen_ai.first_token", "thinkgate.reasoning.end"]
        children = {s.name: s for s in receiver.spans if s.parent_span_id == server.span_id}
        assert set(children) == {"thinkgate.admission", "thinkgate.upstream",
                                 "thinkgate.ledger.commit"}, endpoint  # fmt: skip
        assert children["thinkgate.upstream"].kind == CLIENT
        assert all(c.trace_id == server.trace_id for c in children.values())
    chat = by_endpoint["chat.completions"]
    assert (chat.trace_id, chat.parent_span_id) == (CALLER_TRACE, CALLER_SPAN)
    # the engine got the trace: same trace id, its parent the gateway's upstream span
    upstream = next(s for s in receiver.spans if s.name == "thinkgate.upstream"
                    and s.parent_span_id == chat.span_id)  # fmt: skip
    sent = engine.headers[0]["traceparent"].split("-")
    assert (sent[1], sent[2]) == (CALLER_TRACE, upstream.span_id)
    assert by_endpoint["responses"].trace_id != CALLER_TRACE  # no caller context: a new trace
    # the latency histograms carry the traced requests' trace ids as exemplars (OpenMetrics)
    async with httpx.AsyncClient(base_url=stack.root) as http:
        scrape = await http.get("/metrics", headers={"accept": "application/openmetrics-text"})
        plain = (await http.get("/metrics")).text
    assert scrape.headers["content-type"].startswith("application/openmetrics-text")
    exemplars = [line for line in scrape.text.splitlines()
                 if line.startswith("thinkgate_request_duration_seconds_bucket")
                 and f'# {{trace_id="{CALLER_TRACE}"}}' in line]  # fmt: skip
    assert exemplars, "no exemplar with the chat request's trace id"
    assert "trace_id" not in plain  # the Prometheus text format has none


async def test_genai_metrics_are_exported_and_nothing_exported_carries_content_or_secrets(
    receiver: Receiver, stack_factory: StackFactory
) -> None:
    stack = await stack_factory(upstream_apps=[Scripted({"chunks": CHUNKS})])
    await traffic(stack)
    wanted = {"gen_ai.client.token.usage", "gen_ai.server.time_to_first_token",
              "gen_ai.server.time_per_output_token", "gen_ai.server.request.duration"}  # fmt: skip
    await eventually(lambda: wanted <= {m["name"] for m in receiver.metrics}
                     and len(servers(receiver)) >= 3, within_s=10)  # fmt: skip
    usage = [m for m in receiver.metrics if m["name"] == "gen_ai.client.token.usage"][-1]
    types = {a["value"]["stringValue"] for point in usage["histogram"]["dataPoints"]
             for a in point["attributes"] if a["key"] == "gen_ai.token.type"}  # fmt: skip
    assert types == {"input", "output", "reasoning"}
    exported = b"".join(receiver.raw)
    for secret in (PROMPT, REASONING, ANSWER, *stack.keys.values()):
        assert secret.encode() not in exported, secret
    assert b"deepseek-r1" in exported  # the search does see what is there
