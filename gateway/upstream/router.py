"""Which engine first: the prompt's cached prefix, a session's engine, or the least loaded.

``ROUTING=prefix`` (the default):

1. **Prefix.** When any candidate engine has blocks in the index (``gateway.cache``, fed by
   ``gateway.upstream.kvevents``), the prompt's token ids are asked of an engine's own
   ``/tokenize`` (the same chat template, tokenizer and special tokens the engine will use:
   exact by construction, measured in ``bench/RESULTS.md``), cut into the engines' block size
   with the request's ``cache_salt`` on the first block, and each engine's cached prefix found.
   ``gateway.cache.score.rank`` orders the engines: the most cached tokens first among those
   within a bounded share of the load.
2. **Session.** No engine holds any of the prompt, or no events at all: a session's key
   (``x-session-id``, OpenAI's ``prompt_cache_key``, Anthropic's ``metadata.user_id``,
   ``user``) ranks the engines by rendezvous hashing, with the same bound: a session returns
   to its engine, whose cache then holds its context, on every replica alike.
3. **Load.** Otherwise the fewest requests in flight, as ``ROUTING=least_loaded`` always does.

The choice is a preference: KV admission (``gateway.admission.budget``) tries the preferred
engine first while it has room and the rest by free budget; nothing is refused here. Every
gateway replica subscribes to every engine's events, so replicas decide alike without sharing
state. An engine's part of the index is dropped when it leaves rotation, restarts (its event
count goes back), or was sent requests but published nothing for ``KV_EVENTS_SILENCE_S``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.cache import one_blas_thread
from gateway.cache.salt import cache_salt
from gateway.cache.score import rank, rendezvous
from gateway.cache.sources import Source, configured, discovered
from gateway.sections import RoutingSettings
from gateway.upstream.engine import Upstream
from gateway.upstream.pool import UpstreamPool

if TYPE_CHECKING:  # imported when an engine publishes events: pyzmq and numpy, ~20 MB of RSS
    import numpy as np
    import numpy.typing as npt
    import zmq.asyncio

    from gateway.cache.blocks import Keys
    from gateway.cache.index import PrefixIndex
    from gateway.upstream.kvevents import EventFeed

log = logging.getLogger("thinkgate")

TOKENIZE_S = 2.0  # the longest wait for an engine's /tokenize: then routed without it
DISCOVER_S = 5.0  # how often an engine that did not answer is asked again for its sources
QUIET_S = 60.0  # and one that answered without any (no events configured there)
WATCH_S = 1.0


@dataclass(frozen=True, slots=True)
class Routed:
    candidates: list[Upstream]
    preferred: int  # how many of the first candidates are the router's choice (0 or 1)
    reason: str  # "prefix", "session" or "load"
    expected_cached: int = 0  # the tokens the first engine should find cached

    def header(self) -> str:
        """``x-thinkgate-route``: why the first engine, and the cached tokens it should find
        (the client's own prompt: nothing of another tenant's, nor which engine)."""
        if self.reason == "prefix":
            return f"prefix; cached={self.expected_cached}"
        return self.reason


class Router:
    def __init__(self, settings: RoutingSettings, pool: UpstreamPool) -> None:
        self.mode = settings.routing or "prefix"
        self.index: PrefixIndex | None = None  # made when the first engine's events are found
        self.pool = pool
        self.feeds: dict[str, list[EventFeed]] = {}
        self._settings = settings
        self._secret = settings.prefix_cache_secret.get_secret_value().encode()
        self._sent: dict[str, float] = {}  # when a request was last routed to an engine
        self._salts: dict[str, str | None] = {}  # tenants' own cache salts
        self._tasks: list[asyncio.Task[None]] = []
        self._context: zmq.asyncio.Context | None = None

    # -- the cache salt ----------------------------------------------------------------------

    def salt(self, tenant: str, client: str | None) -> str | None:
        """The request's ``cache_salt`` (``gateway.cache.salt``); a tenant's own, without a
        client's, made once."""
        if client is not None:
            return cache_salt(self._settings.prefix_cache_sharing, self._secret, tenant, client)
        found = self._salts.get(tenant)
        if found is None and tenant not in self._salts:
            found = self._salts[tenant] = cache_salt(
                self._settings.prefix_cache_sharing, self._secret, tenant, None
            )
        return found

    # -- choosing ------------------------------------------------------------------------------

    async def order(self, candidates: list[Upstream], body: bytes, path: str,
                    session: str | None) -> Routed:  # fmt: skip
        """``candidates`` (the pool's, least loaded first) in the router's order; ``body``:
        the upstream request as it will be sent (its ``cache_salt`` in place)."""
        if self.mode == "least_loaded" or len(candidates) < 2:
            return Routed(candidates, 0, "load")
        routed = None
        names = [u.base_url for u in candidates]
        weights = rendezvous(session, names) if session else None
        if self.index is not None and any(self.index.size(name) for name in names):
            routed = await self._by_prefix(self.index, candidates, body, path, weights)
        if routed is None and weights is not None:
            order = rank([u.in_flight for u in candidates], weights)
            routed = Routed([candidates[i] for i in order], 1, "session")
        routed = routed or Routed(candidates, 0, "load")
        self._sent[routed.candidates[0].base_url] = time.monotonic()
        return routed

    async def _by_prefix(self, index: PrefixIndex, candidates: list[Upstream], body: bytes,
                         path: str, ties: list[float] | None) -> Routed | None:  # fmt: skip
        from gateway.cache.blocks import prompt_keys, reusable  # loaded with the index

        request = orjson.loads(body)
        tokens = await self._tokens(candidates, request, path)
        if tokens is None or not len(tokens):
            return None
        salt = request.get("cache_salt")
        first_extra = (salt,) if isinstance(salt, str) and salt else None
        keys: dict[int, Keys] = {}
        cached = []
        for upstream in candidates:
            size = index.block_size(upstream.base_url)
            if size is None:
                cached.append(0)
                continue
            if size not in keys:
                keys[size] = prompt_keys(tokens, size, first_extra)
            matched = index.matched(upstream.base_url, keys[size])
            cached.append(reusable(matched, len(tokens), size))
        if not any(cached):
            return None
        order = rank([u.in_flight for u in candidates], [float(c) for c in cached], ties=ties)
        return Routed([candidates[i] for i in order], 1, "prefix", cached[order[0]])

    async def _tokens(self, candidates: Sequence[Upstream], request: Mapping[str, Any],
                      path: str) -> Sequence[int] | npt.NDArray[np.int64] | None:  # fmt: skip
        ask = tokenize_body(request, path)
        if ask is None:
            return None
        if "tokens" in ask:  # a completions prompt given as token ids
            return ask["tokens"]  # type: ignore[no-any-return]
        from gateway.cache.blocks import token_ids  # loaded with the index

        engine = candidates[0]
        try:
            async with asyncio.timeout(TOKENIZE_S):
                answer = await self.pool.post_raw(engine, "/tokenize", orjson.dumps(ask))
        except TimeoutError:  # a slow engine costs the request its prefix, never its answer
            log.warning("%s did not tokenize within %.0f s: routed without the prefix",
                        engine.base_url, TOKENIZE_S)  # fmt: skip
            return None
        return None if answer is None else token_ids(answer)

    # -- the engines' events -----------------------------------------------------------------

    def start(self) -> None:
        """Subscribe to the engines' events and watch them (``aclose`` stops it all)."""
        if self.mode == "least_loaded":
            return
        self._tasks.append(asyncio.create_task(self._watch_forever()))

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    async def _watch_forever(self) -> None:
        items = self._settings.upstream_kv_events or ("auto",) * len(self.pool.upstreams)
        due: dict[str, float] = {}
        while True:
            now = time.monotonic()
            for upstream, item in zip(self.pool.upstreams, items, strict=True):
                name = upstream.base_url
                if name not in self.feeds and now >= due.get(name, now):
                    answered = await self._find_sources(upstream, item)
                    due[name] = now + (QUIET_S if answered else DISCOVER_S)
                self._check(upstream, now)
            await asyncio.sleep(WATCH_S)

    async def _find_sources(self, upstream: Upstream, item: str) -> bool:
        """Subscribe to the engine's events if it has any; whether it answered."""
        name = upstream.base_url
        sources = configured(name, item)
        answered = sources is not None
        if sources is None:
            answer = await self.pool.get_json(upstream, "/kv_event_sources")
            answered, sources = answer is not None, discovered(name, answer)
        if sources:
            self._subscribe(name, sources)
        return answered

    def _subscribe(self, engine: str, sources: list[Source]) -> None:
        # pyzmq and numpy (the index's hashing) only once some engine publishes events
        one_blas_thread()
        import zmq.asyncio

        from gateway.cache.index import PrefixIndex
        from gateway.upstream.kvevents import EventFeed

        if self._context is None:  # made once some engine publishes: its I/O thread with it
            self._context = zmq.asyncio.Context()
        if self.index is None:
            self.index = PrefixIndex()
        feeds = self.feeds[engine] = [EventFeed(s, self.index, self._context) for s in sources]
        for feed in feeds:
            self._tasks.append(asyncio.create_task(feed.run()))
        log.info("subscribed to the KV events of %s at %s", engine,
                 ", ".join(s.endpoint for s in sources))  # fmt: skip

    def _check(self, upstream: Upstream, now: float) -> None:
        """Drop an engine's index when it is out of rotation or its events went silent while
        it was sent requests."""
        name = upstream.base_url
        if self.index is None or not self.index.size(name):
            return
        if not upstream.health.serving:  # it may come back restarted: count again from 0
            for feed in self.feeds.get(name) or ():
                feed.forget()
            return
        feeds = self.feeds.get(name) or []
        heard = max((f.last_event_at for f in feeds), default=now)
        silence = self._settings.kv_events_silence_s
        if self._sent.get(name, 0.0) > heard + silence and now - heard > silence:
            log.warning("no KV events from %s for %.0f s while it was sent requests: its "
                        "index is dropped until they come again", name, now - heard)  # fmt: skip
            self.index.drop(name)


def tokenize_body(request: Mapping[str, Any], path: str) -> dict[str, Any] | None:
    """What vLLM's ``/tokenize`` needs to give the prompt's token ids as the engine will see
    them; ``{"tokens": [...]}`` when the request already holds them; ``None`` when it cannot
    be said (an embeddings request, a batch of prompts)."""
    if path == "/chat/completions":
        ask: dict[str, Any] = {"model": request.get("model"), "messages": request.get("messages")}
        for name in ("tools", "chat_template", "chat_template_kwargs", "add_special_tokens",
                     "continue_final_message"):  # fmt: skip
            if name in request:
                ask[name] = request[name]
        ask["add_generation_prompt"] = request.get(
            "add_generation_prompt", not request.get("continue_final_message", False)
        )
        return ask
    if path == "/completions":
        prompt = request.get("prompt")
        if isinstance(prompt, str):
            return {"model": request.get("model"), "prompt": prompt}
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return {"tokens": prompt}
    return None


def session_of(header: str | None, params: Mapping[str, Any]) -> str | None:
    """A request's session key, for affinity without events: ``x-session-id``, OpenAI's
    ``prompt_cache_key``, Anthropic's ``metadata.user_id``, or ``user``."""
    if header:
        return header
    for found in (params.get("prompt_cache_key"), _user_id(params.get("metadata")),
                  params.get("user")):  # fmt: skip
        if isinstance(found, str) and found:
            return found
    return None


def _user_id(metadata: Any) -> Any:
    return metadata.get("user_id") if isinstance(metadata, dict) else None
