"""Upstream model servers: the pooled HTTP transport, routing, retries and the model catalogue.

- One httpx transport per app (created in the lifespan), HTTP/1.1 keep-alive: aiohttp's
  (``httpx-aiohttp``) by default, httpx's own pool as the alternative; measured in
  ``bench/RESULTS.md``, aiohttp's costs a third of the CPU per streamed chunk.
- Streams (the path every token takes) go straight to the aiohttp session under that
  transport, with no httpx objects or iterator layers per read; ``UpstreamStream.read()`` is
  one awaitable per read. With the ``httpx`` transport they go through httpx as below.
- Other requests are ``httpx.Request`` objects handed straight to the transport, without
  ``httpx.AsyncClient``: the client's per-request work (URL merging, cookie jar, auth and
  redirect flows) was a third of a request's CPU, and a gateway wants none of it. An upstream's
  cookies and redirects are never followed; its body streams as the transport yields it.
- Routing: among the upstreams that serve the model and are in rotation
  (``gateway.upstream.health``), the one with the fewest requests in flight (ties broken
  round-robin), since long reasoning streams make request counts a better load signal than
  connection counts. KV admission (``gateway.admission.budget``) then reorders by free KV budget.
- Health: ``probe_forever`` asks every engine's ``/health`` once per ``PROBE_S`` (a failed
  probe: unreachable, timeout or 5xx, which vLLM answers when its engine died; a 404 means an
  OpenAI-compatible server without that route, and passes); requests
  report their failures and successes. Engines that are out are skipped; if every engine of a
  model is out, 503 ``no_healthy_upstream``.
- Retry: a failure *before the first byte* reached the client (connection refused, timeout,
  5xx) is retried once on another upstream serving the model; a 4xx is the caller's and is
  never retried.
- Timeouts: connect, first token (response headers and first body bytes), idle (between
  reads; on aiohttp streams kept by an ``IdleWatch``, one timer per stream, not per read).
  The library exceptions of httpx and aiohttp are translated to ``UpstreamError`` in
  ``translate`` and nowhere else.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import aiohttp
import httpx
import orjson

from gateway.errors import (
    NotFound,
    ServiceUnavailable,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from gateway.settings import Settings
from gateway.upstream.engine import Upstream

T = TypeVar("T")
Headers = Sequence[tuple[bytes, bytes]]
log = logging.getLogger("thinkgate")

PROBE_S = 1.0


def translate(exc: BaseException, *, started: bool) -> UpstreamError:
    """One boundary for httpx/aiohttp/OS errors. ``started``: response headers were received."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, aiohttp.ConnectionTimeoutError) and not started:
        return UpstreamConnectError("could not connect to the model server")
    if isinstance(exc, httpx.TimeoutException | asyncio.TimeoutError | TimeoutError):
        if isinstance(exc, httpx.ConnectTimeout) and not started:
            return UpstreamConnectError("could not connect to the model server")
        return UpstreamTimeout("the model server did not answer in time")
    if not started and isinstance(
        exc, httpx.ConnectError | aiohttp.ClientConnectionError | OSError
    ):
        return UpstreamConnectError("could not connect to the model server")
    if isinstance(exc, httpx.HTTPError | aiohttp.ClientError | OSError):
        return UpstreamProtocolError("the model server closed the connection unexpectedly")
    raise exc


def create_transport(settings: Settings) -> httpx.AsyncBaseTransport:
    if settings.http_transport == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        return AiohttpTransport(client=lambda: _aiohttp_session(settings))
    limits = httpx.Limits(
        max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections
    )
    return httpx.AsyncHTTPTransport(limits=limits, trust_env=False)


def _aiohttp_session_of(transport: httpx.AsyncBaseTransport) -> aiohttp.ClientSession | None:
    """The aiohttp session under an ``httpx_aiohttp`` transport (made now: its lazy factory
    would make it on the first request anyway), ``None`` for any other transport."""
    from httpx_aiohttp import AiohttpTransport

    if not isinstance(transport, AiohttpTransport):
        return None
    if not isinstance(transport.client, aiohttp.ClientSession):
        transport.client = transport.get_client()
    return transport.client


def _aiohttp_session(settings: Settings) -> aiohttp.ClientSession:
    """The aiohttp session under httpx: no cookies, no proxies from the environment, and a
    16 KiB read buffer per response (aiohttp's default 64 KiB, doubled by its flow control,
    costs megabytes across a hundred streams that the client reads slower than vLLM writes)."""
    connector = aiohttp.TCPConnector(limit=settings.max_connections, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        read_bufsize=16 * 1024,
        auto_decompress=False,
    )


@dataclass(slots=True)
class UpstreamStream:
    """An upstream response whose status was checked and whose first bytes were read.

    ``read()`` gives the body as it arrives (the first bytes, then each read of the
    connection; ``b""`` at its end), with the libraries' errors translated: one awaitable per
    read, no iterator layers, on the path every streamed token takes."""

    upstream: Upstream
    first: bytes
    _next: Callable[[], Awaitable[bytes]] = field(repr=False)
    _close: Callable[[], Awaitable[Any]] = field(repr=False)
    _watch: IdleWatch | None = field(default=None, repr=False)
    _started: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)

    async def read(self) -> bytes:
        if not self._started:
            self._started = True
            if self.first:
                return self.first
        watch = self._watch
        if watch is None:
            try:
                return await self._next()
            except Exception as exc:
                raise translate(exc, started=True) from exc
        watch.waiting()
        try:
            chunk = await self._next()
        except Exception as exc:
            raise (_idle() if watch.fired else translate(exc, started=True)) from exc
        finally:
            watch.since = None
        if watch.fired:  # the abort may end the body rather than fail the read
            raise _idle()
        return chunk

    async def aclose(self) -> None:
        """Idempotent: release the upstream slot and the connection once."""
        if self._closed:
            return
        self._closed = True
        self.upstream.in_flight -= 1
        if self._watch is not None:
            self._watch.cancel()
        await self._close()


def _idle() -> UpstreamTimeout:
    return UpstreamTimeout("the model server did not answer in time")


class IdleWatch:
    """``IDLE_TIMEOUT_S`` while a stream waits for its next read, without a timer per read
    (aiohttp's ``sock_read`` moves one on every read: a measured cost per streamed token).
    One timer per stream, due ``idle_s`` after the wait it was set for began; when it fires
    and the current wait is younger, it is set again for that wait; when the wait is as old
    as ``idle_s``, ``abort`` closes the connection and the read raises ``UpstreamTimeout``.
    Time spent writing to a slow client is not waiting: only ``read()`` counts."""

    __slots__ = ("_abort", "_idle", "_loop", "_timer", "fired", "since")

    def __init__(self, idle_s: float, abort: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle = idle_s
        self._abort = abort
        self._timer: asyncio.TimerHandle | None = None
        self.since: float | None = None  # when the current wait began; None: not waiting
        self.fired = False

    def waiting(self) -> None:
        self.since = now = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(now + self._idle, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.since is None:
            return  # not waiting now: the next wait sets the timer again
        due = self.since + self._idle
        if self._loop.time() >= due:
            self.fired = True
            self._abort()
        else:
            self._timer = self._loop.call_at(due, self._check)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class UpstreamPool:
    def __init__(self, transport: httpx.AsyncBaseTransport, settings: Settings) -> None:
        self._transport = transport
        self._settings = settings
        self._headers = [(b"content-type", b"application/json"), (b"accept", b"*/*")]
        if settings.upstream_api_key.get_secret_value():
            token = settings.upstream_api_key.get_secret_value()
            self._headers.append((b"authorization", f"Bearer {token}".encode()))
        connect, idle = settings.connect_timeout_s, settings.idle_timeout_s
        self._timeouts = {"connect": connect, "read": idle, "write": idle, "pool": connect}
        # Streams go straight to aiohttp when the transport is aiohttp's (the default).
        self._session = _aiohttp_session_of(transport)
        self._base_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self._headers}
        # No sock_read: an IdleWatch per stream keeps IDLE_TIMEOUT_S (the first bytes are
        # under FIRST_TOKEN_TIMEOUT_S).
        self._aiohttp_timeout = aiohttp.ClientTimeout(sock_connect=connect, connect=connect)
        self.upstreams = [Upstream(u) for u in settings.upstreams]
        self._rr = itertools.count()
        self._catalogue: dict[str, list[Upstream]] = {}
        self._model_cards: list[dict[str, Any]] = []
        self._catalogue_at = -1.0
        self._catalogue_lock = asyncio.Lock()
        # Told of every failed attempt (metrics): the URL and the error.
        self.on_failure: Callable[[str, UpstreamError], None] | None = None

    # -- models ------------------------------------------------------------------------------

    async def model_cards(self) -> list[dict[str, Any]]:
        await self._refresh_catalogue()
        return self._model_cards

    async def route(self, model: str) -> list[Upstream]:
        """Upstreams serving ``model``, best first; ``NotFound`` when none does."""
        await self._refresh_catalogue()
        serving = self._catalogue.get(model)
        if not serving:
            raise NotFound(
                f"The model `{model}` does not exist.", param="model", code="model_not_found"
            )
        healthy = [u for u in serving if u.health.serving]
        if not healthy:
            raise ServiceUnavailable(
                f"Every model server for `{model}` is out of rotation (failing health checks).",
                code="no_healthy_upstream",
            )
        start = next(self._rr)
        rotated = [healthy[(start + i) % len(healthy)] for i in range(len(healthy))]
        return sorted(rotated, key=lambda u: u.in_flight)

    async def _refresh_catalogue(self) -> None:
        ttl = self._settings.models_cache_ttl_s
        if self._catalogue_at >= 0 and time.monotonic() - self._catalogue_at < ttl:
            return
        async with self._catalogue_lock:
            if self._catalogue_at >= 0 and time.monotonic() - self._catalogue_at < ttl:
                return
            results = await asyncio.gather(*(self._fetch_models(u) for u in self.upstreams))
            catalogue: dict[str, list[Upstream]] = {}
            cards: dict[str, dict[str, Any]] = {}
            for upstream, data in zip(self.upstreams, results, strict=True):
                for card in data:
                    catalogue.setdefault(card["id"], []).append(upstream)
                    cards.setdefault(card["id"], card)
            if not catalogue and not self._catalogue:
                raise ServiceUnavailable("no model server is reachable")
            if catalogue:  # keep serving the last known catalogue while all upstreams are down
                self._catalogue, self._model_cards = catalogue, list(cards.values())
                self._catalogue_at = time.monotonic()

    async def _fetch_models(self, upstream: Upstream) -> list[dict[str, Any]]:
        try:
            async with asyncio.timeout(self._settings.connect_timeout_s):
                response = await self._send("GET", upstream.url("/models"), b"")
                raw = await response.aread()
            body = orjson.loads(raw) if response.status_code == 200 else {}
        except (httpx.HTTPError, aiohttp.ClientError, OSError, orjson.JSONDecodeError):
            return []
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return []
        return [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]

    # -- health ------------------------------------------------------------------------------

    async def probe_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(u) for u in self.upstreams))
            await asyncio.sleep(PROBE_S)

    async def _probe(self, upstream: Upstream) -> None:
        try:
            async with asyncio.timeout(self._settings.connect_timeout_s):
                response = await self._send("GET", upstream.health_url, b"")
                await response.aread()
            ok = response.status_code < 500  # no /health at all (404) is not a sick engine
        except (httpx.HTTPError, aiohttp.ClientError, OSError, TimeoutError):
            ok = False
        if ok != upstream.health.probe_ok:
            log.warning("model server %s is %s rotation", upstream.base_url,
                        "back in" if ok else "out of")  # fmt: skip
        upstream.health.probed(ok)

    # -- requests ----------------------------------------------------------------------------

    async def open_stream(
        self, candidates: Sequence[Upstream], path: str, body: bytes, headers: Headers = ()
    ) -> UpstreamStream:
        """POST a streaming request to ``path`` (``/chat/completions``); return once the status
        is OK and first bytes are in. ``headers``: this request's own (``traceparent``), after
        the pool's."""
        return await self._with_retry(
            candidates, lambda u: self._open_stream_once(u.url(path), u, body, headers)
        )

    async def complete(
        self, candidates: Sequence[Upstream], path: str, body: bytes, headers: Headers = ()
    ) -> tuple[Upstream, Any]:
        """POST a non-streaming request to ``path`` and return the decoded JSON body."""
        return await self._with_retry(
            candidates, lambda u: self._complete_once(u.url(path), u, body, headers)
        )

    async def ask(self, upstream: Upstream, url: httpx.URL, body: bytes) -> dict[str, Any] | None:
        """POST ``body`` to one of an engine's own endpoints (``/tokenize``) once; ``None`` when
        it does not answer with JSON (an engine without that endpoint). Not counted as the
        engine's failure: nothing depends on it."""
        try:
            _, decoded = await self._complete_once(url, upstream, body, ())
        except UpstreamError:
            return None
        return decoded if isinstance(decoded, dict) else None

    async def _with_retry(
        self, candidates: Sequence[Upstream], attempt: Callable[[Upstream], Awaitable[T]]
    ) -> T:
        last: UpstreamError | None = None
        for upstream in candidates[:2]:
            try:
                result = await attempt(upstream)
            except UpstreamError as failed:
                exc = failed.at(upstream.base_url)
                if self.on_failure is not None and exc.outcome != "invalid":
                    self.on_failure(upstream.base_url, exc)  # the engine's fault, not a 4xx
                if not exc.retryable:
                    raise exc from failed.__cause__
                upstream.health.request_failed()
                last = exc
            else:
                upstream.health.request_succeeded()
                return result
        assert last is not None
        raise last

    async def _open_stream_once(
        self, url: httpx.URL, upstream: Upstream, body: bytes, headers: Headers
    ) -> UpstreamStream:
        if self._session is not None:
            return await self._open_aiohttp_stream(url, upstream, body, headers)
        upstream.in_flight += 1
        response: httpx.Response | None = None
        try:
            async with asyncio.timeout(self._settings.first_token_timeout_s):
                response = await self._send("POST", url, body, headers)
                if response.status_code >= 400:
                    raise UpstreamStatusError.from_body(
                        _json_or_none(await response.aread()), response.status_code
                    )
                _check_event_stream(response.headers.get("content-type"))
                stream = response.stream
                assert isinstance(stream, httpx.AsyncByteStream)  # an async transport's
                rest = aiter(stream)
                first = await anext(rest, b"")
            return UpstreamStream(upstream, first, partial(_next_bytes, rest), response.aclose)
        except BaseException as exc:
            upstream.in_flight -= 1
            if response is not None:
                await response.aclose()
            if isinstance(exc, Exception):
                raise translate(exc, started=response is not None) from exc
            raise

    async def _open_aiohttp_stream(
        self, url: httpx.URL, upstream: Upstream, body: bytes, headers: Headers
    ) -> UpstreamStream:
        """The same on aiohttp's own session, without httpx's request and response objects
        and iterator layers in between (measured in ``bench/RESULTS.md``)."""
        assert self._session is not None
        upstream.in_flight += 1
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(self._settings.first_token_timeout_s):
                response = await self._session.post(
                    str(url), data=body, headers=self._aiohttp_headers(headers),
                    timeout=self._aiohttp_timeout, allow_redirects=False,
                )  # fmt: skip
                if response.status >= 400:
                    raise UpstreamStatusError.from_body(
                        _json_or_none(await response.read()), response.status
                    )
                _check_event_stream(response.headers.get("content-type"))
                first = await response.content.readany()
            watch = IdleWatch(self._settings.idle_timeout_s, response.close)
            return UpstreamStream(upstream, first, response.content.readany, _closer(response),
                                  watch)  # fmt: skip
        except BaseException as exc:
            upstream.in_flight -= 1
            if response is not None:
                response.close()
            if isinstance(exc, Exception):
                raise translate(exc, started=response is not None) from exc
            raise

    def _aiohttp_headers(self, headers: Headers) -> dict[str, str]:
        if not headers:
            return self._base_headers
        merged = dict(self._base_headers)
        merged.update((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers)
        return merged

    async def _complete_once(
        self, url: httpx.URL, upstream: Upstream, body: bytes, headers: Headers
    ) -> tuple[Upstream, Any]:
        upstream.in_flight += 1
        try:
            async with asyncio.timeout(self._settings.first_token_timeout_s):
                response = await self._send("POST", url, body, headers)
                decoded = _json_or_none(await response.aread())
            if response.status_code >= 400:
                raise UpstreamStatusError.from_body(decoded, response.status_code)
            if not isinstance(decoded, dict):
                raise UpstreamProtocolError("the model server sent a response that is not JSON")
            return upstream, decoded
        except Exception as exc:
            raise translate(exc, started=False) from exc
        finally:
            upstream.in_flight -= 1

    async def _send(
        self, method: str, url: httpx.URL, body: bytes, headers: Headers = ()
    ) -> httpx.Response:
        """The response with its status and headers; the body is still to be read."""
        request = httpx.Request(
            method,
            url,
            headers=[*self._headers, *headers] if headers else self._headers,
            content=body,
            extensions={"timeout": self._timeouts},
        )
        return await self._transport.handle_async_request(request)


async def _next_bytes(chunks: AsyncIterator[bytes]) -> bytes:
    """The next non-empty chunk, ``b""`` at the end (``UpstreamStream.read``'s contract)."""
    async for chunk in chunks:
        if chunk:
            return chunk
    return b""


def _check_event_stream(kind: str | None) -> None:
    kind = kind or "text/event-stream"
    if "event-stream" not in kind:  # a proxy's HTML page, say: nothing valid came
        raise UpstreamProtocolError(f"the model server answered a stream with {kind.split(';')[0]}")


def _closer(response: aiohttp.ClientResponse) -> Callable[[], Awaitable[None]]:
    """Give the connection back (to the pool if the body was read to its end, else closed)."""

    async def close() -> None:
        if response.content.at_eof():
            response.release()
        else:  # cut short (a disconnect, an error): the connection cannot be reused
            response.close()

    return close


def _json_or_none(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
