"""Server-sent events: a sans-I/O parser for upstream bytes and an encoder for clients.

Parsing follows the WHATWG HTML "event stream interpretation" rules, restricted to what an
OpenAI-compatible server sends:

- Lines end with CRLF, LF or a lone CR. Input may be cut at *any* byte: mid-line, inside a
  multi-byte UTF-8 sequence, or between the CR and LF of one line end. Splitting happens on the
  bytes CR and LF only, which never occur inside a UTF-8 multi-byte sequence, so payloads stay
  bytes until the JSON decoder sees them whole.
- ``field: value`` with one optional space after the colon; a line without a colon is a field
  with an empty value; lines starting with ``:`` are comments (keep-alives) and are ignored.
- Several ``data:`` lines join with ``\\n``; a blank line dispatches the event; an event with no
  data is dropped, as the spec says.
- ``data: [DONE]`` is OpenAI's end-of-stream marker; it is an ordinary event here (``is_done``).
- The buffer is bounded: an event (pending line plus collected data) larger than ``max_event``
  bytes raises ``RemoteProtocolError``; the parser does not grow without limit on a peer that
  never sends a line end.

Each byte is scanned once: complete lines are cut off the buffer with one ``rfind`` and split in
C by ``bytes.splitlines`` (which, for bytes, breaks on exactly CR, LF and CRLF); the bytes of an
unfinished line are kept as the reads brought them and joined once its line end arrives, so a
long line fed one byte at a time costs linear time. When nothing is pending and the input has
no CR, whole ``data:`` events are cut out with one ``split`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import LocalProtocolError, RemoteProtocolError

DONE_DATA = b"[DONE]"
DEFAULT_MAX_EVENT = 1 << 20


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched server-sent event."""

    data: bytes
    event: str | None = None

    @property
    def is_done(self) -> bool:
        return self.data == DONE_DATA


class SSEParser:
    """Incremental SSE parser: ``feed(bytes) -> list[Event]``, ``close() -> list[Event]``."""

    __slots__ = ("_buf", "_buf_size", "_closed", "_data", "_event", "_max_event",
                 "_pending_size", "_skip_lf")  # fmt: skip

    def __init__(self, max_event: int = DEFAULT_MAX_EVENT) -> None:
        self._max_event = max_event
        # the bytes after the last line end seen, as the reads brought them: joined only once
        # a line end arrives, so a long line fed in small reads costs linear time
        self._buf: list[bytes] = []
        self._buf_size = 0
        self._skip_lf = False  # the previous feed ended in CR: a leading LF belongs to it
        self._data: list[bytes] = []
        self._pending_size = 0
        self._event: str | None = None
        self._closed = False

    def feed(self, chunk: bytes) -> list[Event]:
        if self._closed:
            raise LocalProtocolError("feed() after close()")
        if self._buf or self._data or self._event is not None or self._skip_lf or b"\r" in chunk:
            return self._feed_lines(chunk)
        # The common case: nothing pending and LF line ends. Whole events are the blocks
        # between blank lines; a lone ``data:`` line (what every OpenAI server sends) becomes
        # an event without the line machinery; anything else takes the general path.
        blocks = chunk.split(b"\n\n")
        tail = blocks.pop()
        events: list[Event] = []
        try:
            for block in blocks:
                if block[:6] == b"data: " and b"\n" not in block:
                    if len(block) - 6 > self._max_event:
                        raise RemoteProtocolError(
                            f"server-sent event larger than {self._max_event} bytes"
                        )
                    events.append(Event(block[6:]))
                elif block:
                    events += self._feed_lines(block + b"\n\n")
            if tail:
                events += self._feed_lines(tail)
        except RemoteProtocolError as exc:  # the good events before the bad one still count
            raise RemoteProtocolError(str(exc), events) from None
        return events

    def _feed_lines(self, chunk: bytes) -> list[Event]:
        """The general path: any line ends, partial lines and events across feeds."""
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        cut = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
        if cut < 0:
            if chunk:
                self._buf.append(chunk)
                self._buf_size += len(chunk)
            self._check_size()
            return []
        buf = b"".join((*self._buf, chunk)) if self._buf else chunk
        end = self._buf_size + cut
        rest = buf[end + 1 :]
        self._buf, self._buf_size = ([rest], len(rest)) if rest else ([], 0)
        # A CR that ends the input may be the first half of a CRLF split across feeds.
        self._skip_lf = end == len(buf) - 1 and buf[end] == 0x0D
        events: list[Event] = []
        for line in buf[: end + 1].splitlines():
            self._line(line, events)
        self._check_size()
        return events

    def close(self) -> list[Event]:
        """End of input. An unterminated last event is dropped (the spec's rule at EOF)."""
        self._closed = True
        self._buf, self._buf_size = [], 0
        self._data.clear()
        return []

    @property
    def has_partial(self) -> bool:
        """True when the stream stopped inside an event (bytes or data not yet dispatched)."""
        return bool(self._buf or self._data)

    def _line(self, line: bytes, events: list[Event]) -> None:
        if not line:
            if self._data:
                events.append(Event(b"\n".join(self._data), self._event))
            self._data.clear()
            self._pending_size = 0
            self._event = None
            return
        if line[:1] == b":":
            return
        field, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value)
            self._pending_size += len(value) + 1
            if self._pending_size > self._max_event:  # whatever the line ends and the reads
                self._check_size()
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")

    def _check_size(self) -> None:
        if self._buf_size + self._pending_size > self._max_event:
            raise RemoteProtocolError(f"server-sent event larger than {self._max_event} bytes")


def encode_data(payload: bytes) -> bytes:
    """One ``data:`` event. ``payload`` is compact JSON, which never contains a line end."""
    return b"data: " + payload + b"\n\n"


def encode_event(event: str, payload: bytes) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"
KEEPALIVE_COMMENT = b": keep-alive\n\n"
