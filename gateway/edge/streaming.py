"""Client disconnects and the streaming response.

``DisconnectWatcher`` cancels the request's task the moment the client disconnects (the body
has been read by then): while it waits for the upstream's first token, and while it relays (a
hidden-reasoning client may see no byte for minutes). On uvicorn's httptools protocol it is a
callback on the request's message event, elsewhere a task waiting on ``receive()``.
Disconnects cancel, never poll. Whoever catches the cancellation
asks ``watcher.claim(exc)``: if it was the watcher's, it is taken back (``Task.uncancel``) and
the request ends quietly; any other cancellation (server shutdown) propagates.

``RelayResponse`` streams an async iterator of bytes and, whatever happens, calls
``cleanup(disconnected)`` once at the end, even when the body never started (a generator's
own ``finally`` does not run then). Given a ``push`` and served by uvicorn's httptools
protocol, it hands ``push`` a ``DirectWriter`` instead: body bytes go straight onto the
client's transport, framed as uvicorn frames them, from wherever they are made (the upstream
connection's read callback), with no ASGI ``send`` per chunk. The response start and its end
still go through ``send``, so the server's state (keep-alive, the final chunk) stays its own;
``push`` returns the body's last piece (``[DONE]``), which goes out with that end in one write.

Plain asyncio on purpose: an anyio task group and cancel scope per request cost more CPU than
the rest of the request's handling on Python 3.11 (each asks for the current task, a
``getpid()`` system call there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

# The server's own ``send``, kept by the front door when frameworks wrap it (their wrappers
# only look at the response start, which still goes through them).
RAW_SEND = "thinkgate.send"


class DisconnectWatcher:
    """Cancels its owner (the request's task) the moment the client disconnects.

    Served by uvicorn's httptools protocol, it is a callback, not a task: the request's
    message event (which the protocol sets when the connection is lost) is swapped for one
    that also tells the watcher (``_Signal``). Elsewhere a task waits on ``receive()``.
    Neither leaves a reference cycle behind: ``stop`` unhooks the signal, and drops the task
    it cancels (a cancelled task holds its traceback, whose frame holds the watcher), so a
    request's objects are freed as it ends, not by the garbage collector.
    """

    __slots__ = ("_owner", "_signal", "_task", "disconnected")

    def __init__(self, receive: Receive) -> None:
        self.disconnected = False
        self._owner = asyncio.current_task()
        self._signal: _Signal | None = None
        self._task: asyncio.Task[None] | None = None
        cycle = getattr(receive, "__self__", None)
        if isinstance(cycle, RequestResponseCycle):
            self._signal = _Signal.hook(cycle, self)
        else:
            self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone()

    def gone(self) -> None:
        """The client left: the owner is cancelled (``claim`` takes it back)."""
        self.disconnected = True
        if self._owner is not None:
            self._owner.cancel()

    def claim(self, exc: asyncio.CancelledError) -> None:
        """Swallow ``exc`` if the watcher caused it, else re-raise it."""
        if not self.disconnected or self._owner is None:
            raise exc
        self._owner.uncancel()

    def stop(self) -> None:
        signal, self._signal = self._signal, None
        if signal is not None:
            signal.unhook(self)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()


class _Signal(asyncio.Event):
    """A request's message event that also tells its watchers when it signals a disconnect
    (uvicorn sets it after marking the cycle ``disconnected`` in ``connection_lost``). It
    holds its cycle only while a watcher is hooked: the cycle holds it, so no cycle is left."""

    def __init__(self) -> None:
        super().__init__()
        self._cycle: RequestResponseCycle | None = None
        self._watchers: list[DisconnectWatcher] = []

    @classmethod
    def hook(cls, cycle: RequestResponseCycle, watcher: DisconnectWatcher) -> _Signal:
        signal = cycle.message_event
        if not isinstance(signal, _Signal):
            signal = cls()
            if cycle.message_event.is_set():
                signal.set()  # what the server's event held carries over
            cycle.message_event = signal
        signal._cycle = cycle
        signal._watchers.append(watcher)
        if cycle.disconnected:  # gone before the watch began
            signal._tell()
        elif not cycle.response_complete:
            # as ``receive()`` does: a body past uvicorn's high-water mark left the reading
            # paused, and a paused connection's loss is not seen until the first write
            cycle.flow.resume_reading()
        return signal

    def set(self) -> None:
        super().set()
        if self._cycle is not None and self._cycle.disconnected:
            self._tell()

    def _tell(self) -> None:
        watchers, self._watchers, self._cycle = self._watchers, [], None
        for watcher in watchers:
            watcher.gone()

    def unhook(self, watcher: DisconnectWatcher) -> None:
        if watcher in self._watchers:
            self._watchers.remove(watcher)
        if not self._watchers:
            self._cycle = None


class DirectWriter:
    """Body bytes onto the client's transport, chunk-framed as uvicorn's httptools ``send``
    frames them; ``paused`` is uvicorn's flow control (the client reads slower than we write),
    ``drain()`` waits until it reads again. Writes after the client left are dropped (the
    disconnect cancels the request's task)."""

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self._transport = cycle.transport
        self._head = b""  # the response head ``start`` held, until a piece of the body carries it

    @classmethod
    async def start(cls, send: Send, raw: Send, message: Message) -> DirectWriter | None:
        """Send the response's start through ``send`` (``raw``: uvicorn's own, under the
        framework's wrappers) and return the writer under it, as ``of`` does. On uvicorn's
        httptools protocol the head uvicorn builds is held back, to go out in one write with
        the body's first piece: one system call and one segment fewer per response, and the
        client's first token arrives with its head. ``flush`` sends it alone once the first
        piece had nothing for the client (withheld reasoning), so the head is never later
        than the engine's first bytes were relayed."""
        cycle = getattr(raw, "__self__", None)
        if not isinstance(cycle, RequestResponseCycle) or cycle.response_started:
            await send(message)
            return cls.of(raw)
        held, transport = _Held(), cycle.transport
        cycle.transport = held  # type: ignore[assignment]  # uvicorn writes the head, once
        try:
            await send(message)
        finally:
            cycle.transport = transport
        writer = cls.of(raw)
        if writer is None:  # not chunked (an HTTP/1.0 client): the head goes as it is
            if held.head and not cycle.disconnected:
                transport.write(held.head)
            return None
        writer._head = held.head
        return writer

    @classmethod
    def of(cls, send: Send) -> DirectWriter | None:
        """The writer under ``send`` once the response started, if uvicorn's httptools
        protocol serves it with chunked framing; ``None`` otherwise (another server, an
        HTTP/1.0 client, a response already over): then ``send`` it is."""
        cycle = getattr(send, "__self__", None)
        if not isinstance(cycle, RequestResponseCycle):
            return None
        if not cycle.response_started or cycle.response_complete or cycle.disconnected:
            return None
        if cycle.chunked_encoding is not True:
            return None
        return cls(cycle)

    def write(self, data: bytes) -> None:
        if data and not self._cycle.disconnected:
            framed = b"%x\r\n%b\r\n" % (len(data), data)
            if self._head:
                framed, self._head = self._head + framed, b""
            self._transport.write(framed)

    def flush(self) -> None:
        """The held head, alone, if no piece of the body has carried it yet."""
        if self._head:
            head, self._head = self._head, b""
            if not self._cycle.disconnected:
                self._transport.write(head)

    @property
    def paused(self) -> bool:
        return self._cycle.flow.write_paused

    async def drain(self) -> None:
        if self._cycle.flow.write_paused and not self._cycle.disconnected:
            await self._cycle.flow.drain()


class _Held:
    """Stands for the client's transport while uvicorn writes a response's head: keeps it."""

    __slots__ = ("head",)

    def __init__(self) -> None:
        self.head = b""

    def write(self, data: bytes) -> None:
        self.head += data


class RelayResponse(Response):
    """A ``Response`` only so that frameworks pass it through untouched."""

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[bytes],
        watcher: DisconnectWatcher,
        cleanup: Callable[[bool], Awaitable[None]],
        headers: Sequence[tuple[str, str]] = (),
        push: Callable[[DirectWriter], Awaitable[bytes]] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            *((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers),
        ]
        self._body = body
        self._push = push
        self._watcher = watcher
        self._cleanup = cleanup
        self._completed = False  # the whole body went out; a disconnect after it is normal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        disconnected = False
        try:
            await self._stream(scope, send)
        except asyncio.CancelledError as exc:
            self._watcher.claim(exc)
            disconnected = True
        except OSError:  # the server reports a closed connection this way (ASGI 2.4)
            disconnected = True
        finally:
            self._watcher.stop()
            await asyncio.shield(self._cleanup(disconnected and not self._completed))

    async def _stream(self, scope: Scope, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        writer = None
        if self._push is None:
            await send(start)
        else:  # the head goes out with the first piece
            writer = await DirectWriter.start(send, scope.get(RAW_SEND, send), start)
        last = b""
        try:
            if writer is not None and self._push is not None:
                last = await self._push(writer)  # its last piece goes out with the end
            else:
                async for chunk in self._body:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            if writer is not None:
                writer.flush()  # before the server's own writes (the end, or its abort)
            aclose = getattr(self._body, "aclose", None)
            if aclose is not None:
                await aclose()
        await send({"type": "http.response.body", "body": last, "more_body": False})
        self._completed = True
