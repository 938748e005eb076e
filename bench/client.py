"""The load generator's HTTP/1.1 client: one keep-alive connection, one streamed request at a time.

Lean on purpose (it shares 2 cores with what it measures): a raw ``asyncio.Protocol``, one
callback per socket read, no coroutine switch per chunk. It understands what an
OpenAI-compatible server sends: a status line and headers, then a chunked, ``Content-Length``
or read-to-EOF body of SSE events separated by a blank line (``\\n\\n``).

Rules:

- A *chunk* is an event whose delta carries non-empty ``content``, ``reasoning_content`` or
  ``reasoning``; the role chunk (``"content": ""``), the usage chunk and ``[DONE]`` are not.
  The JSON is not decoded: the three keys are found with ``bytes.find`` (a quote inside a JSON
  string is escaped, so ``"content":""`` always means an empty string).
- Times are taken once per socket read: every event of one read arrived at the same moment.
- A response is an error when its status is not 200, when it carries an ``error`` event or
  object, when it ends without ``[DONE]``, or when the connection drops in its middle.
- The Responses API (``api="responses"``): a chunk is a ``response.output_text.delta`` or
  ``response.reasoning_text.delta`` event (non-empty ``delta``), the end is
  ``response.completed``/``response.incomplete``, an error is an ``error`` or
  ``response.failed`` event (its objects carry ``"error": null`` on success).
- Legacy completions (``api="completions"``): as chat, with the text in ``text``.
- Anthropic's Messages API (``api="messages"``): a chunk is a ``content_block_delta`` event
  carrying text or thinking (not a ``signature_delta``), the end is ``message_stop``, an error
  an ``error`` event.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Literal, cast

_TEXT_KEYS = (b'"content":"', b'"reasoning_content":"', b'"reasoning":"')
_ANSWER_KEYS = (b'"content":"',)  # a chat chunk's answer text (reasoning has keys of its own)
_COMPLETION_KEYS = (b'"text":"',)
Api = Literal["chat", "responses", "messages", "completions"]
_QUOTE = 0x22


class Recorder:
    """Counters shared by all connections; samples count only while the window is open."""

    def __init__(self) -> None:
        self.connections: set[asyncio.Transport] = set()
        self.recording = False
        self.stopped = False
        self.window_start = math.inf
        self.window_end = math.inf
        self.requests = 0
        self.chunks = 0
        self.errors = 0
        self.ttfts: list[float] = []  # to the first token: reasoning or answer
        self.answer_ttfts: list[float] = []  # to the first answer token (after the reasoning)
        self.gaps: list[float] = []
        self.first_error: str | None = None

    def open_window(self) -> None:
        self.window_start = time.perf_counter()
        self.recording = True

    def close_window(self) -> float:
        self.window_end = time.perf_counter()
        self.recording = False
        self.stopped = True
        return self.window_end - self.window_start

    def error(self, what: str) -> None:
        if self.stopped:
            return  # our own abort at the end of the run
        self.errors += 1
        if self.first_error is None:
            self.first_error = what


_HEAD, _CHUNKED, _LENGTH, _TO_EOF = range(4)


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, rec: Recorder, *, api: Api = "chat") -> None:
        self._rec = rec
        self._api = api
        self._transport: asyncio.Transport | None = None
        self.closed = False
        self._done: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self._mode = _HEAD
        self._buf = b""
        self._sse = b""
        self._status = 0
        self._remaining = 0
        self._keep_alive = True
        self._saw_done = False
        self._failed = False
        self._sent_at = 0.0
        self._last_chunk = -1.0
        self._answered = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._rec.connections.add(self._transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._transport is not None:
            self._rec.connections.discard(self._transport)
        if self._done is not None and self._mode == _TO_EOF:
            self._finish()
        elif self._done is not None:
            self._rec.error(f"connection lost mid-response: {exc or 'closed by peer'}")
            self._resolve()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buf = self._buf + data if self._buf else data
        if self._mode == _HEAD:
            buf = self._head(buf)
        if self._mode == _CHUNKED:
            buf = self._chunked(buf, now)
        elif self._mode == _LENGTH:
            self._remaining -= len(buf)
            self._body(buf[: len(buf) + min(0, self._remaining)], now)
            buf = b""
            if self._remaining <= 0:
                self._finish()
        elif self._mode == _TO_EOF:
            self._body(buf, now)
            buf = b""
        self._buf = buf

    # requests

    async def send(self, request: bytes) -> None:
        """Send one request and wait until its response ended (or the connection did)."""
        assert self._transport is not None
        self._reset()
        self._done = asyncio.get_running_loop().create_future()
        self._sent_at = time.perf_counter()
        self._transport.write(request)
        await self._done

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # parsing

    def _head(self, buf: bytes) -> bytes:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return buf
        lines = buf[:end].split(b"\r\n")
        self._status = int(lines[0][9:12])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self._keep_alive = headers.get(b"connection") != b"close"
        if headers.get(b"transfer-encoding") == b"chunked":
            self._mode = _CHUNKED
        elif b"content-length" in headers:
            self._mode, self._remaining = _LENGTH, int(headers[b"content-length"])
        else:
            self._mode, self._keep_alive = _TO_EOF, False
        if self._status != 200:
            self._fail(f"HTTP {self._status}")
        rest = buf[end + 4 :]
        if self._mode == _LENGTH and self._remaining == 0:
            self._finish()
        return rest

    def _chunked(self, buf: bytes, now: float) -> bytes:
        """Decode every complete chunk of ``buf``; return what is left for the next read."""
        pos = 0
        payload: list[bytes] = []
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].partition(b";")[0], 16)
            if size == 0:
                end = buf.find(b"\r\n\r\n", eol)  # the last chunk, then optional trailers
                if end < 0:
                    break
                self._body(b"".join(payload), now)
                self._finish()
                return buf[end + 4 :]
            end = eol + 2 + size
            if len(buf) < end + 2:
                break
            payload.append(buf[eol + 2 : end])
            pos = end + 2
        if payload:
            self._body(b"".join(payload), now)
        return buf[pos:]

    def _body(self, data: bytes, now: float) -> None:
        sse = self._sse + data if self._sse else data
        last = sse.rfind(b"\n\n")
        if last < 0:
            self._sse = sse
            return
        self._sse = sse[last + 2 :]
        for event in sse[:last].split(b"\n\n"):
            self._event(event, now)

    def _event(self, event: bytes, now: float) -> None:
        if self._api == "responses":
            self._responses_event(event, now)
        elif self._api == "messages":
            self._messages_event(event, now)
        elif event.startswith(b"data: [DONE]"):
            self._saw_done = True
        elif event.startswith(b"event: error") or b'"error":' in event:
            self._fail(f"error event: {event[:300]!r}")
        elif self._api == "completions":
            if _carries_text(event, _COMPLETION_KEYS):
                self._chunk(now, answer=True)
        elif _carries_text(event, _TEXT_KEYS):
            self._chunk(now, answer=_carries_text(event, _ANSWER_KEYS))

    def _responses_event(self, event: bytes, now: float) -> None:
        if event.startswith((b"event: response.output_text.delta",
                             b"event: response.reasoning_text.delta")):  # fmt: skip
            if b'"delta":""' not in event:
                self._chunk(now, answer=event.startswith(b"event: response.output_text"))
        elif event.startswith((b"event: response.completed", b"event: response.incomplete")):
            self._saw_done = True
        elif event.startswith((b"event: error", b"event: response.failed")):
            self._fail(f"error event: {event[:300]!r}")

    def _messages_event(self, event: bytes, now: float) -> None:
        if event.startswith(b"event: content_block_delta"):
            if b'"signature_delta"' not in event:
                self._chunk(now, answer=b'"text_delta"' in event)
        elif event.startswith(b"event: message_stop"):
            self._saw_done = True
        elif event.startswith(b"event: error"):
            self._fail(f"error event: {event[:300]!r}")

    def _chunk(self, now: float, *, answer: bool) -> None:
        rec = self._rec
        if rec.recording:
            rec.chunks += 1
            if self._last_chunk < 0:
                rec.ttfts.append(now - self._sent_at)
            elif self._last_chunk >= rec.window_start:
                rec.gaps.append(now - self._last_chunk)
            if answer and not self._answered:
                rec.answer_ttfts.append(now - self._sent_at)
        self._answered = self._answered or answer
        self._last_chunk = now

    def _fail(self, what: str) -> None:
        if not self._failed:
            self._failed = True
            self._rec.error(what)

    def _finish(self) -> None:
        if self._status == 200 and not self._saw_done:
            self._fail("the stream ended without [DONE]")
        if not self._failed and self._rec.recording:
            self._rec.requests += 1
        if not self._keep_alive and self._transport is not None:
            self._transport.close()
            self.closed = True
        self._resolve()

    def _resolve(self) -> None:
        done, self._done = self._done, None
        if done is not None and not done.done():
            done.set_result(None)
        self._mode = _HEAD


def _carries_text(event: bytes, keys: tuple[bytes, ...] = _TEXT_KEYS) -> bool:
    for key in keys:
        at = event.find(key)
        if at >= 0 and event[at + len(key)] != _QUOTE:
            return True
    return False
