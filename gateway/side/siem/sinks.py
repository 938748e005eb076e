"""Where SIEM events go: syslog over TCP or TLS, a file of JSON lines, a Splunk HTTP Event
Collector. Each ``send`` returns once the batch is accepted, or raises ``SinkDown``.

What *accepted* means, per sink (the exporter moves its cursor only after every sink accepted):

- **syslog** (``SIEM_SYSLOG_URL``, ``tcp://host:port`` or ``tls://host:port``): the framed
  messages (``gateway.side.siem.syslog``) are written and drained, *and* the receiver's TCP has
  acknowledged every byte (Linux: the socket's send queue, ``SIOCOUTQ``, is empty, while the
  connection is still established). Plain TCP syslog has no application-level
  acknowledgement; "drained" alone only means the bytes reached this kernel, and a batch
  written into a connection the receiver had closed (it restarted) would be lost without
  an error. A connection that is not established any more fails the batch, which is sent
  again on a new connection. What the receiver loses after its TCP acknowledged (a crash
  before its own queue is on disk) is up to its configuration (rsyslog: a disk-assisted queue).
- **file** (``SIEM_FILE``): one JSON event per line, appended, flushed and ``fsync``'d (the
  directory too when the file was created). A failed write is cut back to where the batch
  began, so a retry never leaves half a line behind. The file is opened per batch: a log
  rotator may move it at any time.
- **hec** (``SIEM_HEC_URL``, ``SIEM_HEC_TOKEN``): one POST per batch, ``Authorization: Splunk
  <token>``, the body the events' HEC envelopes one after the other; any 2xx is accepted.

``SIEM_TLS_CA_FILE`` names the CA (PEM) that the syslog receiver's and the HEC's certificates
must chain to; without it, the system's trust store. Failures name the sink and the error type
or status, never the token and never an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import ssl
import struct
import termios
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol
from urllib.parse import urlsplit

import httpx
import orjson

from gateway.sections import SiemSettings
from gateway.side.siem.ocsf import OcsfEvent
from gateway.side.siem.syslog import frames

TIMEOUT_S: Final = 10.0  # per batch and sink: connect, write, acknowledgement, HTTP answer
SOURCETYPE: Final = b"ocsf:api_activity"
TCP_ESTABLISHED: Final = 1  # tcp_info.tcpi_state (linux/tcp_states.h)
SIOCOUTQ: Final = getattr(termios, "TIOCOUTQ", None)  # unsent + unacknowledged bytes (Linux)


class SinkDown(Exception):
    """A sink did not accept a batch; the message is safe to log."""


class SiemSink(Protocol):
    name: str  # the metric label: syslog, file, hec

    async def send(self, events: Sequence[OcsfEvent]) -> None: ...

    async def aclose(self) -> None: ...


class JsonLinesSink:
    name = "file"

    def __init__(self, path: Path) -> None:
        self.path = path

    async def send(self, events: Sequence[OcsfEvent]) -> None:
        data = b"".join(event.json + b"\n" for event in events)
        try:
            await asyncio.to_thread(append_durably, self.path, data)
        except OSError as exc:
            raise SinkDown(f"file sink: {exc.strerror or type(exc).__name__}") from None

    async def aclose(self) -> None:
        return None


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` and fsync it; on failure, cut the file back to its size."""
    created = not path.exists()
    with open(path, "ab") as file:
        start = file.tell()
        try:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                file.truncate(start)
            raise
    if created:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class HecSink:
    name = "hec"

    def __init__(self, url: str, token: str, hostname: str, client: httpx.AsyncClient) -> None:
        self._url = url
        self._headers = {"authorization": f"Splunk {token}", "content-type": "application/json"}
        self._host = hostname
        self._client = client

    async def send(self, events: Sequence[OcsfEvent]) -> None:
        body = hec_body(events, self._host)
        try:
            response = await self._client.post(self._url, content=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise SinkDown(f"hec sink unreachable: {type(exc).__name__}") from None
        if not 200 <= response.status_code < 300:
            raise SinkDown(f"hec sink answered {response.status_code}")

    async def aclose(self) -> None:
        await self._client.aclose()


def hec_body(events: Sequence[OcsfEvent], hostname: str) -> bytes:
    """Splunk HEC's batch shape: the events' envelopes (``time`` in epoch seconds,
    ``sourcetype``, ``event``) one after the other; the event JSON is spliced in as it is."""
    host = orjson.dumps(hostname)
    return b"".join(
        b'{"time":%d.%03d,"host":%s,"source":"thinkgate","sourcetype":"%s","event":%s}'
        % (*divmod(event.time_ms, 1000), host, SOURCETYPE, event.json)
        for event in events
    )


class SyslogSink:
    name = "syslog"

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, hostname: str,
                 procid: str, timeout_s: float = TIMEOUT_S) -> None:  # fmt: skip
        self._host, self._port, self._tls = host, port, tls
        self._hostname, self._procid = hostname, procid
        self._timeout = timeout_s
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send(self, events: Sequence[OcsfEvent]) -> None:
        data = frames(events, self._hostname, self._procid)
        try:
            async with asyncio.timeout(self._timeout):
                writer = await self._connected()
                writer.write(data)
                await writer.drain()
                await acknowledged(writer)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            await self.aclose()
            raise SinkDown(f"syslog sink: {type(exc).__name__}") from None

    async def _connected(self) -> asyncio.StreamWriter:
        if self._stream is not None:
            reader, writer = self._stream
            if not reader.at_eof() and not writer.is_closing():
                return writer
            await self.aclose()  # the receiver closed it while idle
        server_name = self._host if self._tls is not None else None
        self._stream = await asyncio.open_connection(
            self._host, self._port, ssl=self._tls, server_hostname=server_name
        )
        return self._stream[1]

    async def aclose(self) -> None:
        if self._stream is None:
            return
        writer, self._stream = self._stream[1], None
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(1):
                await writer.wait_closed()


async def acknowledged(writer: asyncio.StreamWriter) -> None:
    """Return once the peer's TCP has acknowledged every byte written; ``ConnectionResetError``
    once the connection is no longer established (the receiver closed or reset it). Where
    the platform cannot tell (no ``TCP_INFO``/``SIOCOUTQ``), return at once."""
    sock = writer.get_extra_info("socket")
    delay = 0.001
    while True:
        pending = unacknowledged(sock)
        if not pending:
            return
        await asyncio.sleep(delay)  # the kernel raises no event for an ACK that can be awaited
        delay = min(delay * 2, 0.05)


def unacknowledged(sock: socket.socket | None) -> int | None:
    """Bytes of ``sock`` the peer has not acknowledged, ``None`` if unknowable here."""
    tcp_info = getattr(socket, "TCP_INFO", None)
    if sock is None or tcp_info is None or SIOCOUTQ is None:
        return None
    if sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 8)[0] != TCP_ESTABLISHED:
        raise ConnectionResetError("the syslog receiver closed the connection")
    queued = fcntl.ioctl(sock.fileno(), SIOCOUTQ, struct.pack("i", 0))
    return int(struct.unpack("i", queued)[0])


def open_sinks(settings: SiemSettings, hostname: str, procid: str) -> list[SiemSink]:
    """The sinks the settings configure (none: no export). ``ValueError`` for a HEC URL
    without a token."""
    sinks: list[SiemSink] = []
    if settings.siem_syslog_url:
        url = urlsplit(settings.siem_syslog_url)
        if url.hostname is None or url.port is None:
            raise ValueError("SIEM_SYSLOG_URL needs a host and a port: tcp://host:port")
        tls = _tls_context(settings) if url.scheme == "tls" else None
        sinks.append(SyslogSink(url.hostname, url.port, tls, hostname, procid))
    if settings.siem_file is not None:
        sinks.append(JsonLinesSink(settings.siem_file))
    if settings.siem_hec_url:
        if settings.siem_hec_token is None:
            raise ValueError("SIEM_HEC_URL is set but SIEM_HEC_TOKEN is not")
        client = httpx.AsyncClient(timeout=TIMEOUT_S, verify=_tls_context(settings))
        token = settings.siem_hec_token.get_secret_value()
        sinks.append(HecSink(settings.siem_hec_url, token, hostname, client))
    return sinks


def _tls_context(settings: SiemSettings) -> ssl.SSLContext:
    cafile = str(settings.siem_tls_ca_file) if settings.siem_tls_ca_file else None
    return ssl.create_default_context(cafile=cafile)
