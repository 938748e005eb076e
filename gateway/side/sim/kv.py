"""Paged KV-cache accounting of the simulator (sans-I/O: no clock, no lock, no waiting).

Rules (a simplified vLLM block manager):

- The cache holds ``capacity_tokens // block_size`` blocks. A running request with ``t`` tokens
  (prompt plus tokens generated so far) holds ``ceil(t / block_size)`` blocks.
- ``fits(t)``: a request of ``t`` tokens may start (or grow to ``t``) if enough blocks are free,
  or if no other request holds any: a request larger than the whole cache then runs alone
  rather than waiting forever (vLLM refuses such configurations at start-up; the simulator
  stays live instead). Usage is reported clamped to 1.0.
- Holding and waiting are the caller's business: this object only counts. ``reserve`` and
  ``grow`` refuse (raise / return False) what does not fit, so over-commit cannot go unnoticed.
"""

from __future__ import annotations


class KvBlocks:
    """Blocks held per request id."""

    __slots__ = ("_held", "_used", "block_size", "total_blocks")

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        self.block_size = block_size
        self.total_blocks = capacity_tokens // block_size
        self._held: dict[int, int] = {}
        self._used = 0

    @property
    def running(self) -> int:
        """Requests holding blocks."""
        return len(self._held)

    @property
    def used_blocks(self) -> int:
        return self._used

    @property
    def used_tokens(self) -> int:
        """Tokens reserved: whole blocks, so a multiple of ``block_size``."""
        return self._used * self.block_size

    @property
    def usage(self) -> float:
        """Fraction of the cache in use, 0.0 to 1.0 (``vllm:kv_cache_usage_perc``)."""
        return min(1.0, self._used / self.total_blocks)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def holds(self, request_id: int) -> bool:
        return request_id in self._held

    def fits(self, tokens: int, request_id: int | None = None) -> bool:
        """Whether ``request_id`` (or a new request) could hold ``tokens`` tokens now."""
        own = self._held.get(request_id, 0) if request_id is not None else 0
        alone = self._used == own
        return alone or self.blocks_for(tokens) - own <= self.total_blocks - self._used

    def reserve(self, request_id: int, tokens: int) -> None:
        """Start holding blocks for a request that holds none; it must fit."""
        if request_id in self._held or not self.fits(tokens):
            raise ValueError(f"request {request_id} cannot reserve {tokens} tokens")
        self._set(request_id, self.blocks_for(tokens))

    def grow(self, request_id: int, tokens: int) -> bool:
        """Hold enough blocks for ``tokens``; False (and no change) if they are not free."""
        if not self.fits(tokens, request_id):
            return False
        self._set(request_id, max(self._held[request_id], self.blocks_for(tokens)))
        return True

    def release(self, request_id: int) -> bool:
        """Free a request's blocks; False if it held none."""
        blocks = self._held.pop(request_id, None)
        if blocks is None:
            return False
        self._used -= blocks
        return True

    def _set(self, request_id: int, blocks: int) -> None:
        self._used += blocks - self._held.get(request_id, 0)
        self._held[request_id] = blocks
