"""The simulator's ASGI app: a stand-in for ``vllm serve`` in tests and benchmarks.

Raw ASGI on purpose: it is the baseline the gateway is measured against, so a request goes
straight from a two-key route lookup to its handler, without middleware wrapping every
``send``. Everything the app owns (config, counters, queue, fault RNG) hangs off the instance
(``app.state.sim``): two apps in one process share nothing, and importing this module does
nothing.

Routes (vLLM's OpenAI-compatible server): ``POST /v1/chat/completions``, ``POST
/v1/completions`` and ``POST /v1/embeddings`` (``sim.completions``), ``GET /v1/models``,
``GET /health`` (200, empty body), ``GET /metrics`` (Prometheus text); ``GET
/kv_event_sources`` (where its KV events are published, ``{}`` without); and, while the prefix
cache is simulated (``SimConfig.caching``), ``POST /tokenize`` (the simulator's token ids of a
chat or completions body; without, 404: the gateway then estimates, as in front of an engine
without it) and ``POST /reset_prefix_cache`` (``AllBlocksCleared``; vLLM serves it with
``VLLM_SERVER_DEV_MODE=1``).
Anything else is 404 ``{"detail": "Not Found"}`` (FastAPI's shape), a known path with another
method 405. The KV event publisher (``gateway.side.sim.events``) starts with the app's lifespan.
"""

from __future__ import annotations

import time

import orjson
from starlette.datastructures import State
from starlette.types import Receive, Scope, Send

from gateway.side.sim.asgi import read_body, send_whole
from gateway.side.sim.chat import SimulatedDrop, serve_chat
from gateway.side.sim.completions import AsCompletions, completions_request, embeddings_body
from gateway.side.sim.config import SimConfig
from gateway.side.sim.errors import SimRequestError
from gateway.side.sim.events import EventPublisher
from gateway.side.sim.guard import as_guard
from gateway.side.sim.metrics import CONTENT_TYPE, render_metrics
from gateway.side.sim.prefix import prompt_ids
from gateway.side.sim.request import parse_chat_request, prompt_text_of
from gateway.side.sim.state import SimState
from gateway.side.sim.wire import models_body

__all__ = ["SimApp", "SimConfig", "SimState", "SimulatedDrop", "create_sim_app"]

_CHAT = "/v1/chat/completions"
_COMPLETIONS, _EMBEDDINGS = "/v1/completions", "/v1/embeddings"
_TOKENIZE, _RESET = "/tokenize", "/reset_prefix_cache"
_POSTS = frozenset({_CHAT, _COMPLETIONS, _EMBEDDINGS, _TOKENIZE, _RESET})
_PATHS = frozenset({*_POSTS, "/v1/models", "/health", "/metrics", "/kv_event_sources"})


class SimApp:
    """A simulated vLLM server; ``app.state.sim`` (also ``app.sim``) holds its live state."""

    __slots__ = ("_created", "config", "publisher", "state")

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.state = State()
        self.state.sim = SimState(config)
        self._created = int(time.time())
        self.publisher: EventPublisher | None = None  # KV events, once the lifespan started

    @property
    def sim(self) -> SimState:
        sim: SimState = self.state.sim
        return sim

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._route(scope["method"], scope["path"], receive, send)

    async def _route(self, method: str, path: str, receive: Receive, send: Send) -> None:
        if method == "POST" and path == _CHAT:
            await self._chat(receive, send)
        elif method == "POST" and path == _COMPLETIONS:
            await self._completions(receive, send)
        elif method == "POST" and path == _EMBEDDINGS:
            body = await read_body(receive)
            if body is not None:
                self.sim.received.append(orjson.loads(body) if body.strip() else {})
                await send_whole(send, *embeddings_body(body, list(self.config.models)))
        elif method == "POST" and path in (_TOKENIZE, _RESET) and self.config.caching:
            await self._cache_route(path, receive, send)
        elif method in ("GET", "HEAD") and path in _PATHS - _POSTS:
            await self._get(path, send)
        else:
            status = 405 if path in _PATHS else 404
            detail = "Method Not Allowed" if status == 405 else "Not Found"
            await send_whole(send, status, orjson.dumps({"detail": detail}))

    async def _chat(self, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if body is None:
            return
        try:
            request = parse_chat_request(body, self.config)
        except SimRequestError as error:
            await send_whole(send, error.status, error.body())
            return
        self.sim.received.append(request.body)
        lexicon = self.config.guards.get(request.model)
        if lexicon is not None:
            request = as_guard(request, lexicon)
        await serve_chat(self.config, self.sim, request, receive, send)

    async def _completions(self, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if body is None:
            return
        try:
            request, data = completions_request(body, self.config)
        except SimRequestError as error:
            await send_whole(send, error.status, error.body())
            return
        self.sim.received.append(data)
        await serve_chat(self.config, self.sim, request, receive, AsCompletions(send))

    async def _get(self, path: str, send: Send) -> None:
        if path == "/health":
            await send_whole(send, 200, b"", b"text/plain; charset=utf-8")
        elif path == "/metrics":
            await send_whole(send, 200, render_metrics(self.config, self.sim), CONTENT_TYPE)
        elif path == "/kv_event_sources":
            sources = self.publisher.sources() if self.publisher is not None else {}
            await send_whole(send, 200, orjson.dumps(sources))
        else:
            config = self.config
            await send_whole(
                send, 200, models_body(list(config.models), self._created, config.max_model_len)
            )

    async def _cache_route(self, path: str, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if body is None:
            return
        if path == _RESET:
            prefix = self.sim.prefix
            if prefix is not None:
                self.sim.publish(prefix.clear())
            await send_whole(send, 200, b"", b"text/plain; charset=utf-8")
            return
        try:
            ids = prompt_ids(prompt_text_of(orjson.loads(body)))
        except (orjson.JSONDecodeError, SimRequestError) as exc:
            error = exc if isinstance(exc, SimRequestError) else SimRequestError(
                400, "BadRequestError", "invalid JSON body")  # fmt: skip
            await send_whole(send, error.status, error.body())
            return
        answer = {"count": len(ids), "max_model_len": self.config.max_model_len,
                  "tokens": ids, "token_strs": None}  # fmt: skip
        await send_whole(send, 200, orjson.dumps(answer))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Start the KV event publisher (when configured) and stop it."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                config = self.config
                if config.kv_events is not None and self.publisher is None:
                    self.publisher = EventPublisher(config.kv_events, config.kv_events_replay)
                    self.sim.publish = self.publisher.publish
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.publisher is not None:
                    await self.publisher.aclose()
                    self.publisher = None
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_sim_app(config: SimConfig | None = None) -> SimApp:
    """A fresh simulator; every call owns new state."""
    return SimApp(config if config is not None else SimConfig())
