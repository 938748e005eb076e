"""vLLM's KV event batches as its publisher encodes them (``vllm.distributed.kv_events``:
msgspec tagged structs, a map with ``type`` since 0.32, a tagged array before), for tests that
drive the decoder and the index without an engine; the real engine's are read in
``tests/integration_vllm/test_vllm_routing.py``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import msgpack

_hashes = itertools.count(10**18)


class FakeEngine:
    """An engine's cache of prompts as vLLM would report it: ``store`` returns the
    ``BlockStored`` for the full blocks not already held, with fresh engine hashes."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.blocks: dict[tuple[Any, ...], int] = {}  # (salt, tokens so far) -> engine hash

    def store(self, tokens: Sequence[int], salt: str | None = None) -> dict[str, Any] | None:
        size = self.block_size
        parent, new_hashes, new_tokens, extras = None, [], [], []
        for i in range(len(tokens) // size):
            prefix = (salt, tuple(tokens[: (i + 1) * size]))
            known = self.blocks.get(prefix)
            if known is None:
                known = self.blocks[prefix] = next(_hashes)
                new_hashes.append(known)
                new_tokens.extend(tokens[i * size : (i + 1) * size])
                extras.append([salt] if salt is not None and i == 0 else None)
            elif not new_hashes:
                parent = known
        if not new_hashes:
            return None
        return stored(new_hashes, parent, new_tokens, size, extras)


def stored(hashes: Sequence[int], parent: int | None, tokens: Sequence[int], size: int,
           extras: Sequence[Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(tokens), "block_size": size, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": list(extras) if extras else [None] * len(hashes),
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}  # fmt: skip


def removed(hashes: Sequence[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def batch(*events: dict[str, Any] | None, ts: float = 1.0) -> bytes:
    return msgpack.packb([ts, [e for e in events if e is not None], 0])
