"""The simulator's live counters and its admission queue (owned by one app, never global).

Rules:

- Every change happens under one ``asyncio.Condition`` and notifies it, so ``wait_for`` wakes
  on the change that makes its predicate true (no polling).
- Admission is FIFO: a request runs once it is first in line and its tokens fit the KV cache
  (``gateway.side.sim.kv``). A running request that cannot grow by a block is preempted (vLLM
  preempts by recompute): it frees its blocks and goes back to the *front* of the queue.
- A request ends exactly once, as ``completed``, ``cancelled`` (the client went away) or
  ``failed`` (an injected fault); ending frees whatever it holds, queued or running.
- ``finished`` counts finished sequences by finish reason, like vLLM 0.32's
  ``vllm:request_success_total``: one per choice (vLLM runs ``n`` choices as ``n`` engine
  requests) of a completed request. vLLM 0.32 does not count client aborts there, so
  ``"abort"`` stays 0: a cancelled request is counted in ``cancelled`` only, a failed one
  (an injected fault) in ``failed`` only.
- ``received`` keeps the last 64 request bodies as parsed JSON (tests read what the engine was
  sent: the messages, tools, reasoning fields).
- Counters only grow, except the gauges ``running``, ``waiting`` and ``kv_tokens_in_use``,
  which are derived from the queue and the KV blocks, so they cannot drift.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal

from gateway.side.sim.config import SimConfig
from gateway.side.sim.kv import KvBlocks
from gateway.side.sim.pieces import FinishReason
from gateway.side.sim.prefix import Lookup, PrefixCache, prompt_ids

FailMode = Literal["drop", "error", "stall"]
Outcome = Literal["completed", "cancelled", "failed"]
SuccessReason = Literal["stop", "length", "abort"]


class SimState:
    """Counters of one simulator app, and the queue in front of its KV cache."""

    def __init__(self, config: SimConfig) -> None:
        self.kv = KvBlocks(config.kv_capacity_tokens, config.block_size)
        self.requests_total = 0
        self.completed = 0
        self.cancelled = 0
        self.failed = 0
        self.finished: dict[SuccessReason, int] = {"stop": 0, "length": 0, "abort": 0}
        self.last_cancel_monotonic: float | None = None
        self.preemptions_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._error_rate = config.error_rate
        self._drop_rate = config.drop_rate
        self._rng = random.Random(config.seed)
        self._queue: deque[int] = deque()
        self._next_id = 0
        self._changed = asyncio.Condition()
        self.received: deque[dict[str, Any]] = deque(maxlen=64)
        self.prefilling = 0  # requests in their prefill (``--prefill-tokens-per-s``)
        self.prefix = (PrefixCache(self.kv.total_blocks, config.block_size)
                       if config.caching else None)  # fmt: skip
        # where the prefix cache's events go (the app's publisher, once started)
        self.publish: Callable[[list[dict[str, Any]]], None] = _nowhere

    def cache(self, prompt: str, salt: str | None) -> Lookup | None:
        """Look the prompt up in the prefix cache and pin its blocks (stored if new) for the
        request; ``None`` when the cache is not simulated."""
        if self.prefix is None:
            return None
        ids = prompt_ids(prompt)
        found = self.prefix.lookup(ids, salt)
        self.publish(self.prefix.acquire(found, ids, salt))
        return found

    def uncache(self, found: Lookup | None) -> None:
        if self.prefix is not None and found is not None:
            self.prefix.release(found)

    @property
    def running(self) -> int:
        return self.kv.running

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def kv_tokens_in_use(self) -> int:
        return self.kv.used_tokens

    async def wait_for(
        self,
        predicate: Callable[[SimState], bool],
        timeout: float,  # noqa: ASYNC109 - the test-facing API the brief fixes
    ) -> None:
        """Return once ``predicate(self)`` holds; raise ``TimeoutError`` after ``timeout`` s."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    def roll_fault(self) -> FailMode | None:
        """Draw the configured error/drop rates for one request (seeded, reproducible)."""
        if not (self._error_rate or self._drop_rate):
            return None
        roll = self._rng.random()
        if roll < self._error_rate:
            return "error"
        return "drop" if roll < self._error_rate + self._drop_rate else None

    async def open_request(self, prompt_tokens: int) -> int:
        """Count a new request and return its id; it holds nothing yet."""
        async with self._changed:
            self._next_id += 1
            self.requests_total += 1
            self.prompt_tokens_total += prompt_tokens
            self._changed.notify_all()
            return self._next_id

    async def admit(self, request_id: int, tokens: int) -> None:
        """Queue the request at the back; return once it holds the blocks for ``tokens``."""
        async with self._changed:
            await self._wait_admitted(request_id, tokens, front=False)

    async def advance(self, request_id: int, tokens: int, generated: int) -> None:
        """Count ``generated`` new tokens; grow to ``tokens``, preempting if blocks are short."""
        async with self._changed:
            self.generation_tokens_total += generated
            self._changed.notify_all()
            if self.kv.grow(request_id, tokens):
                return
            self.kv.release(request_id)
            self.preemptions_total += 1
            await self._wait_admitted(request_id, tokens, front=True)

    async def close_request(
        self, request_id: int, outcome: Outcome, finish_reasons: Iterable[FinishReason] = ()
    ) -> None:
        """End the request: free its blocks and count how it (and, if completed, each of its
        choices) ended."""
        async with self._changed:
            self.kv.release(request_id)
            if outcome == "completed":
                self.completed += 1
                for reason in finish_reasons:  # a tool call's end is "stop" to vLLM's engine
                    self.finished["stop" if reason == "tool_calls" else reason] += 1
            elif outcome == "failed":
                self.failed += 1
            else:
                self.cancelled += 1
                self.last_cancel_monotonic = time.monotonic()
            self._changed.notify_all()

    async def count_failure(self) -> None:
        """Count a request refused by an injected error before it ran."""
        async with self._changed:
            self.requests_total += 1
            self.failed += 1
            self._changed.notify_all()

    async def _wait_admitted(self, request_id: int, tokens: int, *, front: bool) -> None:
        """With the lock held: wait in line until first and fitting, then reserve."""
        if front:
            self._queue.appendleft(request_id)
        else:
            self._queue.append(request_id)
        self._changed.notify_all()
        try:
            await self._changed.wait_for(lambda: self._admissible(request_id, tokens))
            self.kv.reserve(request_id, tokens)
        finally:
            self._queue.remove(request_id)
            self._changed.notify_all()

    def _admissible(self, request_id: int, tokens: int) -> bool:
        return self._queue[0] == request_id and self.kv.fits(tokens)


def _nowhere(events: list[dict[str, Any]]) -> None:
    """No publisher: the events are dropped, as vLLM's null publisher does."""
