"""RFC 5424 messages and RFC 6587 octet counting (gateway/side/siem/syslog.py), checked against the
grammar of RFC 5424 §6 and by reading a stream of frames back with a separate decoder."""

from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.side.siem.ocsf import OcsfEvent
from gateway.side.siem.syslog import field, frame, frames, message, timestamp

# RFC 5424 §6: HEADER SP STRUCTURED-DATA [SP MSG], with the header's fields as PRINTUSASCII.
RFC5424 = re.compile(
    rb"<(?P<pri>\d{1,3})>1 (?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) "
    rb"(?P<host>[!-~]{1,255}) (?P<app>[!-~]{1,48}) (?P<procid>[!-~]{1,128}) "
    rb"(?P<msgid>[!-~]{1,32}) (?P<sd>-) (?P<msg>.*)\Z",
    re.DOTALL,
)


def decode(stream: bytes) -> list[bytes]:
    """Octet-counted frames back (RFC 6587 §3.4.1), as a receiver reads them."""
    out, at = [], 0
    while at < len(stream):
        space = stream.index(b" ", at)
        length = int(stream[at:space])
        assert stream[at:space][:1] != b"0"  # MSG-LEN = NONZERO-DIGIT *DIGIT
        out.append(stream[space + 1 : space + 1 + length])
        at = space + 1 + length
    return out


def made(index: int = 0, severity: int = 1, kind: str = "completion", text: str = "é") -> OcsfEvent:
    body = orjson.dumps({"i": index, "text": text, "lines": "a\nb"})
    return OcsfEvent(index, 1_767_225_600_250 + index, severity, kind, body)


def test_a_message_follows_rfc_5424_with_the_json_as_msg() -> None:
    sent = message(made(), "gw-0.example", "4242")
    found = RFC5424.match(sent)
    assert found is not None, sent
    assert int(found["pri"]) == 13 * 8 + 6  # log audit, informational
    assert found["ts"] == b"2026-01-01T00:00:00.250Z"
    assert (found["host"], found["app"], found["procid"], found["msgid"]) == (
        b"gw-0.example", b"thinkgate", b"4242", b"completion",
    )  # fmt: skip
    assert orjson.loads(found["msg"]) == {"i": 0, "text": "é", "lines": "a\nb"}
    assert not found["msg"].startswith(b"\xef\xbb\xbf")  # MSG-ANY: no BOM before the JSON


@pytest.mark.parametrize(
    ("severity_id", "syslog_severity"), [(0, 6), (1, 6), (2, 5), (3, 4), (4, 3), (5, 2), (6, 1)]
)
def test_the_pri_carries_the_ocsf_severity(severity_id: int, syslog_severity: int) -> None:
    found = RFC5424.match(message(made(severity=severity_id), "h", "1"))
    assert found is not None and int(found["pri"]) == 104 + syslog_severity


def test_header_fields_are_printable_ascii_bounded_or_nil() -> None:
    assert field("host name\twith\u00e9", 255) == "hostnamewith"
    assert field("", 48) == field(" \n", 48) == "-"
    assert field("k" * 40, 32) == "k" * 32
    sent = message(made(kind="a kind of its own, rather long, with spaces"), "", "")
    found = RFC5424.match(sent)
    assert found is not None
    assert (found["host"], found["procid"], found["msgid"]) == (
        b"-", b"-", b"akindofitsown,ratherlong,withspa",
    )  # fmt: skip


def test_timestamps_are_utc_with_milliseconds() -> None:
    assert timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert timestamp(1_767_225_600_007) == "2026-01-01T00:00:00.007Z"
    assert timestamp(951_782_400_999) == "2000-02-29T00:00:00.999Z"


def test_a_frame_is_the_octet_count_a_space_and_the_message() -> None:
    assert frame(b"<110>1 x") == b"8 <110>1 x"
    assert frame("é".encode()) == b"2 \xc3\xa9"  # octets, not characters


@given(st.lists(st.text(max_size=300), min_size=1, max_size=20))
def test_a_stream_of_frames_reads_back_message_by_message(texts: list[str]) -> None:
    events = [made(i, text=t) for i, t in enumerate(texts)]
    stream = frames(events, "gw", "1")
    read = decode(stream)
    assert read == [message(e, "gw", "1") for e in events]
    for index, sent in enumerate(read):
        found = RFC5424.match(sent)
        assert found is not None
        assert orjson.loads(found["msg"])["text"] == texts[index]
