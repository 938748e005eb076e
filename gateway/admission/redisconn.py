"""The one Redis client of a gateway process, shared by the rate limits and the KV budget and
auto-pipelined (``ratelimit.autopipe``), so the two scripts a request needs at admission go out
in one round trip, and so do the two at settlement."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.settings import AdmissionSettings

if TYPE_CHECKING:
    from ratelimit.autopipe import AutoPipeline


def open_redis(settings: AdmissionSettings) -> AutoPipeline | None:
    """``None`` without ``REDIS_URL``. The pool waits (briefly) for a free connection rather
    than failing past 256: a burst of admissions must not look like a Redis outage. Short
    timeouts (the connect's, and the auto-pipeline's per exchange): a Redis that hangs must cost
    a request milliseconds, not seconds, before the ``RATELIMIT_FAIL`` policy takes over."""
    if not settings.redis_url:
        return None
    import redis.asyncio as redis  # only here: a gateway without Redis never imports redis-py
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from ratelimit.autopipe import AutoPipeline

    # One immediate retry (a pooled connection that died with a Redis restart reconnects),
    # not redis-py's default of ten with exponential backoff, which turns an outage into
    # requests that hang for seconds before the fallback policy can act.
    # No socket timeout: the auto-pipeline's own (half a second) bounds each exchange, its
    # write and its replies together. redis-py would wrap every write in ``asyncio.wait_for``,
    # on Python 3.11 a task and two more turns of the event loop per round trip: on a busy
    # replica most of a request's admission time (``bench/RESULTS.md``).
    pool = redis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=256, timeout=0.5, socket_connect_timeout=0.5,
        socket_timeout=None, retry=Retry(NoBackoff(), 1),
    )  # fmt: skip
    return AutoPipeline(redis.Redis.from_pool(pool))  # closing the client closes the pool
