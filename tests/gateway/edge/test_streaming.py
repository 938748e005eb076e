"""``DisconnectWatcher`` and ``RelayResponse`` (``gateway/edge/streaming.py``): a disconnect
cancels the request's task and is taken back by ``claim``, any other cancellation propagates,
and the response's cleanup runs exactly once whatever happens to the body; served by uvicorn,
a push writes straight to the transport, and elsewhere the body is streamed instead."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from gateway.edge.servers import BackgroundServer
from gateway.edge.streaming import DirectWriter, DisconnectWatcher, RelayResponse
from tests.waiting import eventually

SCOPE = {"type": "http", "method": "POST", "path": "/", "headers": []}


async def test_a_disconnect_cancels_the_owner_and_claim_takes_it_back() -> None:
    messages: asyncio.Queue[Message] = asyncio.Queue()

    async def owner() -> tuple[bool, int]:
        watcher = DisconnectWatcher(messages.get)
        try:
            await asyncio.Event().wait()  # waiting for the upstream's first token
        except asyncio.CancelledError as exc:
            watcher.claim(exc)
            current = asyncio.current_task()
            assert current is not None
            return watcher.disconnected, current.cancelling()
        finally:
            watcher.stop()
        raise AssertionError("the wait ended without a cancellation")

    task = asyncio.create_task(owner())
    messages.put_nowait({"type": "http.request", "body": b"", "more_body": False})
    await eventually(messages.empty, within_s=2)  # the watcher took it and looks for more
    assert not task.done()  # anything but http.disconnect is not a disconnect
    messages.put_nowait({"type": "http.disconnect"})
    assert await asyncio.wait_for(task, 2) == (True, 0)  # ended quietly, nothing pending
    await eventually(lambda: asyncio.all_tasks() == {asyncio.current_task()}, within_s=2)


async def test_another_cancellation_propagates_through_claim() -> None:
    started = asyncio.Event()
    watchers: list[DisconnectWatcher] = []

    async def owner() -> None:
        watcher = DisconnectWatcher(asyncio.Queue[Message]().get)  # the client never leaves
        watchers.append(watcher)
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            watcher.claim(exc)
            raise AssertionError("claim swallowed a cancellation it did not make") from None
        finally:
            watcher.stop()

    task = asyncio.create_task(owner())
    await asyncio.wait_for(started.wait(), 2)
    task.cancel()  # server shutdown
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert task.cancelled() and not watchers[0].disconnected


Cleanup = Callable[[bool], Awaitable[None]]


class Run:
    """One ``RelayResponse`` served in its own task (the watcher's owner), with a client
    whose ``receive`` and ``send`` the test controls."""

    def __init__(self, body: AsyncIterator[bytes], fail_send: BaseException | None = None) -> None:
        self.body, self.fail_send = body, fail_send
        self.messages: asyncio.Queue[Message] = asyncio.Queue()
        self.sent: list[Message] = []
        self.cleanups: list[bool] = []

    async def cleanup(self, disconnected: bool) -> None:
        self.cleanups.append(disconnected)

    async def send(self, message: Message) -> None:
        if self.fail_send is not None:
            raise self.fail_send
        self.sent.append(message)

    async def serve(self) -> None:
        watcher = DisconnectWatcher(self.messages.get)
        response = RelayResponse(self.body, watcher, self.cleanup, [("x-ratelimit-limit", "9")])
        await response(SCOPE, self.messages.get, self.send)

    async def serve_with(self, push: Callable[[DirectWriter], Awaitable[bytes]]) -> None:
        watcher = DisconnectWatcher(self.messages.get)
        response = RelayResponse(self.body, watcher, self.cleanup, push=push)
        await response(SCOPE, self.messages.get, self.send)

    @property
    def chunks(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


async def pieces(*parts: bytes, then: BaseException | None = None) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if then is not None:
        raise then
    await asyncio.Event().wait()  # a stream that has more to say, later


async def test_a_complete_stream_is_sent_and_cleaned_up_once() -> None:
    async def whole() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        yield b"data: [DONE]\n\n"

    run = Run(whole())
    await asyncio.wait_for(run.serve(), 2)
    start = run.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-type", b"text/event-stream") in start["headers"]
    assert (b"x-ratelimit-limit", b"9") in start["headers"]
    assert run.chunks == [b"data: 1\n\n", b"data: [DONE]\n\n", b""]
    assert run.sent[-1]["more_body"] is False
    assert run.cleanups == [False]


async def test_a_disconnect_mid_stream_ends_it_quietly_and_cleans_up_once() -> None:
    run = Run(pieces(b"data: 1\n\n"))
    task = asyncio.create_task(run.serve())
    await eventually(lambda: len(run.chunks) == 1, within_s=2)
    run.messages.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(task, 2)  # no CancelledError: the watcher's own was claimed
    assert run.cleanups == [True]
    assert not any(m.get("more_body") is False for m in run.sent)  # the body never ended


async def test_a_server_shutdown_propagates_and_still_cleans_up_once() -> None:
    run = Run(pieces(b"data: 1\n\n"))
    task = asyncio.create_task(run.serve())
    await eventually(lambda: len(run.chunks) == 1, within_s=2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert run.cleanups == [False]  # not the client's doing


async def test_a_body_that_never_starts_is_still_cleaned_up_once() -> None:
    """The connection is gone before the headers go out (the server raises ``OSError``): the
    body's generator never runs, so only the response can clean up."""
    started: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        started.append(True)
        yield b"data: 1\n\n"

    run = Run(body(), fail_send=OSError("connection closed"))
    await asyncio.wait_for(run.serve(), 2)
    assert started == [] and run.cleanups == [True]


async def test_a_body_that_raises_is_still_cleaned_up_once() -> None:
    run = Run(pieces(b"data: 1\n\n", then=RuntimeError("relay bug")))
    with pytest.raises(RuntimeError, match="relay bug"):
        await asyncio.wait_for(run.serve(), 2)
    assert run.chunks == [b"data: 1\n\n"]
    assert run.cleanups == [False]


async def test_served_by_uvicorn_a_push_writes_past_send_and_the_server_ends_it() -> None:
    """On uvicorn's httptools protocol the push gets a ``DirectWriter``: its writes reach the
    client framed as uvicorn frames chunks, the body iterator is never read, and the response
    ends through ``send`` (the final chunk, then the connection is reused)."""
    used: list[str] = []

    async def body() -> AsyncIterator[bytes]:
        used.append("pulled")
        yield b"pulled\n"

    async def push(writer: DirectWriter) -> bytes:
        used.append("pushed")
        writer.write(b"data: 1\n\n")
        assert not writer.paused
        return b"data: [DONE]\n\n"  # the last piece: out with the response's end

    async def cleanup(disconnected: bool) -> None:
        used.append(f"cleanup {disconnected}")

    writes: list[bytes] = []

    class Recorded:
        """The connection's transport, its writes recorded."""

        def __init__(self, transport: asyncio.Transport) -> None:
            self._transport = transport

        def write(self, data: bytes) -> None:
            writes.append(data)
            self._transport.write(data)

        def __getattr__(self, name: str) -> object:
            return getattr(self._transport, name)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        cycle = send.__self__  # type: ignore[attr-defined]
        cycle.transport = Recorded(cycle.transport)
        watcher = DisconnectWatcher(receive)
        await RelayResponse(body(), watcher, cleanup, push=push)(scope, receive, send)

    async with BackgroundServer(app) as server, httpx.AsyncClient() as client:
        for _ in range(2):
            writes.clear()
            response = await client.post(server.url)
            assert response.text == "data: 1\n\ndata: [DONE]\n\n"
            assert response.headers["transfer-encoding"] == "chunked"
            # the head with the pushed piece in one write, the last piece with the end in one
            assert len(writes) == 2, writes
            assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
            assert writes[0].endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
            assert writes[1] == b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
        assert server.open_connections == 1
    assert used == ["pushed", "cleanup False"] * 2


async def test_under_another_server_a_push_falls_back_to_the_body() -> None:
    async def push(writer: DirectWriter) -> bytes:
        raise AssertionError("no DirectWriter outside uvicorn's httptools protocol")

    run = Run(pieces(b"data: 1\n\n", then=EOFError()))
    watcher_run = asyncio.create_task(run.serve_with(push))
    with pytest.raises(EOFError):
        await asyncio.wait_for(watcher_run, 2)
    assert run.chunks == [b"data: 1\n\n"]


async def _read_body(receive: Receive) -> None:
    while (await receive()).get("more_body"):
        pass


async def _post_then_leave(server: BackgroundServer, waiting: asyncio.Event, size: int) -> None:
    """A client that posts ``size`` bytes, waits until the app waits, then closes."""
    _reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % size)
    writer.write(b"x" * size)
    await writer.drain()
    await asyncio.wait_for(waiting.wait(), 5)
    writer.close()  # the client leaves
    await writer.wait_closed()


@pytest.mark.parametrize("size", [2, 300_000])
async def test_served_by_uvicorn_a_disconnect_cancels_the_owner_without_a_task(size: int) -> None:
    """On uvicorn's httptools protocol the watcher is a callback on the request's message
    event: the connection's loss cancels the waiting owner, ``claim`` takes it back, and no
    task watches beside the request. A body past uvicorn's high-water mark (64 kB, an agent's
    context) leaves the connection's reading paused; the watch resumes it, as a ``receive()``
    would, or the loss would go unseen until the first write."""
    outcome: asyncio.Future[tuple[bool, int, int]] = asyncio.get_running_loop().create_future()
    waiting = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _read_body(receive)
        tasks = len(asyncio.all_tasks())
        watcher = DisconnectWatcher(receive)
        beside = len(asyncio.all_tasks()) - tasks
        try:
            waiting.set()
            await asyncio.Event().wait()  # the upstream's first token, which never comes
        except asyncio.CancelledError as exc:
            watcher.claim(exc)
            current = asyncio.current_task()
            assert current is not None
            outcome.set_result((watcher.disconnected, current.cancelling(), beside))
        finally:
            watcher.stop()

    async with BackgroundServer(app) as server:
        await _post_then_leave(server, waiting, size)
        assert await asyncio.wait_for(outcome, 5) == (True, 0, 0)


async def test_served_by_uvicorn_each_watcher_hooked_is_told_until_it_stops() -> None:
    """Three watchers on one request, the middle one stopped: the disconnect is told to the
    two still hooked (a later watcher does not silence an earlier one), not to the stopped."""
    told: asyncio.Future[tuple[bool, ...]] = asyncio.get_running_loop().create_future()
    waiting = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await _read_body(receive)
        watchers = [DisconnectWatcher(receive) for _ in range(3)]
        watchers[1].stop()
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            watchers[0].claim(exc)
            watchers[2].claim(exc)
            current = asyncio.current_task()
            assert current is not None and current.cancelling() == 0
            told.set_result(tuple(w.disconnected for w in watchers))
        finally:
            for watcher in watchers:
                watcher.stop()

    async with BackgroundServer(app) as server:
        await _post_then_leave(server, waiting, 0)
        assert await asyncio.wait_for(told, 5) == (True, False, True)
