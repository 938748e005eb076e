"""Upstream model servers: the HTTP client, routing, retries and the model catalogue.

- One client for everything sent to an engine (``HTTP_TRANSPORT=wire``, the default):
  thinkgate's own HTTP/1.1 client (``gateway.upstream.wire``), keep-alive connections per
  engine. Streams (the path every token takes): ``UpstreamStream.read()`` is one awaitable per
  read, and ``push(sink)`` hands each read to the relay from the socket's read callback, with
  no task woken per token; whole requests, ``/v1/models`` and the health probes go over the
  same connections. (It replaced aiohttp under httpx for all but streams: one client, one
  error translation, and the aiohttp library's RSS gone.)
- ``HTTP_TRANSPORT=httpx``: everything on httpx's own pool, streams read by a task. The KV
  scraper (``gateway.admission.budget``) uses the httpx transport in both modes.
- httpx requests are ``httpx.Request`` objects handed straight to the transport, without
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
- Timeouts: connect, first token (response headers and first body bytes; a whole response's
  whole body), idle (between reads; on wire streams kept by an ``IdleWatch``, one timer per
  stream, not per read). The library exceptions of httpx and the wire client are translated to
  ``UpstreamError`` in ``translate`` and nowhere else.
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
from gateway.settings import UpstreamSettings
from gateway.upstream.engine import Upstream
from gateway.upstream.wire import IdleWatch, Sink, WireError, WirePool, WireResponse

T = TypeVar("T")
Headers = Sequence[tuple[bytes, bytes]]
log = logging.getLogger("thinkgate")

PROBE_S = 1.0


def translate(exc: BaseException, *, started: bool) -> UpstreamError:
    """One boundary for httpx/wire/OS errors. ``started``: response headers were received."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, WireError):
        return UpstreamProtocolError(str(exc))
    if isinstance(exc, httpx.TimeoutException | asyncio.TimeoutError | TimeoutError):
        if isinstance(exc, httpx.ConnectTimeout) and not started:
            return UpstreamConnectError("could not connect to the model server")
        return UpstreamTimeout("the model server did not answer in time")
    if not started and isinstance(exc, httpx.ConnectError | OSError):
        return UpstreamConnectError("could not connect to the model server")
    if isinstance(exc, httpx.HTTPError | OSError):
        return UpstreamProtocolError("the model server closed the connection unexpectedly")
    raise exc


def _once(step: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """``step``, run by the first call only (a request sent again, to a new connection or
    the next candidate, does not run it again)."""
    ran = False

    async def first() -> None:
        nonlocal ran
        if not ran:
            ran = True
            await step()

    return first


def create_transport(settings: UpstreamSettings) -> httpx.AsyncBaseTransport:
    """httpx's pool: every upstream request with ``HTTP_TRANSPORT=httpx``, the KV scraper's
    always."""
    limits = httpx.Limits(
        max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections
    )
    return httpx.AsyncHTTPTransport(limits=limits, trust_env=False)


@dataclass(slots=True)
class UpstreamStream:
    """An upstream response whose status was checked and whose first bytes were read.

    ``read()`` gives the body as it arrives (the first bytes, then each read of the
    connection; ``b""`` at its end), with the libraries' errors translated: one awaitable per
    read, no iterator layers. ``push(sink)`` (the wire client's streams; ``False`` for the
    ``httpx`` transport's) hands every read to the sink from the connection's read callback
    instead; the sink sees the wire's own errors, to be ``translate``d."""

    upstream: Upstream
    first: bytes
    _next: Callable[[], Awaitable[bytes]] = field(repr=False)
    _close: Callable[[], Awaitable[Any]] | None = field(repr=False)  # None: ``wire.release``
    wire: WireResponse | None = field(default=None, repr=False)
    _started: bool = field(default=False, repr=False)
    _closed: bool = field(default=False, repr=False)

    async def read(self) -> bytes:
        if not self._started:
            self._started = True
            if self.first:
                return self.first
        try:
            return await self._next()
        except Exception as exc:
            raise translate(exc, started=True) from exc

    def push(self, sink: Sink) -> bool:
        """Every read from now on (the first bytes, if not read yet) to ``sink``; ``False``
        when this stream can only be read."""
        wire = self.wire
        if wire is None:
            return False
        if not self._started:
            self._started = True
            if self.first:
                wire.unread(self.first)
        wire.push(sink)
        return True

    def pause(self) -> None:
        """A pushed stream's upstream held back (the client is slow); ``resume`` reads on."""
        if self.wire is not None:
            self.wire.pause()

    def resume(self) -> None:
        if self.wire is not None:
            self.wire.resume()

    def unhook(self) -> None:
        """Nothing more is pushed; what else comes is kept for ``read`` or dropped."""
        if self.wire is not None:
            self.wire.unhook()

    async def aclose(self, ending: bool = False) -> None:
        """Idempotent: release the upstream slot and the connection once. ``ending``: the
        body's last event came (``[DONE]``): a wire connection waits for the rest of its
        framing and is kept alive rather than closed."""
        if self._closed:
            return
        self._closed = True
        self.upstream.in_flight -= 1
        if self.wire is not None:
            self.wire.release(ending)
        elif self._close is not None:
            await self._close()


def _idle() -> UpstreamTimeout:
    return UpstreamTimeout("the model server did not answer in time")


class UpstreamPool:
    def __init__(self, transport: httpx.AsyncBaseTransport, settings: UpstreamSettings) -> None:
        self._transport = transport
        self._settings = settings
        self._headers = [(b"content-type", b"application/json"), (b"accept", b"*/*")]
        if settings.upstream_api_key.get_secret_value():
            token = settings.upstream_api_key.get_secret_value()
            self._headers.append((b"authorization", f"Bearer {token}".encode()))
        connect, idle = settings.connect_timeout_s, settings.idle_timeout_s
        self._timeouts = {"connect": connect, "read": idle, "write": idle, "pool": connect}
        # A whole response is silent until the engine finished it: all of it is its first
        # token's wait, not a stall between reads.
        first = settings.first_token_timeout_s
        self._whole_timeouts = {**self._timeouts, "read": first}
        # Everything goes over the wire client unless HTTP_TRANSPORT=httpx.
        wired = settings.http_transport == "wire"
        self.wire = WirePool(settings.max_connections) if wired else None
        self.upstreams = [Upstream(u) for u in settings.upstreams]
        self._rr = itertools.count()
        self._catalogue: dict[str, list[Upstream]] = {}
        self._model_cards: list[dict[str, Any]] = []
        self._contexts: dict[str, int] = {}  # per model, the smallest max_model_len reported
        self._catalogue_at = -1.0
        self._catalogue_lock = asyncio.Lock()
        # Told of every failed attempt (metrics): the URL and the error.
        self.on_failure: Callable[[str, UpstreamError], None] | None = None

    def close(self) -> None:
        """Close the wire client's connections (the httpx transport closes its own)."""
        if self.wire is not None:
            self.wire.close()

    # -- models ------------------------------------------------------------------------------

    async def model_cards(self) -> list[dict[str, Any]]:
        await self._refresh_catalogue()
        return self._model_cards

    async def context_length(self, model: str) -> int | None:
        """The smallest ``max_model_len`` the engines serving ``model`` report (vLLM's
        ``/v1/models``); ``None`` when none does."""
        await self._refresh_catalogue()
        return self._contexts.get(model)

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
            contexts: dict[str, int] = {}
            for upstream, data in zip(self.upstreams, results, strict=True):
                for card in data:
                    catalogue.setdefault(card["id"], []).append(upstream)
                    cards.setdefault(card["id"], card)
                    length = card.get("max_model_len")
                    if type(length) is int and length > 0:
                        contexts[card["id"]] = min(length, contexts.get(card["id"], length))
            if not catalogue and not self._catalogue:
                raise ServiceUnavailable("no model server is reachable")
            if catalogue:  # keep serving the last known catalogue while all upstreams are down
                self._catalogue, self._model_cards = catalogue, list(cards.values())
                self._contexts = contexts
                self._catalogue_at = time.monotonic()

    async def _fetch_models(self, upstream: Upstream) -> list[dict[str, Any]]:
        answer = await self.get(upstream.url("/models"))
        try:
            body = orjson.loads(answer[1]) if answer is not None and answer[0] == 200 else {}
        except orjson.JSONDecodeError:
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
        answer = await self.get(upstream.health_url)
        ok = answer is not None and answer[0] < 500  # no /health at all (404) is not sick
        if ok != upstream.health.probe_ok:
            log.warning("model server %s is %s rotation", upstream.base_url,
                        "back in" if ok else "out of")  # fmt: skip
        upstream.health.probed(ok)

    async def get(self, url: httpx.URL, timeout_s: float | None = None) -> tuple[int, bytes] | None:
        """``GET url`` whole within ``timeout_s`` (default the connect timeout), on the
        requests' own client: its status and body, ``None`` when there is no answer (refused,
        timed out, broken HTTP). The probes, the catalogue and the KV scraper use it. It takes
        a connection slot as a request does: with all ``MAX_CONNECTIONS`` streaming it waits,
        and one that gets none in time has no answer (a KV scrape then admits less, the safe
        way while the gateway is at its own connection limit)."""
        try:
            async with asyncio.timeout(timeout_s or self._settings.connect_timeout_s):
                return await self._exchange(b"GET", url, b"")
        except (httpx.HTTPError, WireError, OSError, TimeoutError):
            return None

    # -- requests ----------------------------------------------------------------------------

    async def open_stream(
        self, candidates: Sequence[Upstream], path: str, body: bytes, headers: Headers = (),
        sent: Callable[[], Awaitable[None]] | None = None,
    ) -> UpstreamStream:  # fmt: skip
        """POST a streaming request to ``path`` (``/chat/completions``); return once the status
        is OK and first bytes are in. ``headers``: this request's own (``traceparent``), after
        the pool's. ``sent``: awaited once, as soon as the request is on its way to the
        engine (before it on the ``httpx`` transport), so that work of the caller's runs
        while the engine works; what it raises ends the attempt (the connection is closed:
        the engine stops) and is not the engine's failure."""
        once = _once(sent) if sent is not None else None
        return await self._with_retry(
            candidates, lambda u: self._open_stream_once(u.url(path), u, body, headers, once)
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

    async def post_raw(self, upstream: Upstream, path: str, body: bytes) -> bytes | None:
        """POST ``body`` to one of an engine's own endpoints beside ``/v1`` (``/tokenize``, for
        a caller that reads the answer its own way): the answer's bytes, or ``None`` when it
        does not answer 200. Counted in the engine's requests in flight, not as its failure.
        The caller bounds the time."""
        upstream.in_flight += 1
        try:
            status, raw = await self._exchange(b"POST", upstream.root_url(path), body, whole=True)
        except (httpx.HTTPError, WireError, OSError):
            return None
        finally:
            upstream.in_flight -= 1
        return raw if status == 200 else None

    async def get_json(self, upstream: Upstream, path: str) -> Any:
        """GET one of an engine's own endpoints beside ``/v1`` (vLLM's ``/kv_event_sources``):
        its JSON, or ``None`` when it does not answer 200 with JSON in time."""
        try:
            async with asyncio.timeout(self._settings.connect_timeout_s):
                status, raw = await self._exchange(b"GET", upstream.root_url(path), b"")
        except (httpx.HTTPError, WireError, OSError, TimeoutError):
            return None
        return _json_or_none(raw) if status == 200 else None

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
        self, url: httpx.URL, upstream: Upstream, body: bytes, headers: Headers,
        sent: Callable[[], Awaitable[None]] | None,
    ) -> UpstreamStream:  # fmt: skip
        if self.wire is not None:
            return await self._open_wire_stream(url, upstream, body, headers, sent)
        if sent is not None:  # httpx sends and waits for the head in one call: before it
            await sent()
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

    async def _open_wire_stream(
        self, url: httpx.URL, upstream: Upstream, body: bytes, headers: Headers,
        sent: Callable[[], Awaitable[None]] | None,
    ) -> UpstreamStream:  # fmt: skip
        """The same on the wire client (``gateway.upstream.wire``): no library objects between
        the socket and the relay (measured in ``bench/RESULTS.md``)."""
        assert self.wire is not None
        upstream.in_flight += 1
        response: WireResponse | None = None
        try:
            async with asyncio.timeout(self._settings.first_token_timeout_s):
                response = await self.wire.post(
                    url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80),
                    url.raw_path.decode("ascii"), [*self._headers, *headers], body,
                    self._settings.connect_timeout_s, sent=sent,
                )  # fmt: skip
                if response.status >= 400:
                    raise UpstreamStatusError.from_body(
                        _json_or_none(await _whole(response)), response.status
                    )
                kind = response.header(b"content-type")
                _check_event_stream(kind.decode("latin-1") if kind is not None else None)
                first = await response.read()
        except BaseException as exc:
            upstream.in_flight -= 1
            if response is not None:
                response.release()
            if isinstance(exc, Exception):
                raise translate(exc, started=response is not None) from exc
            raise
        wire = response
        wire.watch = IdleWatch(self._settings.idle_timeout_s, lambda: wire.abort(_idle()))
        wire.watch.waiting()
        return UpstreamStream(upstream, first, wire.read, None, wire)

    async def _complete_once(
        self, url: httpx.URL, upstream: Upstream, body: bytes, headers: Headers
    ) -> tuple[Upstream, Any]:
        upstream.in_flight += 1
        try:
            async with asyncio.timeout(self._settings.first_token_timeout_s):
                status, raw = await self._exchange(b"POST", url, body, headers, whole=True)
                decoded = _json_or_none(raw)
            if status >= 400:
                raise UpstreamStatusError.from_body(decoded, status)
            if not isinstance(decoded, dict):
                raise UpstreamProtocolError("the model server sent a response that is not JSON")
            return upstream, decoded
        except Exception as exc:
            raise translate(exc, started=False) from exc
        finally:
            upstream.in_flight -= 1

    async def _exchange(
        self, method: bytes, url: httpx.URL, body: bytes, headers: Headers = (), *,
        whole: bool = False,
    ) -> tuple[int, bytes]:  # fmt: skip
        """A whole request and its whole answer: the status and the body (the caller bounds
        the time), on the wire client or on httpx."""
        if self.wire is None:
            response = await self._send(method.decode(), url, body, headers, whole=whole)
            return response.status_code, await response.aread()
        wire = await self.wire.post(
            url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80),
            url.raw_path.decode("ascii"), [*self._headers, *headers], body,
            self._settings.connect_timeout_s, method=method,
        )  # fmt: skip
        try:
            raw = await _whole(wire)
        except BaseException:
            wire.release()
            raise
        wire.release(True)
        return wire.status, raw

    async def _send(
        self, method: str, url: httpx.URL, body: bytes, headers: Headers = (), *,
        whole: bool = False,
    ) -> httpx.Response:  # fmt: skip
        """The response with its status and headers; the body is still to be read.
        ``whole``: a non-streamed answer, read under the first token's timeout."""
        request = httpx.Request(
            method,
            url,
            headers=[*self._headers, *headers] if headers else self._headers,
            content=body,
            extensions={"timeout": self._whole_timeouts if whole else self._timeouts},
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


async def _whole(response: WireResponse) -> bytes:
    """A whole response's body (an answer, a catalogue, an engine's error)."""
    parts = []
    while chunk := await response.read():
        parts.append(chunk)
    return b"".join(parts)


def _json_or_none(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
