"""``Exchange`` (``gateway/exchange/lifecycle.py``): ``finish`` settles and records exactly once,
whoever awaits it and however often, even when its caller is cancelled; ``fail`` maps an
error's outcome to the record's status. Over a real ``Gate`` (a limiter that counts its
settlements, an in-process KV budget) and a recording sink."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
import pytest

from audit.record import Usage
from gateway.admission.budget import KVAdmission, open_admission
from gateway.admission.gate import Gate
from gateway.admission.limiter import Admission, Unlimited
from gateway.api.chat import parse_chat_request
from gateway.auth.keys import KeyInfo
from gateway.errors import (
    ClientClosedRequest,
    GatewayError,
    LedgerUnavailable,
    RateLimited,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.exchange.lifecycle import Exchange
from gateway.ledger.record import CompletionRecord, RecordSink
from gateway.relay.rewrite import Policy, StreamRelay
from gateway.settings import Settings
from gateway.upstream.engine import Upstream
from tests.e2e.conftest import RecordingSink
from tests.gateway.relay.test_rewrite import usage_chunk

KEY = KeyInfo("k1", "acme", "client", "hidden", None, None, datetime.now(UTC), None, b"")
ENGINE = "http://engine/v1"
RESERVED = 500


class CountingLimiter(Unlimited):
    """Admits everything and remembers what each settlement said was used."""

    def __init__(self, fails: bool = False) -> None:
        self.settled: list[int] = []
        self.fails = fails

    async def settle(
        self, admission: Admission, used_tokens: int, usage: Usage | None = None
    ) -> None:
        self.settled.append(used_tokens)
        if self.fails:
            raise ConnectionError("the rate-limit store went away")


@dataclass
class Setup:
    ex: Exchange
    relay: StreamRelay
    sink: RecordingSink
    limiter: CountingLimiter
    kv: KVAdmission


async def open_exchange(
    sink: RecordSink | None = None, limiter: CountingLimiter | None = None
) -> Setup:
    """An admitted streaming chat exchange (500 tokens reserved, a KV lease held)."""
    limiter = limiter or CountingLimiter()
    kv = open_admission(Settings(kv_capacity_tokens=1000), None)
    gate = Gate(limiter, kv)
    ticket, _ = await gate.admit(KEY, [Upstream(ENGINE)], "standard", RESERVED)
    body = {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    relay = StreamRelay(Policy.named("deepseek_r1", False, "reasoning_content"))
    recording = sink or RecordingSink()
    ex = Exchange("req_1", KEY, parse_chat_request(orjson.dumps(body)), "chat.completions",
                  "/chat/completions", relay, ticket, gate, recording)  # fmt: skip
    ex.upstream = ENGINE
    assert isinstance(recording, RecordingSink)
    return Setup(ex, relay, recording, limiter, kv)


async def test_finish_records_and_settles_once_however_often_awaited() -> None:
    s = await open_exchange()
    assert not s.ex.finishing
    await asyncio.gather(s.ex.finish(), s.ex.finish(), s.ex.finish())
    await s.ex.finish()
    assert s.ex.finishing
    # nothing was generated: the prompt alone is charged and recorded, never the reservation
    prompt = prompt_of(s)
    assert len(s.sink.records) == 1 and s.limiter.settled == [prompt] and prompt < RESERVED
    usage = s.sink.records[0].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (prompt, 0)
    assert not s.kv.leases


def prompt_of(s: Setup) -> int:
    """What an exchange that generated nothing is charged: its prompt estimate (bytes / 4)."""
    return len(s.ex.request.upstream_body) // 4


class HeldSink(RecordingSink):
    """A ledger that takes its time: ``submit`` waits until the test lets it through."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def submit(self, record: CompletionRecord) -> None:
        self.entered.set()
        await self.release.wait()
        await super().submit(record)


async def test_a_cancelled_caller_cannot_make_the_record_vanish() -> None:
    sink = HeldSink()
    s = await open_exchange(sink)

    async def client() -> None:  # a request's task, awaiting its record
        await s.ex.finish()

    caller = asyncio.create_task(client())
    await asyncio.wait_for(sink.entered.wait(), 2)
    caller.cancel()  # the client went away while the record was on its way
    with pytest.raises(asyncio.CancelledError):
        await caller
    sink.release.set()
    [record] = await sink.wait_for(1)
    assert record.request_id == "req_1" and s.limiter.settled == [prompt_of(s)]
    await s.ex.finish()  # already done: nothing again
    assert len(sink.records) == 1


@pytest.mark.parametrize(("completion_tokens", "settled"), [(None, None), (10, 15)])
async def test_the_ticket_is_settled_with_the_used_tokens_else_the_prompt_alone(
    completion_tokens: int | None, settled: int | None
) -> None:
    s = await open_exchange()
    if completion_tokens is not None:  # the engine's usage chunk: 5 prompt + 10 completion
        s.relay.feed(usage_chunk(completion_tokens))
    s.ex.status = "ok"
    await s.ex.finish()
    assert s.limiter.settled == [settled or prompt_of(s)]
    assert not s.kv.leases  # the KV lease went back in the same settlement


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (UpstreamStatusError(503, "overloaded", param=None, code=None), "upstream_error"),
        (UpstreamStatusError(500, "engine crashed", param=None, code="boom"), "upstream_error"),
        (UpstreamStatusError(400, "too long", param="max_tokens", code="bad"), "invalid"),
        (UpstreamTimeout("no token in 300 s"), "upstream_error"),
        (UpstreamConnectError("refused"), "upstream_error"),
        (UpstreamProtocolError("garbage"), "upstream_error"),
        (ClientClosedRequest("gone"), "client_disconnected"),
        (RateLimited("slow", retry_after=1), "error"),
        (GatewayError("bug"), "error"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v,
)
async def test_fail_maps_the_errors_outcome_to_the_record_status(
    error: GatewayError, status: str
) -> None:
    s = await open_exchange()
    s.ex.fail(error)
    await s.ex.finish()
    [record] = s.sink.records
    assert record.status == status and record.error_code == error.code


async def test_the_record_says_where_the_request_came_from_and_went() -> None:
    s = await open_exchange()
    s.ex.mark_first_token()
    s.ex.status = "ok"
    await s.ex.finish()
    [record] = s.sink.records
    assert (record.endpoint, record.model, record.upstream) == ("chat.completions", "m1", ENGINE)
    assert (record.request_id, record.tenant, record.key_id) == ("req_1", "acme", "k1")
    assert record.stream and record.status == "ok" and not record.client_disconnected
    assert record.messages == [{"role": "user", "content": "hi"}]
    assert record.first_token_at is not None
    assert record.started_at <= record.first_token_at <= record.ended_at


async def test_a_disconnect_is_recorded_as_such() -> None:
    s = await open_exchange()
    s.ex.disconnected()
    await s.ex.finish()
    [record] = s.sink.records
    assert record.status == "client_disconnected" and record.client_disconnected


class RefusingSink(RecordingSink):
    async def submit(self, record: CompletionRecord) -> None:
        raise LedgerUnavailable("the ledger is down")


async def test_a_ledger_refusal_reaches_every_caller_after_the_settlement() -> None:
    s = await open_exchange(RefusingSink())
    for _ in range(2):
        with pytest.raises(LedgerUnavailable):
            await s.ex.finish()
    assert s.limiter.settled == [prompt_of(s)] and not s.kv.leases


async def test_a_failed_settlement_costs_the_caller_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = await open_exchange(limiter=CountingLimiter(fails=True))
    with caplog.at_level(logging.WARNING, logger="thinkgate"):
        await s.ex.finish()  # no error: unrefunded tokens refill by themselves
    assert len(s.sink.records) == 1 and not s.kv.leases
    assert "settling request req_1 failed: ConnectionError" in caplog.text
