"""``POST /v1/chat/completions`` and ``GET /v1/models``: the route handlers, as recipes.

read body (bounded) → authenticate → validate → route → admit → open the upstream and check
its status and first bytes *before* the response starts → relay (SSE parse → split → encode)
→ in ``finally``: settle and record.

Authentication comes before validation, as with OpenAI's API: an unauthenticated caller learns
nothing about the request schema. Everything that can fail before the first byte becomes an
HTTP error; after the response started, a failure yields exactly one SSE ``error`` event, then
``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.admission.budget import Grant, priority_of
from gateway.admission.limiter import Admission
from gateway.api.chat import ChatRequest, parse_chat_request
from gateway.auth.bearer import authenticate
from gateway.auth.keys import KeyInfo
from gateway.edge.streaming import DisconnectWatcher, RelayResponse
from gateway.errors import (
    ClientClosedRequest,
    GatewayError,
    LedgerUnavailable,
    RemoteProtocolError,
    RequestTimeout,
    RequestTooLarge,
    UpstreamError,
    UpstreamProtocolError,
)
from gateway.exchange.lifecycle import Exchange
from gateway.relay.rewrite import Policy, Rewriter, StreamRelay, rewrite_completion
from gateway.relay.sse import DONE_EVENT, KEEPALIVE_COMMENT, SSEParser, encode_event
from gateway.routes.state import AppState
from gateway.telemetry.logs import log_refusal
from gateway.telemetry.metrics import refusal_status
from gateway.telemetry.traceparent import parse_traceparent
from gateway.upstream.pool import Opened, Upstream
from ratelimit.fairness import Priority

log = logging.getLogger("thinkgate")


async def chat_completions(request: Request) -> Response:
    state: AppState = request.app.state.tg
    t0, started_at = time.perf_counter(), time.time()
    try:  # the key first: a client without one cannot make the gateway read a body
        key = await authenticate(state.keys, request.headers.get("authorization"), "client")
        raw = await read_body(request, state.settings.max_body_bytes, state.settings.body_timeout_s)
    except GatewayError as exc:  # counted and logged too: key guessing must leave a trace
        _refused(state, request, None, exc, "unknown", stream=False)
        raise
    chat, admission, grant, candidates = await prepare(state, request, key, raw)
    reasoning = state.settings.reasoning_for(chat.model)
    policy = Policy(
        format=reasoning.format,
        source=reasoning.source,
        thinking=reasoning.format.thinking(chat.params),
        show_reasoning=key.reasoning == "visible" and chat.wants_reasoning,
        reasoning_field=state.settings.reasoning_field,
        include_usage=chat.include_usage,
        repair_leak=chat.stream and chat.has_stop,
    )
    relay = StreamRelay(policy) if chat.stream else Rewriter(policy)
    ex = Exchange(request.state.request_id, key, chat, relay, admission, state.limiter, state.sink,
                  started_at=started_at, t0=t0,
                  metrics=state.metrics if state.instrument else None,
                  traceparent=parse_traceparent(request.headers.get("traceparent")))  # fmt: skip
    ex.release_kv = functools.partial(state.kv.release, grant)
    watcher = DisconnectWatcher(request.receive)
    streaming = False
    try:
        if isinstance(relay, StreamRelay):
            response = await open_relay(state, ex, relay, candidates, watcher)
            streaming = True  # the response owns the watcher and the cleanup from here
            return response
        return await complete(state, ex, candidates)
    except GatewayError as exc:
        ex.fail(exc)  # (the pool counted its own failures: not counted again here)
        if ex.upstream is None and isinstance(exc, UpstreamError):
            ex.upstream = (
                exc.upstream_url
            )  # failed before the response: which server, for the record
        exc.context_headers = admission.headers
        raise
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


async def prepare(
    state: AppState, request: Request, key: KeyInfo, raw: bytes
) -> tuple[ChatRequest, Admission, Grant, list[Upstream]]:
    """Validate, route and admit: everything that may refuse the request before any upstream
    is asked. A refusal is counted (``thinkgate_requests_total``, and by kind for limits)."""
    try:
        chat = parse_chat_request(raw)
    except GatewayError as exc:
        _refused(state, request, key, exc, "unknown", stream=False)
        raise
    served = False  # a metrics label only for a model an upstream serves: labels stay bounded
    try:
        if not state.sink.accepting():
            raise LedgerUnavailable("The audit ledger cannot store records; try again later.")
        ceiling = state.settings.priority_ceiling(key.key_id, key.tenant)
        priority = priority_of(request.headers.get("x-thinkgate-priority"), ceiling)
        candidates = await state.upstreams.route(chat.model)
        served = True
        tokens = estimate_tokens(chat, state)
        admission, grant, candidates = await admit(state, key, candidates, priority, tokens)
    except GatewayError as exc:
        _refused(state, request, key, exc, chat.model, chat.stream, served=served)
        raise
    return chat, admission, grant, candidates


def _refused(
    state: AppState, request: Request, key: KeyInfo | None, error: GatewayError, model: str,
    stream: bool, *, served: bool = False,
) -> None:  # fmt: skip
    """Count and log a refusal. The log line names the model asked for; the metrics label
    only one an upstream serves (``unknown`` otherwise)."""
    tenant, key_id = (key.tenant, key.key_id) if key is not None else ("unknown", "")
    state.metrics.refused(error, model if served else "unknown", tenant, stream)
    traceparent = parse_traceparent(request.headers.get("traceparent"))
    log_refusal(request.state.request_id, tenant, key_id, model, refusal_status(error),
                error.code, traceparent)  # fmt: skip


async def admit(
    state: AppState, key: KeyInfo, candidates: list[Upstream], priority: Priority, tokens: int
) -> tuple[Admission, Grant, list[Upstream]]:
    """Rate limits and KV budget, asked at once: with Redis, their two scripts share one round
    trip (``ratelimit.autopipe``). Whichever refuses, the other's reservation is given back."""
    kv = asyncio.ensure_future(state.kv.admit(candidates, key.tenant, priority, tokens))
    try:
        admission = await state.limiter.admit(key, tokens)
    except BaseException:
        kv.cancel()  # a grant it already had is released below; one in flight, by the task
        with contextlib.suppress(BaseException):
            await state.kv.release((await kv)[0])
        raise
    try:
        grant, ordered = await kv
    except BaseException as exc:
        await state.limiter.settle(admission, 0)  # refused: the reservation comes back whole
        if isinstance(exc, GatewayError):
            exc.context_headers = admission.headers
        raise
    return admission, grant, ordered


async def open_relay(
    state: AppState,
    ex: Exchange,
    relay: StreamRelay,
    candidates: list[Upstream],
    watcher: DisconnectWatcher,
) -> RelayResponse:
    """Open the upstream stream (status and first bytes checked) and wrap it for the client."""
    ex.overhead_s = time.perf_counter() - ex.t0
    opened = await state.upstreams.open_stream(
        candidates, ex.chat.upstream_body, ex.upstream_headers
    )
    ex.upstream = opened.upstream.base_url

    async def cleanup(disconnected: bool) -> None:
        await opened.aclose()
        if disconnected and ex.status != "ok":
            ex.disconnected()
        with contextlib.suppress(GatewayError):  # the stream is over: nobody left to tell
            await ex.finish()

    parser = SSEParser(state.settings.max_sse_event_bytes)
    body = relay_stream(ex, opened, relay, parser, state.settings.keepalive_s)
    return RelayResponse(body, watcher, cleanup, (*ex.admission.headers, _overhead_header(ex)))


async def complete(state: AppState, ex: Exchange, candidates: list[Upstream]) -> Response:
    ex.overhead_s = time.perf_counter() - ex.t0
    upstream, body = await state.upstreams.complete(
        candidates, ex.chat.upstream_body, ex.upstream_headers
    )
    ex.upstream = upstream.base_url
    ex.mark_first_token()
    arrived = time.perf_counter()
    try:
        rewrite_completion(ex.rewriter, body)
    except RemoteProtocolError as exc:
        raise UpstreamProtocolError(str(exc)) from None
    if ex.rewriter.has_content:
        ex.mark_first_content()
    ex.status = "ok"
    ex.overhead_s += time.perf_counter() - arrived
    await ex.finish()
    headers = dict((*ex.admission.headers, _overhead_header(ex)))
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


def _overhead_header(ex: Exchange) -> tuple[str, str]:
    """``x-thinkgate-overhead-ms``: the gateway's own time so far (for a stream, what it spent
    before the response started; the whole figure is in ``thinkgate_overhead_seconds``)."""
    return "x-thinkgate-overhead-ms", f"{ex.overhead_s * 1000:.3f}"


async def relay_stream(
    ex: Exchange, opened: Opened, relay: StreamRelay, parser: SSEParser, keepalive_s: float
) -> AsyncIterator[bytes]:
    """The relay loop: upstream reads in, one client write per upstream read out. Closing the
    upstream and the final ``finish`` belong to the response's cleanup, which also runs when
    this generator is cancelled or never started."""
    last_sent = time.perf_counter()
    try:
        async for raw in opened:
            arrived = time.perf_counter()
            out, error = _relay_read(relay, parser, raw)
            ex.observe_read(arrived)
            if out:
                ex.mark_first_token()
                yield out
                last_sent = time.perf_counter()
            elif arrived - last_sent > keepalive_s:
                yield KEEPALIVE_COMMENT  # upstream is busy with withheld reasoning
                last_sent = time.perf_counter()
            if error is not None:
                raise error
            if relay.done:
                break
        if not relay.done:
            raise UpstreamProtocolError("the model server ended the stream before [DONE]")
        ex.status = "ok"
        await ex.finish()
        yield DONE_EVENT
    except (GatewayError, RemoteProtocolError) as exc:
        error = exc if isinstance(exc, GatewayError) else UpstreamProtocolError(str(exc))
        yield _failed(ex, error)
        await _finish_quietly(ex)
        yield DONE_EVENT
    except Exception:  # a bug of ours: the client still gets its one terminal error event
        log.exception("relay failed (request %s)", ex.request_id)
        yield _failed(ex, GatewayError("The gateway failed while streaming."))
        await _finish_quietly(ex)
        yield DONE_EVENT


def _failed(ex: Exchange, error: GatewayError) -> bytes:
    """The terminal error event; the outcome is recorded unless the record is already on its
    way (the ledger refused a completed stream's record: that record keeps its outcome)."""
    if not ex.finishing:
        ex.fail(error)
    return encode_event("error", error.to_json())


async def _finish_quietly(ex: Exchange) -> None:
    """``[DONE]`` after a failure, like after a success, waits until the record is as durable
    as ``AUDIT_MODE`` says. A ledger that refuses it changes nothing for this client: the
    stream already failed, and the refusal was logged where it happened."""
    with contextlib.suppress(GatewayError):
        await ex.finish()


def _relay_read(
    relay: StreamRelay, parser: SSEParser, raw: bytes
) -> tuple[bytes, GatewayError | RemoteProtocolError | None]:
    """Everything due to the client for one upstream read (``[DONE]`` held back), and the
    error that cut it short, if any: the good events before a bad one still go out."""
    out: list[bytes] = []
    try:
        try:
            events = parser.feed(raw)
            error: RemoteProtocolError | None = None
        except RemoteProtocolError as exc:  # keep what came before the bad event
            events, error = exc.events, exc
        for event in events:
            data = relay.feed(event)
            if relay.done:
                break
            out.append(data)
    except (GatewayError, RemoteProtocolError) as exc:
        return b"".join(out), exc
    return b"".join(out), error


async def models(request: Request) -> Response:
    state: AppState = request.app.state.tg
    await authenticate(state.keys, request.headers.get("authorization"), "client")
    cards = await state.upstreams.model_cards()
    return Response(orjson.dumps({"object": "list", "data": cards}), media_type="application/json")


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """At most ``limit`` bytes within ``timeout_s``: a client that uploads a byte at a time
    cannot hold a request (and its buffer) open for ever."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"The request body exceeds the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestTooLarge(f"The request body exceeds the limit of {limit} bytes.")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"The request body was not received within {timeout_s:g} s.") from None
    except ClientDisconnect:
        raise ClientClosedRequest("The client closed the connection during the upload.") from None
    return b"".join(chunks)


def estimate_tokens(chat: ChatRequest, state: AppState) -> int:
    """OpenAI's reservation rule: prompt estimate (bytes / 4) + max_tokens, per choice."""
    prompt = len(chat.upstream_body) // 4
    return prompt + chat.n * (chat.max_tokens or state.settings.default_max_tokens)
