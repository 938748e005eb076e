"""The relay loop of ``gateway/exchange/forward.py``: ``relay_read`` keeps the good events before
a bad one and stops at ``[DONE]``; ``relay_stream`` over a fake upstream stream ends every
stream with ``[DONE]``, after exactly one ``error`` event when it failed, only once the record
is finished, and sends a keep-alive comment after ``keepalive_s`` of silence."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import cast

import orjson
import pytest

from gateway.errors import RemoteProtocolError, UpstreamStatusError, UpstreamTimeout
from gateway.exchange.forward import Leg, relay_read, relay_stream
from gateway.relay.rewrite import Policy, StreamRelay
from gateway.relay.sse import DONE_EVENT, KEEPALIVE_COMMENT, Event, SSEParser, encode_data
from gateway.upstream.pool import UpstreamStream
from tests.gateway.exchange.test_lifecycle import Setup, open_exchange
from tests.gateway.relay.test_rewrite import chunk, usage_chunk

NONE = Policy.named("none", True, "reasoning_content")


def frame(event: Event) -> bytes:
    return encode_data(event.data)


def reference(*events: Event) -> bytes:
    """What a fresh relay sends for ``events`` alone, one by one."""
    relay = StreamRelay(NONE)
    return b"".join(relay.feed(event) for event in events)


@pytest.mark.parametrize(
    ("bad", "kind"),
    [
        (b"data: {not json\n\n", RemoteProtocolError),  # the relay refuses it
        (b"data: " + b"x" * 2048 + b"\n\n", RemoteProtocolError),  # the parser refuses it
        (b'data: {"error": {"message": "engine died"}}\n\n', UpstreamStatusError),  # mid-stream
    ],
    ids=["not-json", "oversized", "error-object"],
)
def test_events_before_a_bad_one_still_go_out_and_the_error_is_returned(
    bad: bytes, kind: type[Exception]
) -> None:
    good = [chunk(content="Hel"), chunk(content="lo")]
    raw = b"".join(map(frame, good)) + bad + frame(chunk(content="lost"))
    out, error = relay_read(StreamRelay(NONE), SSEParser(max_event=1024), raw)
    assert out == reference(*good) and b"lost" not in out
    assert type(error) is kind


def test_done_stops_the_read_and_is_held_back() -> None:
    relay, before = StreamRelay(NONE), chunk(content="Hi")
    raw = frame(before) + DONE_EVENT + frame(chunk(content="after"))
    out, error = relay_read(relay, SSEParser(), raw)
    assert (out, error) == (reference(before), None)
    assert relay.done


class FakeStream:
    """Stands in for ``UpstreamStream``: the reads of ``source``, and ``aclose``."""

    def __init__(self, source: AsyncIterator[bytes]) -> None:
        self.source = source
        self.closed = 0

    async def read(self) -> bytes:  # as the real one: the next non-empty read, b"" at the end
        async for part in self.source:
            if part:
                return part
        return b""

    async def aclose(self) -> None:
        self.closed += 1
        await self.source.aclose()  # type: ignore[attr-defined]


async def no_continuation(body: bytes) -> UpstreamStream:
    raise AssertionError("no budget here: nothing may continue")


def leg(stream: FakeStream) -> Leg:
    return Leg(cast(UpstreamStream, stream), b"{}", no_continuation, 1 << 20)


async def reads(*parts: bytes, then: BaseException | None = None) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if then is not None:
        raise then


async def relayed(s: Setup, source: AsyncIterator[bytes], keepalive_s: float = 60) -> list[bytes]:
    """Every piece for the client; at ``[DONE]``, the record must already be in the sink."""
    stream = FakeStream(source)
    pieces: list[bytes] = []
    async with asyncio.timeout(5):
        async for piece in relay_stream(s.ex, leg(stream), s.relay, keepalive_s):
            if piece == DONE_EVENT:
                assert len(s.sink.records) == 1, "[DONE] went out before the record"
            pieces.append(piece)
    await stream.aclose()  # the response's cleanup would
    return pieces


REASONING, ANSWER = chunk(content="plan</think>"), chunk(content="Hello")


@pytest.mark.parametrize(
    ("then", "code", "status"),
    [
        (None, "upstream_protocol_error", "upstream_error"),  # ended before [DONE]
        (UpstreamTimeout("idle for 60 s"), "upstream_timeout", "upstream_error"),
        (RuntimeError("a bug of ours"), "internal_error", "error"),
    ],
    ids=["no-done", "read-timeout", "gateway-bug"],
)
async def test_a_failed_stream_ends_with_one_error_event_then_done(
    then: BaseException | None, code: str, status: str
) -> None:
    s = await open_exchange()
    pieces = await relayed(s, reads(frame(REASONING), frame(ANSWER), then=then))
    assert pieces[-1] == DONE_EVENT and pieces.count(DONE_EVENT) == 1
    errors = [p for p in pieces if p.startswith(b"event: error\n")]
    assert errors == [pieces[-2]]
    assert orjson.loads(errors[0].split(b"data: ", 1)[1])["error"]["code"] == code
    assert b"Hello" in pieces[0] and b"plan" not in b"".join(pieces)  # hidden reasoning
    [record] = s.sink.records
    assert (record.status, record.error_code) == (status, code)


async def test_a_good_stream_ends_with_done_after_the_record_is_finished() -> None:
    s = await open_exchange()
    upstream = [frame(REASONING), b"", frame(ANSWER), b"", frame(usage_chunk(3)), DONE_EVENT]
    pieces = await relayed(s, reads(*upstream))
    assert pieces[-1] == DONE_EVENT and len(pieces) == 2  # the answer, then [DONE]: no more
    assert b'"content":"Hello"' in pieces[0]
    assert KEEPALIVE_COMMENT not in pieces  # silence shorter than keepalive_s: none
    [record] = s.sink.records
    assert record.status == "ok" and record.content == ("Hello",)
    assert s.limiter.settled == [8]  # the usage chunk: 5 prompt + 3 completion tokens


async def test_a_keepalive_comment_follows_keepalive_s_of_silence() -> None:
    """The engine is busy with withheld reasoning: reads arrive, nothing is due to the client."""

    async def silence() -> AsyncIterator[bytes]:
        while True:
            await asyncio.sleep(0)  # a read that suspends, as a socket's does
            yield b": busy\n\n"  # a read that makes nothing for the client (an SSE comment)

    s = await open_exchange()
    stream = FakeStream(silence())
    body = relay_stream(s.ex, leg(stream), s.relay, 0.02)
    started = time.perf_counter()
    async with asyncio.timeout(5):
        first = await anext(body)
    assert first == KEEPALIVE_COMMENT
    assert time.perf_counter() - started >= 0.02
    await body.aclose()  # type: ignore[attr-defined]
    await stream.aclose()
    assert s.sink.records == []  # the response's cleanup finishes the exchange, not the loop
