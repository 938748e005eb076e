"""The simulator's prefix cache, as vLLM's V1 engine keeps one (sans-I/O: no clock, no I/O).

Rules:

- A prompt's token ids (``prompt_ids``: the simulator's tokenizer, a token per four characters
  of the messages' text) are cut into full blocks of ``block_size``; each block's hash covers
  the block before it, its tokens and its extra keys (the request's ``cache_salt``, on the first
  block only), as vLLM chains them. A block is a hit only when every block before it is.
- ``lookup`` finds the longest cached prefix; vLLM always computes a prompt's last token, so a
  fully cached prompt reuses all but its last block (``cached_tokens``).
- ``acquire`` pins the prompt's blocks for a running request: hits become most recently used,
  the missing ones are stored (a ``BlockStored`` event for the run of new blocks, with their
  token ids and parent hash) and, while the cache holds more than ``capacity_blocks``, the least
  recently used unpinned blocks are evicted (``BlockRemoved``); ``release`` unpins them.
- ``clear`` drops every unpinned block (``AllBlocksCleared``, as ``/reset_prefix_cache``).
- Events are vLLM 0.32's maps (``gateway.cache.events`` reads them), returned for the caller
  to publish as one batch.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Event = dict[str, Any]
_MASK = (1 << 64) - 1


def prompt_ids(text: str) -> list[int]:
    """The simulator's token ids of a prompt: one per four characters (``count_prompt_tokens``
    counts the same), at least one; the same in every process, so that every simulated engine
    tokenizes alike (the router asks one engine's ``/tokenize`` for all). ASCII text: the four
    bytes as one number (in C); other text: a CRC of the four characters."""
    if len(text) < 4:
        return [zlib.crc32(text.encode())]
    whole = text[: len(text) - len(text) % 4]
    if whole.isascii():
        return memoryview(whole.encode("ascii")).cast("I").tolist()
    return [zlib.crc32(whole[i : i + 4].encode()) for i in range(0, len(whole), 4)]


@dataclass(frozen=True, slots=True)
class Lookup:
    hashes: tuple[int, ...]  # the prompt's full blocks
    hits: int  # how many of them, from the first, are cached
    cached_tokens: int


class PrefixCache:
    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[int, None] = OrderedDict()  # cached, least recently used first
        self._pins: dict[int, int] = {}
        self.queries = 0  # prompt tokens looked up (vllm:prefix_cache_queries)
        self.hit_tokens = 0  # of them, found cached (vllm:prefix_cache_hits)

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, ids: Sequence[int], salt: str | None) -> Lookup:
        size = self.block_size
        hashes, parent = [], None
        for i in range(len(ids) // size):
            extra = (salt,) if salt is not None and i == 0 else None
            parent = hash((parent, tuple(ids[i * size : (i + 1) * size]), extra)) & _MASK
            hashes.append(parent)
        hits = 0
        while hits < len(hashes) and hashes[hits] in self._blocks:
            hits += 1
        most = (max(len(ids) - 1, 0) // size) * size
        cached = min(hits * size, most)
        self.queries += len(ids)
        self.hit_tokens += cached
        return Lookup(tuple(hashes), hits, cached)

    def acquire(self, found: Lookup, ids: Sequence[int], salt: str | None) -> list[Event]:
        size, events = self.block_size, []
        for block in found.hashes[: found.hits]:
            if block in self._blocks:
                self._blocks.move_to_end(block)
        new = [b for b in found.hashes[found.hits :] if b not in self._blocks]
        for block in found.hashes:
            self._pins[block] = self._pins.get(block, 0) + 1
        if new:
            first = found.hashes.index(new[0])
            for block in new:
                self._blocks[block] = None
            events.append({
                "type": "BlockStored", "block_hashes": new,
                "parent_block_hash": found.hashes[first - 1] if first else None,
                "token_ids": list(ids[first * size : (first + len(new)) * size]),
                "block_size": size, "lora_id": None, "medium": "GPU", "lora_name": None,
                "extra_keys": [[salt] if salt is not None and first + i == 0 else None
                               for i in range(len(new))],
                "group_idx": 0, "kv_cache_spec_kind": "full_attention",
            })  # fmt: skip
        evicted = self._evict()
        if evicted:
            events.append({"type": "BlockRemoved", "block_hashes": evicted, "medium": "GPU"})
        return events

    def release(self, found: Lookup) -> None:
        for block in found.hashes:
            left = self._pins.get(block, 0) - 1
            if left > 0:
                self._pins[block] = left
            else:
                self._pins.pop(block, None)

    def clear(self) -> list[Event]:
        kept = OrderedDict((b, None) for b in self._blocks if b in self._pins)
        self._blocks = kept
        return [{"type": "AllBlocksCleared"}]

    def _evict(self) -> list[int]:
        evicted: list[int] = []
        if len(self._blocks) <= self.capacity_blocks:
            return evicted
        for block in list(self._blocks):
            if len(self._blocks) <= self.capacity_blocks:
                break
            if block not in self._pins:
                del self._blocks[block]
                evicted.append(block)
        return evicted
