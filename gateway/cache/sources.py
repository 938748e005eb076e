"""Where each engine publishes its KV events (sans-I/O; ``gateway.upstream.kvevents`` subscribes).

``UPSTREAM_KV_EVENTS`` when it names endpoints, else the engine's own answer to
``GET /kv_event_sources`` (vLLM 0.32: its publisher's configuration per data parallel rank, the
endpoint as the engine bound it). A ``*`` (or ``0.0.0.0``) host in a bound endpoint is the
engine's host as ``UPSTREAMS`` names it; a named host is subscribed to as named. Apart from the
subscriber so that finding no events imports neither pyzmq nor numpy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("thinkgate")


@dataclass(frozen=True, slots=True)
class Source:
    engine: str  # the upstream's base URL: the index's name for it
    endpoint: str
    replay: str | None = None
    topic: bytes = b""


def _bound_at(endpoint: str, host: str) -> str | None:
    """A bound endpoint as a subscriber reaches it; ``None`` for one not over TCP."""
    if not endpoint.startswith("tcp://"):
        return None
    where, _, port = endpoint[6:].rpartition(":")
    if where in ("*", "0.0.0.0", "[::]", "::"):
        return f"tcp://{host}:{port}"
    return endpoint


def discovered(engine: str, answer: Any) -> list[Source]:
    """The sources in an engine's ``/kv_event_sources`` answer (one per data parallel rank)."""
    if not isinstance(answer, dict):
        return []
    host = urlsplit(engine).hostname or "127.0.0.1"
    found = []
    for config in answer.values():
        if not isinstance(config, dict) or config.get("publisher") != "zmq":
            continue
        endpoint = _bound_at(str(config.get("endpoint") or ""), host)
        if endpoint is None:
            where = config.get("endpoint")
            log.warning("the KV events of %s are published at %s, not over TCP: not "
                        "subscribed", engine, where)  # fmt: skip
            continue
        replay = config.get("replay_endpoint")
        found.append(Source(engine, endpoint, _bound_at(replay, host) if replay else None,
                            str(config.get("topic") or "").encode()))  # fmt: skip
    return found


def configured(engine: str, item: str) -> list[Source] | None:
    """An ``UPSTREAM_KV_EVENTS`` item: sources, ``[]`` for ``off``, ``None`` to discover."""
    if item in ("", "auto"):
        return None
    if item == "off":
        return []
    endpoint, _, replay = item.partition(";")
    return [Source(engine, endpoint, replay or None)]
