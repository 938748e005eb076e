"""Fuzzing the two streaming parsers with input nobody well-behaved would send.

``test_sse.py`` and ``test_thinksplit.py`` check well-formed streams under every chunking. Here:

- ``SSEParser`` takes arbitrary bytes (and SSE-shaped garbage) cut anywhere: it raises nothing but
  ``RemoteProtocolError``, its buffer stays within ``max_event``, and it agrees with a reference
  written straight from the WHATWG "event stream interpretation" rules, whatever the chunking;
- ``ThinkSplitter`` takes arbitrary Unicode (lone surrogates included) mixed with fragments of
  ``<think>`` and ``</think>``, through ``feed``, ``release`` and ``drop_held`` in any order:
  nothing is lost or invented, and the held text is only ever a proper tag prefix.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import RemoteProtocolError
from gateway.relay.sse import Event, SSEParser
from gateway.relay.thinksplit import (
    CLOSE_TAG,
    OPEN_TAG,
    Content,
    Reasoning,
    SplitEvent,
    ThinkSplitter,
)
from tests.gateway.relay.test_thinksplit import PARSERS, reference, run

# --- SSE -----------------------------------------------------------------------------------------

SSE_PIECES = st.sampled_from((
    b"data:", b"data: ", b"data", b"event:", b"event: error", b": keep-alive", b":", b"id: 7",
    b"retry: 1", b"\r", b"\n", b"\r\n", b"\n\n", b"\r\r", b"[DONE]", b"x", b" ", b"{}",
    b"\xff", b"\xe2\x80", b"\xef\xbb\xbf", b"\x00",
))  # fmt: skip
SSE_STREAMS = st.one_of(
    st.binary(max_size=300),
    st.lists(st.one_of(SSE_PIECES, st.binary(max_size=8)), max_size=60).map(b"".join),
)


@st.composite
def cut(draw: st.DrawFn, raw: bytes) -> list[bytes]:
    """``raw`` cut at arbitrary places (empty pieces included)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    return [raw[a:b] for a, b in itertools.pairwise([0, *cuts, len(raw)])]


@st.composite
def chunked_streams(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    raw = draw(SSE_STREAMS)
    return raw, draw(cut(raw))


def reference_events(raw: bytes) -> list[Event]:
    """WHATWG event stream interpretation over the whole input, as the parser's docstring
    restricts it: lines end in CRLF, LF or CR; the unterminated last line and an undispatched
    last event are dropped at EOF; ``id``/``retry`` are ignored. (No BOM stripping: the parser
    keeps payloads as bytes and OpenAI-compatible servers send none.)"""
    events: list[Event] = []
    data: list[bytes] = []
    event: str | None = None
    for line in re.split(rb"\r\n|\r|\n", raw)[:-1]:
        if not line:
            if data:
                events.append(Event(b"\n".join(data), event))
            data, event = [], None
        elif not line.startswith(b":"):
            field, sep, value = line.partition(b":")
            value = value[1:] if sep and value.startswith(b" ") else value
            if field == b"data":
                data.append(value)
            elif field == b"event":
                event = value.decode("utf-8", "replace")
    return events


def feed_all(parser: SSEParser, pieces: list[bytes]) -> list[Event]:
    return [event for piece in pieces for event in parser.feed(piece)] + parser.close()


@settings(max_examples=200, deadline=None)
@given(case=chunked_streams())
def test_any_bytes_any_chunking_match_the_whatwg_reference(case: tuple[bytes, list[bytes]]) -> None:
    raw, pieces = case
    expected = reference_events(raw)
    assert feed_all(SSEParser(), pieces) == expected
    assert feed_all(SSEParser(), [raw]) == expected


@settings(max_examples=200, deadline=None)
@given(case=chunked_streams(), max_event=st.integers(1, 96))
def test_any_bytes_raise_only_remote_protocol_error_and_stay_bounded(
    case: tuple[bytes, list[bytes]], max_event: int
) -> None:
    _, pieces = case
    parser = SSEParser(max_event=max_event)
    for piece in pieces:
        try:
            parser.feed(piece)
        except RemoteProtocolError:
            return  # the peer's fault, said once; the stream is over
        # White box: what the parser keeps between feeds is what the bound is about.
        assert len(parser._buf) + parser._pending_size <= max_event
    assert parser.close() == []
    assert not parser.has_partial


@settings(max_examples=100, deadline=None)
@given(case=chunked_streams(), max_event=st.integers(1, 96))
def test_an_error_or_not_the_events_before_it_are_a_prefix_of_the_reference(
    case: tuple[bytes, list[bytes]], max_event: int
) -> None:
    """A size refusal cuts the stream short, it never changes or invents an event."""
    raw, pieces = case
    parser, seen = SSEParser(max_event=max_event), []
    try:
        for piece in pieces:
            seen += parser.feed(piece)
    except RemoteProtocolError:
        pass
    expected = reference_events(raw)
    assert seen == expected[: len(seen)]


OVERSIZED_IN_ONE_READ = {
    "crlf": b"data: " + b"x" * 100 + b"\r\n\r\n",
    "cr": b"data: " + b"x" * 100 + b"\r\r",
    "event-line-first": b"event: e\ndata: " + b"x" * 100 + b"\n\n",
    "two-data-lines": b"data: " + b"x" * 40 + b"\ndata: " + b"x" * 40 + b"\n\n",
}


@pytest.mark.parametrize("raw", OVERSIZED_IN_ONE_READ.values(), ids=OVERSIZED_IN_ONE_READ.keys())
def test_an_oversized_event_is_refused_whatever_its_line_ends(raw: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        SSEParser(max_event=64).feed(raw)


def test_the_same_oversized_event_split_over_reads_is_refused() -> None:
    """The control for the test above: what the parser does when the bytes come in pieces."""
    for raw in OVERSIZED_IN_ONE_READ.values():
        with pytest.raises(RemoteProtocolError):
            feed_all(SSEParser(max_event=64), [raw[i : i + 1] for i in range(len(raw))])


# --- the think splitter ------------------------------------------------------------------------

TAG_FRAGMENTS = st.sampled_from((
    OPEN_TAG, CLOSE_TAG, "<", "</", "<<", "</think", "<think", "</thi", "<th", "nk>", "k>", ">",
    "/", "think", "</ think>", "<THINK>", "\r\n", "\x00", "\ufeff", "\U0001f600",
))  # fmt: skip
ANY_CHARACTER = st.one_of(st.characters(), st.characters(categories=["Cs"]))  # lone surrogates
TEXTS = st.lists(st.one_of(TAG_FRAGMENTS, st.text(ANY_CHARACTER, max_size=6)), max_size=30).map(
    "".join
)


@st.composite
def chunked_texts(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(TEXTS)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    return text, [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]


def check_events(events: list[SplitEvent]) -> None:
    """No empty events, and one call never returns two adjacent events of one channel."""
    assert all(event.text for event in events)
    assert all(type(a) is not type(b) for a, b in itertools.pairwise(events))


@settings(max_examples=200, deadline=None)
@given(parser=PARSERS, case=chunked_texts())
def test_any_unicode_any_chunking_matches_the_reference(
    parser: str, case: tuple[str, list[str]]
) -> None:
    text, pieces = case
    assert run(parser, pieces) == reference(parser, text)  # type: ignore[arg-type]


def inside_reasoning_reference(text: str) -> tuple[str | None, str | None]:
    """A reasoning field: only ``</think>`` is a tag, and ``<think>`` is literal."""
    reasoning, _, content = text.partition(CLOSE_TAG)
    return reasoning or None, content or None


@settings(max_examples=150, deadline=None)
@given(case=chunked_texts())
def test_inside_reasoning_keeps_opening_tags_literal(case: tuple[str, list[str]]) -> None:
    text, pieces = case
    splitter = ThinkSplitter.inside_reasoning("deepseek_r1")
    events: list[SplitEvent] = []
    for piece in pieces:
        out = splitter.feed(piece)
        check_events(out)
        events += out
    events += splitter.close()
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning)) or None
    content = "".join(e.text for e in events if isinstance(e, Content)) or None
    assert (reasoning, content) == inside_reasoning_reference(text)


SHORT_TEXTS = st.lists(st.one_of(TAG_FRAGMENTS, st.text(ANY_CHARACTER, max_size=3)), max_size=4)
OPERATIONS = st.lists(
    st.one_of(
        SHORT_TEXTS.map(lambda pieces: ("feed", "".join(pieces))),
        st.sampled_from([("release", ""), ("drop", "")]),
    ),
    max_size=16,
)


@settings(max_examples=200, deadline=None)
@given(parser=PARSERS, operations=OPERATIONS)
def test_feed_release_and_drop_in_any_order_lose_and_invent_nothing(
    parser: str, operations: list[tuple[str, str]]
) -> None:
    """Every character fed comes out once, is dropped by the caller, or was part of a tag the
    splitter consumed (at most one ``<think>`` and one ``</think>`` in a whole stream)."""
    splitter = ThinkSplitter(parser)  # type: ignore[arg-type]
    fed = out = dropped = 0
    for name, text in operations:
        if name == "feed":
            events = splitter.feed(text)
            fed += len(text)
        elif name == "release":
            events = splitter.release()
            assert splitter.idle
        else:
            events, held = [], splitter.drop_held()
            dropped += len(held)
        check_events(events)
        out += sum(len(e.text) for e in events)
        held = splitter._held  # white box: the hold-back bound of the module docstring
        assert len(held) < len(CLOSE_TAG)
        assert OPEN_TAG.startswith(held) or CLOSE_TAG.startswith(held)
    closing = splitter.close()
    assert len(closing) <= 1
    out += sum(len(e.text) for e in closing)
    assert fed - out - dropped in {0, len(OPEN_TAG), len(CLOSE_TAG), len(OPEN_TAG + CLOSE_TAG)}


@settings(max_examples=100, deadline=None)
@given(parser=PARSERS, text=TEXTS)
def test_surrogates_and_tag_fragments_never_raise(parser: str, text: str) -> None:
    """One character at a time: the worst chunking for the hold-back logic."""
    splitter = ThinkSplitter(parser)  # type: ignore[arg-type]
    events = [e for char in text for e in splitter.feed(char)] + splitter.close()
    joined = "".join(e.text for e in events)
    assert len(text) - len(joined) in {0, 7, 8, 15}
