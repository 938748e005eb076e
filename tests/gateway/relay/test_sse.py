"""The SSE parser: every case whole, one byte at a time and under Hypothesis chunkings."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import LocalProtocolError, RemoteProtocolError
from gateway.relay.sse import DONE_EVENT, Event, SSEParser, encode_data, encode_event


def parse(pieces: list[bytes], max_event: int = 1 << 20) -> list[Event]:
    parser = SSEParser(max_event=max_event)
    return [e for p in pieces for e in parser.feed(p)] + parser.close()


CASES: list[tuple[bytes, list[Event]]] = [
    (b'data: {"a":1}\n\n', [Event(b'{"a":1}')]),
    (b'data: {"a":1}\r\n\r\n', [Event(b'{"a":1}')]),
    (b'data: {"a":1}\r\rdata: 2\r\r', [Event(b'{"a":1}'), Event(b"2")]),
    (b"data: a\ndata: b\n\n", [Event(b"a\nb")]),
    (b"data:nospace\n\n", [Event(b"nospace")]),
    (b"data:  two spaces\n\n", [Event(b" two spaces")]),
    (b": keep-alive\n\ndata: x\n\n", [Event(b"x")]),
    (b"event: error\ndata: {}\n\n", [Event(b"{}", "error")]),
    (b"event: ping\n\n", []),  # no data: not dispatched
    (b"id: 7\nretry: 100\nfoo: bar\ndata: y\n\n", [Event(b"y")]),
    (b"data\n\n", [Event(b"")]),
    (b"data: [DONE]\n\n", [Event(b"[DONE]")]),
    ("data: \u00e9\u4e2d\U0001f600\n\n".encode(), [Event("\u00e9\u4e2d\U0001f600".encode())]),
    (b"data: unterminated", []),
    (b"data: a\n\ndata: b\r\n\r\ndata: c\r\r", [Event(b"a"), Event(b"b"), Event(b"c")]),
]


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_whole(raw: bytes, expected: list[Event]) -> None:
    assert parse([raw]) == expected


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_one_byte_at_a_time(raw: bytes, expected: list[Event]) -> None:
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == expected


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_every_two_way_cut(raw: bytes, expected: list[Event]) -> None:
    for i in range(len(raw) + 1):
        assert parse([raw[:i], raw[i:]]) == expected, i


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n\r") == [Event(b"a")]
    assert parser.feed(b"\ndata: b\n\n") == [Event(b"b")]


def test_done_marker() -> None:
    (event,) = parse([DONE_EVENT])
    assert event.is_done
    assert not Event(b"[DONE] ").is_done


def test_oversized_event_without_line_end_is_a_remote_error() -> None:
    parser = SSEParser(max_event=64)
    parser.feed(b"data: " + b"x" * 40)
    with pytest.raises(RemoteProtocolError, match="larger than 64 bytes"):
        parser.feed(b"x" * 40)


def test_oversized_event_over_many_data_lines_is_a_remote_error() -> None:
    parser = SSEParser(max_event=64)
    for _ in range(5):
        parser.feed(b"data: 0123456789\n")
    with pytest.raises(RemoteProtocolError):
        parser.feed(b"data: 0123456789\n")


def test_event_at_the_limit_passes_and_resets_the_budget() -> None:
    parser = SSEParser(max_event=64)
    for _ in range(5):
        assert parser.feed(b"data: " + b"x" * 50 + b"\n\n") == [Event(b"x" * 50)]


def test_partial_tells_whether_the_stream_stopped_mid_event() -> None:
    parser = SSEParser()
    parser.feed(b"data: a\n\n")
    assert not parser.has_partial
    parser.feed(b"data: b")
    assert parser.has_partial


def test_feed_after_close_is_a_local_error() -> None:
    parser = SSEParser()
    parser.close()
    with pytest.raises(LocalProtocolError):
        parser.feed(b"data: x\n\n")


def test_encoder_round_trips() -> None:
    raw = encode_data(b'{"x":"a\\nb"}') + encode_event("error", b'{"error":{}}') + DONE_EVENT
    assert parse([raw]) == [
        Event(b'{"x":"a\\nb"}'),
        Event(b'{"error":{}}', "error"),
        Event(b"[DONE]"),
    ]


PAYLOADS = st.lists(
    st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")), max_size=6
)
ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[Event], list[bytes]]:
    events, raw = [], b""
    for payload in draw(PAYLOADS):
        end = draw(ENDS)
        if draw(st.booleans()):
            raw += b": comment" + end
        raw += b"data: " + payload + end + end
        events.append(Event(payload))
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=10)))
    bounds = [0, *cuts, len(raw)]
    return raw, events, [raw[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=400, deadline=None)
@given(streams())
def test_any_chunking_gives_the_same_events(case: tuple[bytes, list[Event], list[bytes]]) -> None:
    raw, events, pieces = case
    assert parse(pieces) == events
    assert parse([raw]) == events


def test_whole_oversized_event_in_one_read_is_refused_too() -> None:
    parser = SSEParser(max_event=64)
    with pytest.raises(RemoteProtocolError):
        parser.feed(b"data: " + b"x" * 65 + b"\n\n")


def test_event_field_before_a_fast_path_block_is_kept() -> None:
    parser = SSEParser()
    assert parser.feed(b"event: error\n") == []
    assert parser.feed(b"data: {}\n\n") == [Event(b"{}", "error")]
