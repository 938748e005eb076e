"""The SIEM sinks (gateway/side/siem/sinks.py) against real receivers: a file on disk, an HTTP
server in Splunk HEC's place, a TCP (and TLS) server reading octet-counted syslog frames."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr
from starlette.types import Receive, Scope, Send

from gateway.edge.servers import BackgroundServer
from gateway.settings import Settings
from gateway.side.siem import sinks
from gateway.side.siem.ocsf import OcsfEvent
from gateway.side.siem.sinks import JsonLinesSink, SinkDown, SyslogSink, hec_body, open_sinks
from tests.tls import self_signed
from tests.waiting import eventually


def events(start: int, count: int) -> list[OcsfEvent]:
    return [OcsfEvent(i, 1_767_225_600_005 + i, 1, "completion",
                      orjson.dumps({"index": i, "text": "é\n"}))
            for i in range(start, start + count)]  # fmt: skip


# -- file ------------------------------------------------------------------------------------


async def test_the_file_sink_appends_one_json_event_per_line(tmp_path: Path) -> None:
    path = tmp_path / "siem.jsonl"
    sink = JsonLinesSink(path)
    await sink.send(events(0, 3))
    await sink.send(events(3, 2))
    lines = path.read_bytes().splitlines()
    assert [orjson.loads(line)["index"] for line in lines] == [0, 1, 2, 3, 4]


async def test_a_file_that_cannot_be_written_is_a_sink_down(tmp_path: Path) -> None:
    with pytest.raises(SinkDown, match="file sink"):
        await JsonLinesSink(tmp_path / "missing" / "siem.jsonl").send(events(0, 1))
    with pytest.raises(SinkDown, match="file sink"):
        await JsonLinesSink(Path("/dev/full")).send(events(0, 1))  # ENOSPC on write


async def test_a_failed_write_leaves_no_half_batch(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "siem.jsonl"
    sink = JsonLinesSink(path)
    await sink.send(events(0, 2))
    before = path.read_bytes()

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(sinks.os, "fsync", failing_fsync)
    with pytest.raises(SinkDown, match="Input/output error"):
        await sink.send(events(2, 3))
    assert path.read_bytes() == before
    monkeypatch.undo()
    await sink.send(events(2, 3))
    assert [orjson.loads(x)["index"] for x in path.read_bytes().splitlines()] == [0, 1, 2, 3, 4]


# -- Splunk HEC ------------------------------------------------------------------------------


class Collector:
    """Splunk's HTTP Event Collector, as far as a sender can tell: records each POST and
    answers ``statuses`` in turn (then 200)."""

    def __init__(self, *statuses: int) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.paths: list[str] = []
        self.answered: list[int] = []
        self.statuses = list(statuses)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.posts.append((headers, body))
        self.paths.append(scope["path"])
        status = self.statuses.pop(0) if self.statuses else 200
        self.answered.append(status)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b'{"text":"Success","code":0}'})


def split_objects(body: bytes) -> list[dict[str, Any]]:
    """HEC's batch body: JSON objects one after the other."""
    decoder, text, at, out = json.JSONDecoder(), body.decode(), 0, []
    while at < len(text):
        obj, at = decoder.raw_decode(text, at)
        out.append(obj)
    return out


def test_the_hec_body_is_concatenated_envelopes_around_the_events() -> None:
    objects = split_objects(hec_body(events(0, 2), "gw-0"))
    assert objects == [
        {"time": 1_767_225_600.005, "host": "gw-0", "source": "thinkgate",
         "sourcetype": "ocsf:api_activity", "event": {"index": 0, "text": "é\n"}},
        {"time": 1_767_225_600.006, "host": "gw-0", "source": "thinkgate",
         "sourcetype": "ocsf:api_activity", "event": {"index": 1, "text": "é\n"}},
    ]  # fmt: skip


async def test_the_hec_sink_posts_with_the_splunk_token_and_needs_a_2xx() -> None:
    collector = Collector(503)
    async with BackgroundServer(collector) as server:
        settings = Settings(siem_hec_url=f"{server.url}/services/collector/event",
                            siem_hec_token=SecretStr("hec-token-1"))  # fmt: skip
        [sink] = open_sinks(settings, "gw-0", "1")
        try:
            with pytest.raises(SinkDown, match="answered 503") as refused:
                await sink.send(events(0, 2))
            assert "hec-token-1" not in str(refused.value)
            await sink.send(events(0, 2))
        finally:
            await sink.aclose()
    assert len(collector.posts) == 2
    headers, body = collector.posts[1]
    assert headers["authorization"] == "Splunk hec-token-1"
    assert headers["content-type"] == "application/json"
    assert [o["event"]["index"] for o in split_objects(body)] == [0, 1]


def test_a_hec_url_without_a_token_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="SIEM_HEC_TOKEN"):
        open_sinks(Settings(siem_hec_url="http://127.0.0.1:1/services/collector"), "h", "1")
    assert open_sinks(Settings(), "h", "1") == []


# -- syslog over TCP and TLS -----------------------------------------------------------------


class SyslogReceiver:
    """A TCP (or TLS) server that reads octet-counted frames, like rsyslog's imtcp."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.messages: list[bytes] = []
        self.connections: list[asyncio.StreamWriter] = []
        self._tls = tls
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                 ssl=self._tls)  # fmt: skip
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.connections:
            writer.close()
        await self.server.wait_closed()
        self.connections.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(writer)
        try:
            while True:
                length = int((await reader.readuntil(b" "))[:-1])
                self.messages.append(await reader.readexactly(length))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            writer.close()

    def indexes(self) -> list[int]:
        return [orjson.loads(m.split(b" - ", 1)[1])["index"] for m in self.messages]


@pytest.fixture
async def receiver() -> AsyncIterator[SyslogReceiver]:
    made = SyslogReceiver()
    await made.start()
    yield made
    await made.stop()


async def test_the_syslog_sink_sends_rfc5424_frames_on_one_connection(
    receiver: SyslogReceiver,
) -> None:
    sink = SyslogSink("127.0.0.1", receiver.port, None, "gw-0", "77")
    try:
        await sink.send(events(0, 3))
        await sink.send(events(3, 2))
        await eventually(lambda: len(receiver.messages) == 5, within_s=5)
    finally:
        await sink.aclose()
    assert receiver.indexes() == [0, 1, 2, 3, 4]
    assert len(receiver.connections) == 1
    assert receiver.messages[0].startswith(b"<110>1 2026-01-01T00:00:00.005Z gw-0 thinkgate 77 ")


async def test_a_batch_is_delivered_only_into_a_connection_the_receiver_still_reads(
    receiver: SyslogReceiver,
) -> None:
    """The receiver restarts between two batches. Writing into the old connection succeeds
    locally (the kernel takes the bytes, the peer answers with a reset): the sink must not
    call that delivered. Every batch it reports delivered is received, and a retry is."""
    sink = SyslogSink("127.0.0.1", receiver.port, None, "gw-0", "77")
    try:
        await sink.send(events(0, 1))
        await eventually(lambda: receiver.messages, within_s=5)
        for round_ in range(1, 4):
            await receiver.stop()  # closes the connection the sink holds
            await receiver.start()  # on the same port
            delivered = False
            for _attempt in range(2):
                try:
                    await sink.send(events(round_, 1))
                except SinkDown:
                    continue
                delivered = True
                break
            assert delivered
            await eventually(lambda r=round_: r in receiver.indexes(), within_s=5)
    finally:
        await sink.aclose()


async def test_a_receiver_that_is_down_is_a_sink_down(receiver: SyslogReceiver) -> None:
    await receiver.stop()
    sink = SyslogSink("127.0.0.1", receiver.port, None, "gw-0", "77", timeout_s=2)
    with pytest.raises(SinkDown, match="ConnectionRefusedError"):
        await sink.send(events(0, 1))


def certificate(directory: Path) -> ssl.SSLContext:
    """A self-signed certificate for 127.0.0.1 in ``directory/ca.pem``; the server's context."""
    return self_signed(directory, "127.0.0.1", "ca.pem")


async def test_tls_syslog_verifies_the_receiver_against_the_configured_ca(tmp_path: Path) -> None:
    receiver = SyslogReceiver(certificate(tmp_path))
    await receiver.start()
    url = f"tls://127.0.0.1:{receiver.port}"
    try:
        [trusting] = open_sinks(Settings(siem_syslog_url=url, siem_tls_ca_file=tmp_path / "ca.pem"),
                                "gw-0", "1")  # fmt: skip
        await trusting.send(events(0, 2))
        await trusting.aclose()
        await eventually(lambda: len(receiver.messages) == 2, within_s=5)
        assert receiver.indexes() == [0, 1]
        # without the CA the receiver's certificate is not trusted: nothing is sent
        [doubting] = open_sinks(Settings(siem_syslog_url=url), "gw-0", "1")
        with pytest.raises(SinkDown, match="SSLCertVerificationError"):
            await doubting.send(events(2, 1))
        await doubting.aclose()
        assert receiver.indexes() == [0, 1]
    finally:
        await receiver.stop()


def tcp_state(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    return int(sock.getsockopt(sinks.socket.IPPROTO_TCP, sinks.socket.TCP_INFO, 8)[0])


async def test_bytes_written_into_a_connection_the_receiver_closed_are_not_acknowledged(
    receiver: SyslogReceiver,
) -> None:
    """The case "drained" alone gets wrong: the receiver closed (a restart) before the sink
    noticed; the kernel takes the write, the peer answers it with a reset, and the bytes
    are gone. ``acknowledged`` reads the TCP state and says so."""
    assert hasattr(sinks.socket, "TCP_INFO") and sinks.SIOCOUTQ is not None  # Linux
    _, writer = await asyncio.open_connection("127.0.0.1", receiver.port)
    try:
        writer.write(b"5 hello")
        await writer.drain()
        await sinks.acknowledged(writer)  # a live receiver: acknowledged
        await eventually(lambda: receiver.messages == [b"hello"], within_s=5)
        await receiver.stop()
        await eventually(lambda: tcp_state(writer) != sinks.TCP_ESTABLISHED, within_s=5)
        writer.write(b"5 world")
        await writer.drain()  # accepted by this kernel all the same
        with pytest.raises(ConnectionResetError):
            await sinks.acknowledged(writer)
    finally:
        writer.close()
    assert receiver.messages == [b"hello"]
