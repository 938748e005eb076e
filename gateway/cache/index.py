"""Which engine holds which block: the index built from the engines' KV events (sans-I/O).

Per engine: its block hashes mapped to the index's keys (``gateway.cache.blocks``), for
removals, and how many of its blocks hold each key. A ``BlockStored`` whose parent block the
index never saw (events lost before the replay caught up, or a subscription that began after
the prompt's first blocks were stored) is counted as an ``orphan`` and not indexed: its keys
cannot be known. ``matched`` finds how many of a prompt's leading blocks an engine holds by
binary search, since an engine's cached blocks form prefixes (vLLM evicts a request's blocks
tail first, and a block is a hit only when every block before it is).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.cache.blocks import ROOT, Keys, stored_keys
from gateway.cache.events import AllCleared, BlockHash, BlocksRemoved, BlocksStored, Event


@dataclass(slots=True)
class EngineBlocks:
    keys: dict[BlockHash, int] = field(default_factory=dict)  # the engine's hash -> our key
    held: Counter[int] = field(default_factory=Counter)  # our key -> blocks holding it
    block_size: int | None = None
    orphans: int = 0

    def store(self, event: BlocksStored) -> None:
        self.block_size = event.block_size
        if event.parent is None:
            parent = ROOT
        else:
            known = self.keys.get(event.parent)
            if known is None:
                self.orphans += len(event.hashes)
                return
            parent = known
        keys = stored_keys(parent, event.tokens, event.block_size, event.extras)
        for block_hash, key in zip(event.hashes, keys, strict=True):
            if self.keys.get(block_hash) != key:
                self._forget(block_hash)
                self.keys[block_hash] = key
                self.held[key] += 1

    def remove(self, hashes: Iterable[BlockHash]) -> None:
        for block_hash in hashes:
            self._forget(block_hash)

    def _forget(self, block_hash: BlockHash) -> None:
        key = self.keys.pop(block_hash, None)
        if key is not None:
            left = self.held[key] - 1
            if left:
                self.held[key] = left
            else:
                del self.held[key]

    def matched(self, keys: Keys) -> int:
        """How many of ``keys``' leading blocks this engine holds."""
        held = self.held
        if not len(keys) or int(keys[0]) not in held:
            return 0
        low, high = 1, len(keys)  # keys[low - 1] is held
        while low < high:
            mid = (low + high + 1) // 2
            if int(keys[mid - 1]) in held:
                low = mid
            else:
                high = mid - 1
        return low


class PrefixIndex:
    """Every engine's blocks, by engine name (its base URL)."""

    def __init__(self) -> None:
        self.engines: dict[str, EngineBlocks] = {}

    def apply(self, engine: str, events: Iterable[Event]) -> None:
        blocks = self.engines.get(engine)
        if blocks is None:
            blocks = self.engines[engine] = EngineBlocks()
        for event in events:
            if isinstance(event, BlocksStored):
                blocks.store(event)
            elif isinstance(event, BlocksRemoved):
                blocks.remove(event.hashes)
            elif isinstance(event, AllCleared):
                self.engines[engine] = blocks = EngineBlocks(block_size=blocks.block_size)

    def drop(self, engine: str) -> None:
        """Forget an engine's blocks (it restarted, or its events can no longer be trusted)."""
        self.engines.pop(engine, None)

    def block_size(self, engine: str) -> int | None:
        blocks = self.engines.get(engine)
        return None if blocks is None else blocks.block_size

    def matched(self, engine: str, keys: Keys) -> int:
        blocks = self.engines.get(engine)
        return 0 if blocks is None else blocks.matched(keys)

    def size(self, engine: str) -> int:
        blocks = self.engines.get(engine)
        return 0 if blocks is None else len(blocks.keys)
