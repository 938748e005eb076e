"""The fallback rule for a shared backend (Redis) that fails, used by the rate limits and the
KV budget alike (``RATELIMIT_FAIL``).

``open``: use this replica's in-process backend instead (limits then hold per replica), log
once per outage, try the shared one again after ``retry_s``. ``closed``: answer 503 meanwhile.
Recovery is automatic: the first call that succeeds on the shared backend ends the outage, if
it began after the last failure there was seen. A call already in flight when the backend died
may still return its answer (the reply was read before the kill); that success says nothing
about the backend now, and ending the outage on it would have the next call meet the dead
backend and open the circuit a second time.

What a call leaves behind (a KV lease, a rate-limit reservation) lives in the backend that
answered it, so giving it back (a release, a renewal, a refund) goes to that backend, whatever
the circuit's state by then: ``call`` hands its work the backend it picked (the caller notes
which one holds the result), ``call_on`` runs work on the one named. Otherwise a lease Redis
granted would be released to this process's memory while the circuit is open (and stay
reserved in Redis until it expires), and a lease granted here during an outage would be
released to Redis once it is over (and stay reserved here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, Literal, TypeVar

from gateway.errors import ServiceUnavailable

log = logging.getLogger("thinkgate")

B = TypeVar("B")

T = TypeVar("T")


def redis_errors() -> tuple[type[BaseException], ...]:
    """What a Redis that is away or hangs raises (redis-py's errors, sockets, timeouts); asked
    where a Redis client is made, so a gateway without one never imports redis-py."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, TimeoutError)


class Circuit(Generic[B]):
    def __init__(
        self,
        name: str,
        shared: B,
        local: B,
        *,
        fail: Literal["open", "closed"],
        errors: tuple[type[BaseException], ...],
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.shared = shared
        self.local = local
        self._fail = fail
        self._errors = errors
        self._retry_s = retry_s
        self._clock = clock
        self._down_since: float | None = None
        self._failures = 0  # failures seen on the shared backend, ever: a call's start notes it
        self.on_change: Callable[[bool], None] | None = None  # told True when it goes down

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    async def call(self, work: Callable[[B], Awaitable[T]]) -> T:
        backend = self._pick()
        began = self._failures
        try:
            result = await work(backend)
        except self._errors as exc:
            if backend is self.local:
                raise
            self._went_down(exc)
            if self._fail == "closed":
                raise self._refusal() from None
            return await work(self.local)
        if backend is self.shared:
            self._came_back(began)
        return result

    async def call_on(self, backend: B, work: Callable[[B], Awaitable[T]]) -> T:
        """``work`` on ``backend`` (the one that holds what it concerns), open circuit or not:
        no fallback, no refusal. On the shared backend it counts as any call does: a failure
        there starts (or prolongs) an outage and is raised as ``ServiceUnavailable`` (what it
        was to give back stays there until it expires), a success ends one."""
        if backend is not self.shared or self.shared is self.local:
            return await work(backend)
        began = self._failures
        try:
            result = await work(backend)
        except self._errors as exc:
            self._went_down(exc)
            raise self._refusal() from None
        self._came_back(began)
        return result

    def _pick(self) -> B:
        if self._down_since is not None and self._clock() - self._down_since < self._retry_s:
            if self._fail == "closed":
                raise self._refusal()
            return self.local
        return self.shared

    def _went_down(self, exc: BaseException) -> None:
        self._failures += 1
        if self._down_since is None:
            policy = "in-process, per replica" if self._fail == "open" else "refusing requests"
            log.error("%s: shared backend unreachable (%s): %s", self.name,
                      type(exc).__name__, policy)  # fmt: skip
            if self.on_change is not None:
                self.on_change(True)
        self._down_since = self._clock()

    def _came_back(self, began: int) -> None:
        """A call that began when ``began`` failures had been seen succeeded on the shared
        backend: the outage ends if none has been seen since."""
        if self._down_since is not None and began == self._failures:
            log.warning("%s: the shared backend answers again", self.name)
            self._down_since = None
            if self.on_change is not None:
                self.on_change(False)

    def _refusal(self) -> ServiceUnavailable:
        return ServiceUnavailable(f"{self.name} cannot be checked right now.")
