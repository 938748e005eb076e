"""The forward loop of every completion-style route: one admitted exchange to the engine and back.

``Forwarder.run(ex, candidates, receive) -> Response`` opens the upstream (its status and first
bytes checked *before* the response starts), then either relays the stream (SSE parse →
rewrite → one client write per upstream read) or rewrites the whole response, and in every case
finishes the exchange exactly once (``Exchange.finish``: settle and record).

A stream is relayed one of two ways, by the same rules:

- pushed (``push_stream``; uvicorn's httptools protocol and the wire client, the default):
  ``_Pusher.data`` runs in the upstream connection's read callback, relays the read and writes
  it onto the client's transport; the request's task sleeps until the client is slow
  (``DirectWriter.paused``: the upstream socket is paused until the client drains, TCP
  backpressure to the engine), a continuation, the end or an error;
- pulled (``relay_stream``; any other server, the ``httpx`` transport): a task reads the
  upstream and hands each read to the ASGI ``send``. A route builds the
``Exchange`` with its own rewriter and calls ``run``; nothing here knows which API it speaks:
a stream goes through the rewriter's ``feed`` (``StreamRelay`` or a variant of it), a whole
response through its ``complete``.

Rules:

- Before the response starts, a failure is raised as the error it is (with the request's
  ``x-ratelimit-*`` headers); after it started, it becomes exactly one terminal SSE ``error``
  event, then ``[DONE]``.
- A client that disconnects cancels the request at once (``DisconnectWatcher``), while it waits
  for the first token as while it relays; the exchange is recorded as disconnected.
- ``[DONE]``, or the whole body, goes out only once the record is as durable as ``AUDIT_MODE``
  says; a ledger that refuses a failed stream's record changes nothing for its client.
- A stream whose reasoning is withheld may send the client nothing for minutes while the engine
  keeps sending: when an upstream read arrives ``keepalive_s`` after the client's last byte, an
  SSE comment goes out, so proxies keep the connection. (An engine that sends nothing at all is
  a stall, cut by ``IDLE_TIMEOUT_S``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive

from gateway.edge.streaming import DirectWriter, DisconnectWatcher, RelayResponse
from gateway.errors import GatewayError, RemoteProtocolError, UpstreamError, UpstreamProtocolError
from gateway.exchange.lifecycle import Exchange
from gateway.exchange.screening import (
    ScreenPlan,
    parse_read,
    relay_events,
    screen_whole,
    screened_output,
)
from gateway.relay.effort import COUNTING
from gateway.relay.rewrite import StreamRelay
from gateway.relay.sse import SSEParser
from gateway.upstream.engine import Upstream
from gateway.upstream.pool import UpstreamPool, UpstreamStream, translate

log = logging.getLogger("thinkgate")


@dataclass(frozen=True, slots=True)
class Forwarder:
    pool: UpstreamPool
    max_sse_event_bytes: int
    keepalive_s: float

    async def run(self, ex: Exchange, candidates: Sequence[Upstream], receive: Receive) -> Response:
        """The exchange, forwarded to the first candidate that answers, and finished once."""
        watcher = DisconnectWatcher(receive)
        streaming = False
        try:
            if isinstance(ex.rewriter, StreamRelay):
                response = await self._open(ex, ex.rewriter, candidates, watcher)
                streaming = True  # the response owns the watcher and the cleanup from here
                return response
            return await self._complete(ex, candidates)
        except GatewayError as exc:
            ex.fail(exc)  # before the upstream is known here: the pool counted its own failure
            if ex.upstream is None and isinstance(exc, UpstreamError):
                ex.upstream = exc.upstream_url  # failed before the response: for the record
            raise exc.with_headers((*ex.ticket.headers, *ex.notes)) from None
        except asyncio.CancelledError as exc:
            watcher.claim(exc)
            ex.disconnected()
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        finally:
            if not streaming:
                watcher.stop()
                # The success path already awaited (and raised) the record; here an error or a
                # disconnect is on its way out and must not be replaced by a ledger refusal.
                with contextlib.suppress(GatewayError):
                    await ex.finish()

    async def _open(
        self, ex: Exchange, relay: StreamRelay, candidates: Sequence[Upstream],
        watcher: DisconnectWatcher,
    ) -> RelayResponse:  # fmt: skip
        """Open the upstream stream (status and first bytes checked) and wrap it for the client,
        once the exchange's write-ahead intent is durable (made and committed while the engine
        worked: ``ex.intend`` runs once the request is on its way)."""
        ex.overhead_s = time.perf_counter() - ex.t0
        leg = await self._leg(ex, candidates, ex.request.upstream_body, ex.intend)
        try:
            await ex.confirm()
        except BaseException:
            await leg.stream.aclose()  # no answer without its intent: the engine stops
            raise

        async def cleanup(disconnected: bool) -> None:
            await leg.stream.aclose(ending=relay.done and not relay.stopped)
            if disconnected and ex.status != "ok":
                ex.disconnected()
            with contextlib.suppress(GatewayError):  # the stream is over: nobody left to tell
                await ex.finish()

        body = relay_stream(ex, leg, relay, self.keepalive_s)
        headers = (*ex.ticket.headers, *ex.notes, overhead_header(ex))

        async def push(writer: DirectWriter) -> bytes:
            return await push_stream(ex, leg, relay, writer, self.keepalive_s)

        pushed = leg.stream.wire is not None and ex.screen is None  # a screen needs the task
        return RelayResponse(body, watcher, cleanup, headers, push if pushed else None)

    async def detached(self, ex: Exchange, candidates: Sequence[Upstream]) -> AsyncIterator[bytes]:
        """The exchange with no client attached (a background response): every piece a
        client would get (no keep-alive comments), the terminal event last, and the exchange
        finished once. Closing or cancelling the iteration aborts the engine request and
        finishes the exchange with the status its owner set (``cancelled``)."""
        relay = ex.rewriter
        assert isinstance(relay, StreamRelay)
        ex.overhead_s = time.perf_counter() - ex.t0
        try:
            leg = await self._leg(ex, candidates, ex.request.upstream_body, ex.intend)
            try:
                await ex.confirm()  # before any event is stored for a client to read
            except BaseException:
                await leg.stream.aclose()
                raise
        except GatewayError as exc:
            if ex.upstream is None and isinstance(exc, UpstreamError):
                ex.upstream = exc.upstream_url
            yield _failed(ex, relay, exc)
            await _finish_quietly(ex)
            yield relay.end()
            return
        except BaseException:
            await _finish_quietly(ex)
            raise
        try:
            async for piece in relay_stream(ex, leg, relay, math.inf):
                yield piece
        finally:
            await leg.stream.aclose(ending=relay.done and not relay.stopped)
            await _finish_quietly(ex)

    async def _leg(
        self, ex: Exchange, candidates: Sequence[Upstream], body: bytes,
        sent: Callable[[], Awaitable[None]] | None = None,
    ) -> Leg:  # fmt: skip
        """The upstream stream of ``body``, opened on the first candidate that answers
        (``sent``: run once the request is on its way); a continuation
        (``gateway.relay.effort``) goes to the same upstream."""
        opened = await self.pool.open_stream(candidates, ex.path, body, ex.upstream_headers,
                                             sent)  # fmt: skip
        ex.upstream = opened.upstream.base_url

        async def reopen(continuation: bytes) -> UpstreamStream:
            return await self.pool.open_stream(
                [opened.upstream], ex.path, continuation, ex.upstream_headers
            )

        return Leg(opened, body, reopen, self.max_sse_event_bytes)

    async def _complete(self, ex: Exchange, candidates: Sequence[Upstream]) -> Response:
        ex.overhead_s = time.perf_counter() - ex.t0
        if ex.batch is not None:
            # a whole answer reaches nobody before its record, but a batch line's engine work
            # must be on the ledger even if this replica dies before it (its first attempt is
            # then ``replica_lost``, and the line runs again elsewhere: docs/batches.md)
            await ex.intend()
        budget = ex.rewriter.policy.budget
        if budget is not None and budget.enforcement == "gateway":
            body = await self._assembled(ex, candidates)
        else:
            upstream, body = await self.pool.complete(
                candidates, ex.path, ex.request.upstream_body, ex.upstream_headers
            )
            ex.upstream = upstream.base_url
        if ex.intention is not None:
            await ex.confirm()
        if ex.screen is not None:
            await screen_whole(ex.screen, ex.rewriter, body)
        ex.mark_first_token()
        arrived = time.perf_counter()
        try:
            body = ex.rewriter.complete(body)
        except RemoteProtocolError as exc:
            raise UpstreamProtocolError(str(exc)) from None
        if ex.rewriter.has_content:
            ex.mark_first_content()
        ex.status = "ok"
        ex.overhead_s += time.perf_counter() - arrived
        await ex.finish()
        headers = dict((*ex.ticket.headers, *ex.notes, overhead_header(ex)))
        return Response(orjson.dumps(body), media_type="application/json", headers=headers)

    async def _assembled(self, ex: Exchange, candidates: Sequence[Upstream]) -> dict[str, Any]:
        """A whole completion whose reasoning budget the gateway keeps: streamed from the
        upstream (the reasoning can only be cut while it comes), through a relay of its own
        that sees everything, and assembled into the chat completion the engine would have
        answered; the request's own rewriter then treats it like any whole response."""
        body = orjson.loads(ex.request.upstream_body)
        body.update(stream=True, stream_options=COUNTING)
        policy = ex.rewriter.policy
        inner = StreamRelay(dataclasses.replace(policy, show_reasoning=True,
                                                reasoning_field="reasoning",
                                                include_usage=True, guard=None))  # fmt: skip
        leg = await self._leg(ex, candidates, orjson.dumps(body))
        try:
            async for _ in upstream_output(ex, leg, inner):
                pass  # the inner relay keeps what the choice produced
        except RemoteProtocolError as exc:
            raise UpstreamProtocolError(str(exc)) from None
        finally:
            await leg.stream.aclose(ending=inner.done and not inner.stopped)
        return assembled(inner)


@dataclass(slots=True)
class Leg:
    """The upstream stream a relay reads now: the request's, then its continuation's."""

    stream: UpstreamStream
    body: bytes  # the request the stream answers
    reopen: Callable[[bytes], Awaitable[UpstreamStream]]
    max_event: int
    parser: SSEParser = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.parser = SSEParser(self.max_event)

    async def continue_with(self, body: bytes) -> None:
        await self.stream.aclose()  # cut short: the engine stops generating
        self.stream, self.body = await self.reopen(body), body
        self.parser = SSEParser(self.max_event)


def assembled(relay: StreamRelay) -> dict[str, Any]:
    """The chat completion a relay's stream made (its one choice; reasoning in its own field,
    so the request's rewriter reads it as the engine's separated reasoning)."""
    state = relay.choice(0)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(state.content) or None,
                               "reasoning": "".join(state.reasoning)}  # fmt: skip
    if state.tools.calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in (call.as_dict() for call in state.tools.calls)
        ]  # fmt: skip
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "choices": [{"index": 0, "message": message, "finish_reason": state.finish_reason}],
        "usage": relay.usage,
    }


def overhead_header(ex: Exchange) -> tuple[str, str]:
    """``x-thinkgate-overhead-ms``: the gateway's own time so far (for a stream, what it spent
    before the response started; the whole figure is in ``thinkgate_overhead_seconds``)."""
    return "x-thinkgate-overhead-ms", f"{ex.overhead_s * 1000:.3f}"


async def upstream_output(
    ex: Exchange, leg: Leg, relay: StreamRelay, screen: ScreenPlan | None = None
) -> AsyncIterator[bytes]:
    """What each upstream read makes for the client (``[DONE]`` held back; maybe nothing),
    across a continuation: when the relay's reasoning budget is spent, the leg moves on to the
    request that continues the turn. Raises the error that cut the stream short. With guard
    models (``screen``), the events wait for their verdicts (``screened_output``)."""
    if screen is not None:
        async for out in screened_output(ex, leg, relay, screen):
            yield out
        return
    while True:
        while raw := await leg.stream.read():
            arrived = time.perf_counter()
            out, error = relay_read(relay, leg.parser, raw)
            ex.observe_read(arrived)
            yield out
            if error is not None:
                raise error
            if relay.done or relay.cutting:
                break
        if not relay.cutting:
            break
        await leg.continue_with(relay.continuation(leg.body))
    if not relay.done:
        raise UpstreamProtocolError("the model server ended the stream before [DONE]")


async def relay_stream(
    ex: Exchange, leg: Leg, relay: StreamRelay, keepalive_s: float
) -> AsyncIterator[bytes]:
    """The relay loop: upstream reads in, one client write per upstream read out, then the
    stream's ending (``_ending``). Closing the upstream and the final ``finish`` belong to the
    response's cleanup, which also runs when this generator is cancelled or never started."""
    last_sent = time.perf_counter()
    error: BaseException | None = None
    try:
        async for out in upstream_output(ex, leg, relay, ex.screen):
            if out:
                ex.mark_first_token()
                yield out
                last_sent = time.perf_counter()
            elif time.perf_counter() - last_sent > keepalive_s:
                yield relay.keepalive  # upstream is busy with withheld reasoning
                last_sent = time.perf_counter()
    except (GatewayError, RemoteProtocolError) as exc:
        error = exc
    except Exception:  # a bug of ours: the client still gets its one terminal error event
        log.exception("relay failed (request %s)", ex.request_id)
        error = GatewayError("The gateway failed while streaming.")
    async for out in _ending(ex, relay, error):
        yield out


async def push_stream(
    ex: Exchange, leg: Leg, relay: StreamRelay, writer: DirectWriter, keepalive_s: float
) -> bytes:
    """The relay loop pushed: ``relay_stream``'s rules, with every upstream read relayed and
    written to the client from the connection's read callback (``_Pusher``); this task wakes
    only when the client is slow, for a continuation, and at the end. Returns ``[DONE]``, for
    the response's end to carry once the record is in."""
    pusher = _Pusher(ex, leg, relay, writer, keepalive_s)
    error: BaseException | None = None
    try:
        while True:
            outcome = await pusher.run()
            if outcome is _PAUSED:
                await writer.drain()
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            if not relay.cutting:
                break
            await leg.continue_with(relay.continuation(leg.body))
        if not relay.done:
            raise UpstreamProtocolError("the model server ended the stream before [DONE]")
    except (GatewayError, RemoteProtocolError) as exc:
        error = exc
    finally:
        pusher.stop()
    async for out in _ending(ex, relay, error, done=False):
        writer.write(out)  # the terminal error event goes out before the record is in
    return relay.end()


_PAUSED = object()  # the client is slow: the upstream is held back until it drains
_OVER = object()  # [DONE], the turn's reasoning budget spent (a continuation), the body's end


class _Pusher:
    """The upstream's sink while a stream is pushed: ``data`` runs in the connection's read
    callback and does what one turn of ``relay_stream`` does (relay the read, write it, keep
    the client's connection with a comment while reasoning is withheld); what needs the task
    (a slow client, the end, an error) resolves the future ``run()`` gave it."""

    __slots__ = ("_ex", "_held", "_keepalive_s", "_leg", "_loop", "_outcome", "_pushing",
                 "_relay", "_waiter", "_writer", "last_sent")  # fmt: skip

    def __init__(
        self, ex: Exchange, leg: Leg, relay: StreamRelay, writer: DirectWriter, keepalive_s: float
    ) -> None:
        self._ex, self._leg, self._relay, self._writer = ex, leg, relay, writer
        self._keepalive_s = keepalive_s
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._outcome: object = None  # what the task is to be told; None: nothing yet
        self._pushing = False  # the leg's stream pushes to this sink
        self._held = False  # its upstream is paused for a slow client
        self.last_sent = time.perf_counter()

    async def run(self) -> object:
        """Push until something needs the task: ``_PAUSED``, ``None`` (the stream stopped or
        its body ended: the caller tells ``[DONE]`` from a continuation from a missing end),
        or the error that cut the stream short."""
        if self._outcome is None:
            self._waiter = self._loop.create_future()
            if not self._pushing:  # a new stream: the request's, or its continuation's
                self._pushing = True
                if not self._leg.stream.push(self):
                    raise AssertionError("a pushed relay needs a stream that pushes")
                self._writer.flush()  # the first read gave the client nothing: the head alone
            elif self._held:  # the client drained: read on
                self._held = False
                self._leg.stream.resume()
            if self._outcome is None:
                await self._waiter
        outcome, self._outcome = self._outcome, None
        if outcome is _PAUSED:
            self._held = True
            return _PAUSED
        self._pushing = False
        return None if outcome is _OVER else outcome

    def data(self, raw: bytes) -> None:
        relay = self._relay
        try:
            arrived = time.perf_counter()
            out, error = relay_read(relay, self._leg.parser, raw)
            self._ex.observe_read(arrived)
            if out:
                self._ex.mark_first_token()
                self._writer.write(out)
                self.last_sent = arrived
            elif arrived - self.last_sent > self._keepalive_s:
                self._writer.write(relay.keepalive)  # upstream is busy with withheld reasoning
                self.last_sent = arrived
        except Exception:  # a bug of ours: the client still gets its one terminal error event
            log.exception("relay failed (request %s)", self._ex.request_id)
            error = GatewayError("The gateway failed while streaming.")
        if error is not None:
            self._settle(error)
        elif relay.done or relay.cutting:
            self._settle(_OVER)
        elif self._writer.paused:
            self._leg.stream.pause()
            self._settle(_PAUSED)

    def end(self, error: BaseException | None) -> None:
        self._settle(_OVER if error is None else translate(error, started=True))

    def _settle(self, outcome: object) -> None:
        if outcome is not _PAUSED:
            self._leg.stream.unhook()  # what else comes is not relayed
            self._outcome = outcome
        elif self._outcome is None:
            self._outcome = outcome
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def stop(self) -> None:
        """The stream is over here (or this task was cancelled): nothing more is pushed."""
        self._leg.stream.unhook()


async def _ending(
    ex: Exchange, relay: StreamRelay, error: BaseException | None, *, done: bool = True
) -> AsyncIterator[bytes]:
    """A stream's one ending, pulled or pushed: ``[DONE]`` once the record is as durable as
    ``AUDIT_MODE`` says; after a failure (the upstream's, ours, or the ledger refusing the
    record), first its one terminal error event, at once. ``done=False``: all but ``[DONE]``,
    which the caller sends itself when this is over (``relay.end()``)."""
    if error is None:
        ex.status = "ok"
        try:
            await ex.finish()
        except GatewayError as exc:  # the record was refused: the client is told
            error = exc
        except Exception:  # a bug of ours: the client still gets its one terminal error event
            log.exception("relay failed (request %s)", ex.request_id)
            error = GatewayError("The gateway failed while streaming.")
    if error is not None:
        failure = error if isinstance(error, GatewayError) else UpstreamProtocolError(str(error))
        yield _failed(ex, relay, failure)
        await _finish_quietly(ex)
    if done:
        yield relay.end()


def _failed(ex: Exchange, relay: StreamRelay, error: GatewayError) -> bytes:
    """The terminal error event; the outcome is recorded unless the record is already on its
    way (the ledger refused a completed stream's record: that record keeps its outcome)."""
    if not ex.finishing:
        ex.fail(error)
    return relay.error_event(error.to_json())


async def _finish_quietly(ex: Exchange) -> None:
    """``[DONE]`` after a failure, like after a success, waits until the record is as durable
    as ``AUDIT_MODE`` says. A ledger that refuses it changes nothing for this client: the
    stream already failed, and the refusal was logged where it happened."""
    with contextlib.suppress(GatewayError):
        await ex.finish()


def relay_read(
    relay: StreamRelay, parser: SSEParser, raw: bytes
) -> tuple[bytes, GatewayError | RemoteProtocolError | None]:
    """Everything due to the client for one upstream read (``[DONE]`` held back), and the
    error that cut it short, if any: the good events before a bad one still go out."""
    out: list[bytes] = []
    try:
        events, error = parse_read(parser, raw)
        relay_events(relay, events, out)
    except (GatewayError, RemoteProtocolError) as exc:
        return b"".join(out), exc
    return b"".join(out), error
