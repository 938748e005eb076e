"""What an operator sees, on real sockets: ``/metrics`` after mixed traffic (every metric of the
catalogue in ``gateway.telemetry.metrics``), its bearer token and second listener, the caller's
``traceparent`` on its way upstream and into the ledger, the access log (one line per request,
never a text), and ``serve --workers 2`` adding its workers' figures up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import Receive, Scope, Send

from gateway.auth.keys import split_key
from gateway.cli import workers
from gateway.cli.keys import open_store
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from gateway.telemetry.logs import JsonFormatter
from gateway.telemetry.metrics import Metrics
from tests.e2e.conftest import Stack, StackFactory, ledger_files, make_keys
from tests.e2e.processes import gateway_env
from tests.e2e.test_rate_limits import limited_key
from tests.gateway.cli.test_main import free_port
from tests.waiting import eventually

MODEL = "deepseek-r1"
BROKEN = "broken-r1"
CAPACITY = 32768  # a multiple of the block size: the gateway reads it back exactly
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# A short scripted answer (the simulator's own runs to ~270 tokens): reasoning, then content.
CHUNKS: list[Any] = [["reasoning", "Let"], ["reasoning", " me"], ["reasoning", " think."],
                     "The", " answer", " is", " 4."]  # fmt: skip

Labels = tuple[tuple[str, str], ...]


# -- reading /metrics ------------------------------------------------------------------------


@dataclass
class Scrape:
    """One exposition, parsed: every sample by name and labels."""

    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        scrape = cls()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                scrape.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return scrape

    def matching(self, name: str, **labels: str) -> list[float]:
        """The values of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return [v for (n, ls), v in self.samples.items() if n == name and wanted <= set(ls)]

    def total(self, name: str, **labels: str) -> float:
        return sum(self.matching(name, **labels))

    def one(self, name: str, **labels: str) -> float:
        (value,) = self.matching(name, **labels)
        return value


async def scrape(url: str, **headers: str) -> Scrape:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{url}/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape.parse(response.text)


# -- clients ---------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    usage: dict[str, Any] | None
    text: str


async def ask(url: str, key: str, *, stream: bool, model: str = MODEL,
              headers: dict[str, str] | None = None, **body: Any) -> Reply:  # fmt: skip
    """One chat completion, read to its end; a stream asks for usage and collects it."""
    payload: dict[str, Any] = {
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24,
        "stream": stream, "sim": {"chunks": CHUNKS}, **body,
    }  # fmt: skip
    if stream:
        payload["stream_options"] = {"include_usage": True}
    sent = {"authorization": f"Bearer {key}", **(headers or {})}
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", f"{url}/chat/completions", json=payload, headers=sent) as response,
    ):
        raw = (await response.aread()).decode()
    if not stream or response.status_code != 200:
        usage = orjson.loads(raw).get("usage") if response.status_code == 200 else None
        return Reply(response.status_code, response.headers, usage, raw)
    usage = None
    for line in raw.splitlines():
        if line.startswith("data: {"):
            chunk = orjson.loads(line[6:])
            usage = chunk.get("usage") or usage
    assert raw.rstrip().endswith("data: [DONE]"), raw[-200:]
    return Reply(response.status_code, response.headers, usage, raw)


async def leave_mid_stream(url: str, key: str) -> None:
    """A slow stream (the simulator paces it at 50 ms a token), left after its first bytes."""
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "long"}],
               "max_tokens": 400, "stream": True, "sim": {"itl_ms": 50}}  # fmt: skip
    async with httpx.AsyncClient(timeout=30) as client, client.stream(
        "POST", f"{url}/chat/completions", json=payload,
        headers={"authorization": f"Bearer {key}"},
    ) as response:  # fmt: skip
        assert response.status_code == 200
        async for chunk in response.aiter_raw():
            assert chunk
            break  # closing the response now drops the connection


async def client_key(database_url: str, tenant: str, **options: Any) -> str:
    async with open_store(Settings(database_url=database_url)) as store:
        new, _ = await store.create(tenant=tenant, role="client", **options)
    return new.secret


def assert_overhead_header(reply: Reply) -> None:
    assert float(reply.headers["x-thinkgate-overhead-ms"]) >= 0


def tokens(usages: list[dict[str, Any]]) -> tuple[int, int, int]:
    """Prompt, reasoning and answer tokens, as the responses reported them."""
    prompt = sum(u["prompt_tokens"] for u in usages)
    reasoning = sum(u["completion_tokens_details"]["reasoning_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    return prompt, reasoning, completion - reasoning


# -- a. the catalogue after traffic ----------------------------------------------------------


async def test_a_scrape_after_traffic_shows_every_metric_with_sensible_values(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    main = create_sim_app(SimConfig(ttft_ms=5, itl_ms=1, kv_capacity_tokens=CAPACITY))
    broken = create_sim_app(SimConfig(error_rate=1.0, models={BROKEN: "template"}))
    guard = create_sim_app(SimConfig())  # plays Llama Guard
    async with (BackgroundServer(main) as engine, BackgroundServer(broken) as failing,
                BackgroundServer(guard) as judge):  # fmt: skip
        good_url, bad_url = f"{engine.url}/v1", f"{failing.url}/v1"
        # a policy that flags every word of the reasoning: thinkgate_guardrail_actions counts;
        # a guard model over the answers: thinkgate_guard_model_seconds
        flag = tmp_path / "guardrails.yaml"
        flag.write_text("policies:\n  - {name: words, detect: [{regex: '[a-z]{4,12}', "
                        "max_length: 12}], scope: [reasoning], action: flag}\n"
                        f"  - {{name: judged, detect: [{{model: llama-guard, upstream: "
                        f"'{judge.url}/v1'}}], scope: [answer], action: flag}}\n")  # fmt: skip
        # a SIEM export to a file: the thinkgate_siem_* metrics have samples; prices and a
        # budget: thinkgate_spend and thinkgate_budget_used_ratio
        prices = tmp_path / "prices.yaml"
        prices.write_text(f"currency: USD\nmodels: {{{MODEL}: {{input: 1, output: 2}}}}\n")
        stack = await stack_factory(extra_upstreams=(good_url, bad_url), guardrails_file=flag,
                                    siem_file=tmp_path / "siem.jsonl", siem_interval_s=0.05,
                                    prices_file=prices, unpriced_models="allow")  # fmt: skip
        database_url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
        visible_id = split_key(stack.keys["visible"])[0]  # type: ignore[index]
        async with httpx.AsyncClient(
            headers={"authorization": f"Bearer {stack.keys['admin']}"}
        ) as admin:  # fmt: skip
            budget = await admin.put(f"{stack.root}/admin/v1/budgets/key/{visible_id}/day",
                                     json={"amount": "100"})  # fmt: skip
        assert budget.status_code == 200, budget.text
        limited = await limited_key(stack, database_url, rpm=1)
        leaver = await client_key(database_url, "leaver", reasoning="visible")

        async def capacity_known() -> bool:  # then every request is KV-admitted
            found = (await scrape(stack.root)).matching(
                "thinkgate_kv_budget_tokens", upstream=good_url, state="capacity"
            )
            return found == [CAPACITY]

        await eventually(capacity_known, within_s=10, every=0.05)
        started = time.time()
        visible = await ask(stack.url, stack.keys["visible"], stream=True)
        hidden = await ask(stack.url, stack.keys["hidden"], stream=True)
        whole = await ask(stack.url, stack.keys["visible"], stream=False)
        admitted = await ask(stack.url, limited, stream=False)
        refused = await ask(stack.url, limited, stream=False)
        failed = await ask(stack.url, stack.keys["hidden"], stream=False, model=BROKEN)
        await leave_mid_stream(stack.url, leaver)

        assert [r.status for r in (visible, hidden, whole, admitted)] == [200] * 4
        assert (refused.status, failed.status) == (429, 502)
        assert "reasoning_content" in visible.text and "reasoning_content" not in hidden.text
        for reply in (visible, hidden, whole, admitted):
            assert_overhead_header(reply)
        usages = [r.usage for r in (visible, hidden, whole, admitted)]
        assert all(u is not None and u["completion_tokens"] > 0 for u in usages), usages

        async def settled() -> bool:
            m = await scrape(stack.root)
            return (m.total("thinkgate_client_disconnects_total") == 1
                    and m.total("thinkgate_ledger_records_total") == 6
                    and m.total("thinkgate_siem_events_total", outcome="sent") == 6)  # fmt: skip

        # six completions reached the ledger (the refused one never became a completion), and
        # the SIEM file
        await eventually(settled, within_s=10, every=0.05)
        m = await scrape(stack.root)

    # every metric of the catalogue has samples
    catalogue = {f.name for f in Metrics().registry.collect() if f.name.startswith("thinkgate_")}
    names = {n for (n, _) in m.samples}
    sampled = {f for f in catalogue if names & {f, f"{f}_total", f"{f}_count"}}
    assert catalogue - sampled == set()
    assert len(catalogue) >= 24

    acme = {"model": MODEL, "tenant": "acme"}
    requests = "thinkgate_requests_total"
    assert m.one(requests, **acme, status="ok", stream="true") == 2
    assert m.one(requests, **acme, status="ok", stream="false") == 2
    assert m.one(requests, **acme, status="rate_limited", stream="false") == 1
    assert m.one(requests, model=BROKEN, tenant="acme", status="upstream_error",
                 stream="false") == 1  # fmt: skip
    assert m.one(requests, model=MODEL, tenant="leaver", status="client_disconnected",
                 stream="true") == 1  # fmt: skip
    assert m.total(requests) == 7

    # latencies: every histogram saw its requests, with positive sums
    for name, labels, count in (
        ("thinkgate_time_to_first_token_seconds", acme, 4),
        ("thinkgate_time_to_first_content_token_seconds", acme, 4),
        ("thinkgate_request_duration_seconds", {**acme, "stream": "true"}, 2),
        ("thinkgate_request_duration_seconds", {**acme, "stream": "false"}, 2),
        ("thinkgate_overhead_seconds", {"stream": "true"}, 3),
        ("thinkgate_overhead_seconds", {"stream": "false"}, 3),
    ):
        assert m.one(f"{name}_count", **labels) == count, (name, labels)
        assert m.one(f"{name}_sum", **labels) > 0, (name, labels)
        assert m.one(f"{name}_bucket", **labels, le="+Inf") == count, (name, labels)
    ttft = m.one("thinkgate_time_to_first_token_seconds_sum", **acme)
    ttfc = m.one("thinkgate_time_to_first_content_token_seconds_sum", **acme)
    assert ttfc >= ttft
    assert m.one("thinkgate_inter_token_latency_seconds_count", model=MODEL) > 0
    assert m.one("thinkgate_inter_token_latency_seconds_sum", model=MODEL) > 0
    duration = m.total("thinkgate_request_duration_seconds_sum", **acme)
    assert duration < time.time() - started

    # tokens: exactly what the responses reported
    prompt, reasoning, content = tokens([u for u in usages if u is not None])
    assert reasoning > 0 and content > 0
    assert m.one("thinkgate_prompt_tokens_total", **acme) == prompt
    assert m.one("thinkgate_reasoning_tokens_total", **acme) == reasoning
    assert m.one("thinkgate_content_tokens_total", **acme) == content
    # the four answered requests, and the one that left mid-stream (its streamed tokens count)
    assert m.one("thinkgate_reasoning_ratio_count", model=MODEL) == 5
    ratio_sum = m.one("thinkgate_reasoning_ratio_sum", model=MODEL)
    assert 0 < ratio_sum < 5

    # limits, failures, disconnects
    assert m.one("thinkgate_ratelimit_rejections_total", kind="requests") == 1
    assert m.total("thinkgate_ratelimit_rejections_total") == 1
    assert m.one("thinkgate_upstream_errors_total", upstream=bad_url, kind="status") == 1
    assert m.total("thinkgate_upstream_errors_total") == 1
    assert m.one("thinkgate_client_disconnects_total", model=MODEL, tenant="leaver") == 1
    assert m.total("thinkgate_ratelimit_fallback_active") == 0  # no Redis, nothing to fall from

    # the ledger
    assert m.one("thinkgate_ledger_records_total") == 6
    assert m.one("thinkgate_ledger_tree_size") >= 6
    assert m.one("thinkgate_ledger_commit_seconds_count") >= 1
    assert m.one("thinkgate_ledger_spool_records") == 0
    assert abs(m.one("thinkgate_ledger_last_checkpoint_timestamp_seconds") - time.time()) < 60

    # the SIEM export: every record sent to the file, none failed or skipped, none behind
    assert m.one("thinkgate_siem_events_total", sink="file", outcome="sent") == 6
    assert m.one("thinkgate_siem_events_total", sink="file", outcome="failed") == 0
    assert m.one("thinkgate_siem_dropped_events_total") == 0
    assert m.one("thinkgate_siem_backlog_records") == 0

    # KV admission and the engines' own figures
    kv = "thinkgate_kv_budget_tokens"
    assert m.one(kv, upstream=good_url, state="capacity") == CAPACITY
    assert 0 < m.one(kv, upstream=good_url, state="admitted_limit") <= CAPACITY
    assert m.one(kv, upstream=good_url, state="reserved") >= 0
    assert m.one("thinkgate_admission_wait_seconds_count") >= 5  # every admitted request
    for url in (good_url, bad_url):
        usage = m.one("thinkgate_upstream_kv_cache_usage_ratio", upstream=url)
        assert 0 <= usage <= 1
        assert m.one("thinkgate_upstream_requests_waiting", upstream=url) >= 0
    assert m.one("thinkgate_upstream_healthy", upstream=good_url) == 1
    assert m.one("process_resident_memory_bytes") > 0


# -- b. who may read /metrics ----------------------------------------------------------------


async def test_a_metrics_token_guards_metrics_and_the_metrics_port_serves_them_open(
    stack_factory: StackFactory,
) -> None:
    port = free_port()
    stack = await stack_factory(metrics_token="scrape-me-0123", metrics_port=port)
    assert (await ask(stack.url, stack.keys["visible"], stream=False)).status == 200
    async with httpx.AsyncClient(timeout=10) as client:
        for headers in ({}, {"authorization": "Bearer wrong"},
                        {"authorization": "scrape-me-0123"},
                        {"authorization": f"Bearer {stack.keys['admin']}"}):  # fmt: skip
            refused = await client.get(f"{stack.root}/metrics", headers=headers)
            assert refused.status_code == 401, headers
            assert refused.json() == {"error": {
                "message": "/metrics needs the metrics bearer token.",
                "type": "authentication_error", "param": None, "code": "invalid_api_key",
            }}  # fmt: skip
            assert "thinkgate_" not in refused.text
    guarded = await scrape(stack.root, authorization="Bearer scrape-me-0123")
    also = await scrape(stack.root, authorization="bearer scrape-me-0123")
    open_port = await scrape(f"http://127.0.0.1:{port}")
    labels = {"model": MODEL, "tenant": "acme", "status": "ok", "stream": "false"}
    for seen in (guarded, also, open_port):
        assert seen.one("thinkgate_requests_total", **labels) == 1
    async with httpx.AsyncClient(timeout=10) as client:  # the second listener has /metrics alone
        assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 404
        chat = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={})
        assert chat.status_code == 404


async def test_a_model_no_upstream_serves_gets_no_label_of_its_own(stack: Stack) -> None:
    for i in range(3):
        reply = await ask(stack.url, stack.keys["visible"], stream=False, model=f"nope-{i}")
        assert reply.status == 404
    m = await scrape(stack.root)
    assert m.total("thinkgate_requests_total", status="invalid") == 3
    assert stack.sim is not None
    served = set(stack.sim.config.models)
    labelled = {dict(ls)["model"] for (n, ls) in m.samples if n == "thinkgate_requests_total"}
    assert len(labelled - served) <= 1, labelled  # one shared label at most, e.g. "unknown"


# -- c. trace context ------------------------------------------------------------------------


class ScriptedUpstream:
    """A model server that records request headers and answers every request with the same
    reasoning and answer, streamed or whole (``FAILING``: a 500 whose message echoes them)."""

    FAILING = "failing-model"

    def __init__(self, reasoning: str = "thinking", answer: str = "done") -> None:
        self.reasoning, self.answer = reasoning, answer
        self.headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].endswith("/models"):
            cards = [{"id": m, "object": "model"} for m in ("m", self.FAILING)]
            await _send_json(send, 200, {"object": "list", "data": cards})
            return
        if not scope["path"].endswith("/chat/completions"):
            await _send_json(send, 404, {"detail": "Not Found"})
            return
        body = orjson.loads(await _read(receive))
        self.headers.append(dict(scope["headers"]))
        if body["model"] == self.FAILING:
            message = f"engine failed on: {self.reasoning} {self.answer}"
            error = {"message": message, "type": "InternalServerError", "code": 500}
            await _send_json(send, 500, {"error": error})
        elif body.get("stream"):
            await self._stream(send)
        else:
            message = {"role": "assistant", "content": f"{self.reasoning}</think>{self.answer}"}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            await _send_json(send, 200, {"id": "c1", "object": "chat.completion", "model": "m",
                                         "choices": [choice], "usage": USAGE})  # fmt: skip

    async def _stream(self, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        deltas = [{"role": "assistant", "content": ""}, {"content": self.reasoning},
                  {"content": "</think>"}, {"content": self.answer}]  # fmt: skip
        chunks = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
        chunks.append({"index": 0, "delta": {}, "finish_reason": "stop"})
        events = [{"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [c]}
                  for c in chunks]  # fmt: skip
        events.append({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                       "choices": [], "usage": USAGE})  # fmt: skip
        for event in events:
            data = b"data: " + orjson.dumps(event) + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


USAGE = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


async def _read(receive: Receive) -> bytes:
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return raw


async def _send_json(send: Send, status: int, body: Any) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})


async def ledger_header(stack: Stack, request_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        found = await client.get(
            f"{stack.root}/audit/v1/records", params={"request_id": request_id},
            headers={"authorization": f"Bearer {stack.keys['auditor']}"},
        )  # fmt: skip
    assert found.status_code == 200, found.text
    (record,) = found.json()["data"]
    header: dict[str, Any] = record["header"]
    return header


TRACE_CASES: list[tuple[str | None, str | None]] = [
    (TRACEPARENT, TRACEPARENT),
    (TRACEPARENT.replace("00-", "01-", 1) + "-later-field", TRACEPARENT),  # a later version
    (TRACEPARENT.upper(), None),  # uppercase hex is invalid
    ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", None),  # all-zero trace id
    (TRACEPARENT + "-extra", None),  # version 00 has four fields
    (None, None),
]


async def test_the_callers_trace_context_goes_upstream_and_into_the_ledger(
    stack_factory: StackFactory,
) -> None:
    upstream = ScriptedUpstream()
    stack = await stack_factory(upstream_apps=[upstream])
    for sent, passed_on in TRACE_CASES:
        headers = {"traceparent": sent} if sent is not None else {}
        for stream in (False, True):
            reply = await ask(stack.url, stack.keys["visible"], stream=stream, model="m",
                              headers=headers)  # fmt: skip
            assert reply.status == 200, reply.text
            received = upstream.headers[-1].get(b"traceparent")
            assert received == (passed_on.encode() if passed_on else None), sent
            header = await ledger_header(stack, reply.headers["x-request-id"])
            assert header["kind"] == "completion" and header["stream"] is stream
            assert header.get("traceparent") == passed_on, sent
    assert len(upstream.headers) == 2 * len(TRACE_CASES)


# -- d. the access log -----------------------------------------------------------------------


class JsonLines(logging.Handler):
    """Every record of the process, formatted as the serving process would write it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.formatter_ = JsonFormatter()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.formatter_.format(record))


@contextlib.contextmanager
def every_log_line() -> Any:
    handler = JsonLines()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)


def trace(i: int) -> tuple[str, str]:
    """A distinct traceparent per request, and its trace id."""
    trace_id = f"{i + 1:032x}"
    return f"00-{trace_id}-00f067aa0ba902b7-01", trace_id


async def test_one_access_line_per_request_and_no_text_in_any_log_line(
    stack_factory: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    marker = f"mk{secrets.token_hex(8)}"
    upstream = ScriptedUpstream(reasoning=f"thinking {marker}", answer=f"answer {marker}")
    stack = await stack_factory(upstream_apps=[upstream])
    caplog.set_level(logging.DEBUG)  # the root logger: every library's debug lines too
    cases = [  # key, stream, model, expected status, access-line status
        ("visible", True, "m", 200, "ok"),
        ("hidden", True, "m", 200, "ok"),
        ("visible", False, "m", 200, "ok"),
        ("visible", False, ScriptedUpstream.FAILING, 502, "upstream_error"),
        ("visible", True, ScriptedUpstream.FAILING, 502, "upstream_error"),
        ("visible", False, "no-such-model", 404, "invalid"),
    ]
    replies = []
    with every_log_line() as lines:
        for i, (key, stream, model, status, _) in enumerate(cases):
            messages = [{"role": "system", "content": f"system {marker}"},
                        {"role": "user", "content": f"question {marker}"}]  # fmt: skip
            reply = await ask(stack.url, stack.keys[key], stream=stream, model=model,
                              headers={"traceparent": trace(i)[0]}, messages=messages,
                              user=marker, stop=[f"never {marker}"])  # fmt: skip
            assert reply.status == status, reply.text
            replies.append(reply)
    assert marker in replies[0].text and marker in replies[2].text  # it went to the client
    assert marker not in replies[1].text.split("answer", 1)[0]  # hidden: reasoning withheld

    assert any('"level":"debug"' in line for line in lines), "no debug line captured"
    assert len(lines) == len(caplog.records)
    for line in lines:
        assert marker not in line, line
    for record in caplog.records:
        assert marker not in record.getMessage()
    access = [orjson.loads(line) for line in lines if '"logger":"thinkgate.access"' in line]
    assert len(access) == len(cases)
    for i, (line, reply, case) in enumerate(zip(access, replies, cases, strict=True)):
        _, stream, model, _, status = case
        assert line["request_id"] == reply.headers["x-request-id"]
        assert line["level"] == "info"
        assert (line["status"], line["model"], line["trace_id"]) == (status, model, trace(i)[1])
        assert line["tenant"] == "acme" and len(line["key_id"]) == 12
        if status == "invalid":
            assert line["msg"] == "request refused"
            assert line["error_code"] == "model_not_found"
            continue
        assert line["msg"] == "chat completion" and line["stream"] is stream
        if status == "ok":
            assert line["duration_ms"] >= line["ttft_ms"] >= 0
            assert line["overhead_ms"] >= 0 and line["ttfc_ms"] is not None
            assert (line["prompt_tokens"], line["completion_tokens"]) == (5, 4)
            assert line["finish_reasons"] == ["stop"]
    secret = stack.keys["visible"]
    parts = split_key(secret)
    assert parts is not None
    raw = parts[1]  # the secret part, whole: a random token may hold dashes itself
    assert not any(secret in line or raw in line for line in lines)


# -- e. several workers ----------------------------------------------------------------------


@dataclass
class Workers:
    url: str
    stderr: list[str]  # every line so far, decoded


@contextlib.asynccontextmanager
async def serving_workers(
    env: dict[str, str], workers: int, asked: str | None = None
) -> AsyncIterator[Workers]:
    """``thinkgate serve --workers ASKED`` (``workers`` by default) in its own process group,
    once ``workers`` workers started; stopped with SIGTERM (uvicorn stops its workers), the
    group killed if anything is left."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--port", str(port),
        "--workers", asked or str(workers), env=env, start_new_session=True,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    reader = asyncio.create_task(_collect(proc.stderr, lines))

    def started() -> int:
        return sum("Application startup complete" in line for line in lines)

    try:
        await eventually(lambda: started() >= workers or reader.done(), within_s=60)
        assert started() == workers, "\n".join(lines[-20:])
        yield Workers(f"http://127.0.0.1:{port}", lines)
    finally:
        if proc.returncode is None:
            proc.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # any worker left behind
        await proc.wait()
        await reader


async def _collect(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode().rstrip("\n"))


async def test_workers_add_their_metrics_up_and_log_one_json_line_per_request(
    tmp_path: Path, postgres_url: str
) -> None:
    files = ledger_files(tmp_path)
    count = 20
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=30, itl_ms=0))) as sim:
        settings = Settings(upstreams=(f"{sim.url}/v1",), database_url=postgres_url, **files)
        ensure_keys(settings.ledger, create=True)
        key = (await make_keys(settings))["visible"]
        env = {k: v for k, v in gateway_env(settings, files).items()
               if k != "PROMETHEUS_MULTIPROC_DIR"}  # fmt: skip
        env["TMPDIR"] = str(tmp_path)  # where the CLI makes the multiprocess metrics directory
        async with serving_workers(env, 2) as gateway:
            # one after the other, each on a new connection: the workers race for each accept
            # (sent at once, one worker's accept loop would take the whole burst)
            replies = [await ask(f"{gateway.url}/v1", key, stream=False, max_tokens=8)
                       for _ in range(count)]  # fmt: skip
            assert [r.status for r in replies] == [200] * count
            assert multiprocess_files(tmp_path)  # the CLI made the directory the workers share
            for _ in range(6):  # each scrape on a new connection: either worker may answer
                seen = await scrape(gateway.url)
                assert seen.total("thinkgate_requests_total") == count
                assert seen.total("thinkgate_ledger_records_total") == count
                labels = {"model": MODEL, "tenant": "acme", "stream": "false"}
                assert seen.one("thinkgate_request_duration_seconds_count", **labels) == count

            def access_lines() -> list[str]:
                return [line for line in gateway.stderr if '"thinkgate.access"' in line]

            await eventually(lambda: len(access_lines()) >= count, within_s=10)
        assert len(access_lines()) == count  # and no more by the end

        logged = [orjson.loads(line) for line in access_lines()]
        assert sorted(a["request_id"] for a in logged) == sorted(
            r.headers["x-request-id"] for r in replies
        )
    assert all(a["status"] == "ok" and a["logger"] == "thinkgate.access" for a in logged)
    uvicorn_access = [line for line in gateway.stderr if 'HTTP/1.1" ' in line]
    assert uvicorn_access == []
    for line in gateway.stderr:
        orjson.loads(line)  # LOG_FORMAT=json: every line of the process is JSON
    assert multiprocess_files(tmp_path) == []  # the CLI's own directory is gone at exit
    writers = await ledger_writers(postgres_url)
    assert len(writers) == 2  # both workers served, and their figures were added up


@pytest.mark.parametrize("redis", [True, False], ids=["with-redis", "without-redis"])
async def test_auto_runs_a_worker_per_usable_cpu_only_where_limits_are_shared(
    tmp_path: Path, redis_url: str, redis: bool
) -> None:
    """``--workers auto`` (the default): one worker per CPU this process may use when Redis
    holds the limits; one without it, where each worker would allow the whole limit."""
    files = ledger_files(tmp_path)
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=0, itl_ms=0))) as sim:
        database = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
        settings = Settings(upstreams=(f"{sim.url}/v1",), redis_url=redis_url if redis else "",
                            database_url=database, **files)  # fmt: skip
        ensure_keys(settings.ledger, create=True)
        key = (await make_keys(settings))["visible"]
        env = {k: v for k, v in gateway_env(settings, files).items()
               if k != "PROMETHEUS_MULTIPROC_DIR"}  # fmt: skip
        env["TMPDIR"] = str(tmp_path)
        if redis:
            env["THINKGATE_REDIS_URL"] = redis_url
        expected = workers.usable_cpus() if redis else 1
        async with serving_workers(env, expected, asked="auto") as gateway:
            await answering(gateway.url)  # one process binds after its start-up is complete
            reply = await ask(f"{gateway.url}/v1", key, stream=False, max_tokens=8)
            assert reply.status == 200, reply.text
            said = [orjson.loads(line)["msg"] for line in gateway.stderr if "worker" in line
                    and '"logger":"thinkgate"' in line]  # fmt: skip
        started = sum("Application startup complete" in line for line in gateway.stderr)
        assert started == expected
        if redis:
            assert said == [f"{expected} worker{'s' * (expected > 1)} (auto: "
                            f"{expected} usable CPU{'s' * (expected > 1)})"]  # fmt: skip
        else:
            assert said == ["1 worker (auto: without REDIS_URL, rate limits and "
                            "budgets are kept per process)"]  # fmt: skip


async def answering(url: str) -> None:
    async with httpx.AsyncClient(timeout=2) as client:

        async def healthy() -> bool:
            try:
                return (await client.get(f"{url}/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy, within_s=30)


def multiprocess_files(directory: Path) -> list[Path]:
    return list(directory.glob("thinkgate-metrics-*/*.db"))


async def ledger_writers(database_url: str) -> set[str]:
    from sqlalchemy import select

    from audit.schema import entries
    from gateway.db import create_engine

    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(entries.c.writer))).all()
    finally:
        await engine.dispose()
    return {r.writer for r in rows}


async def test_requests_refused_before_authentication_are_counted_and_logged(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """A bogus key (401) leaves a trace: key guessing shows in the metrics and the log."""
    caplog.set_level(logging.INFO, logger="thinkgate.access")
    before = await scrape(stack.root)
    async with httpx.AsyncClient(timeout=10) as client:
        reply = await client.post(f"{stack.url}/chat/completions", json={},
                                  headers={"authorization": "Bearer sk-tg-nope"})  # fmt: skip
    assert reply.status_code == 401
    after = await scrape(stack.root)
    label = {"model": "unknown", "tenant": "unknown", "status": "invalid", "stream": "false"}
    assert after.total("thinkgate_requests_total", **label) == (
        before.total("thinkgate_requests_total", **label) + 1
    )
    lines = [r for r in caplog.records if r.name == "thinkgate.access"]
    fields = [getattr(r, "fields", {}) for r in lines]
    assert any(f.get("request_id") == reply.headers["x-request-id"] for f in fields)
