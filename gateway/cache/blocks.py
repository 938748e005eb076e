"""A prompt's blocks as an engine will cache them, keyed the index's way (sans-I/O).

vLLM caches a prompt in blocks of ``block_size`` tokens (16 on GPUs by default, 128 on the
CPU); only full blocks, and each block's hash covers every block before it, so a block is a hit
only when the whole prefix up to it is. The index keys a block by a hash of its own (choice
and why in ``docs/routing.md``): ``key = hash((parent key, body))`` where ``body`` hashes the
block's token ids (and its extra keys, when it has any: the ``cache_salt`` on a prompt's first
block). Every ``BlockStored`` event carries its blocks' token ids, so the index computes the
same keys from an engine's events as ``prompt_keys`` does from a prompt, whatever hash
algorithm the engine was started with (``--prefix-caching-hash-algo``).

Python's ``hash`` of a tuple of ints is fast (a 30k-token prompt in 16-token blocks: about
1,900 blocks in a few hundred µs, all in C: ``zip``, ``map``, ``accumulate``) and the same in
every process; of a string it is salted per process, so keys are this process's own (each
replica builds its index from the events itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any

ROOT = hash(("thinkgate", "prefix-blocks", 1))  # the parent of a prompt's first block


def chain(parent: int, body: int) -> int:
    return hash((parent, body))


def body_of(tokens: tuple[int, ...], extra: tuple[Any, ...] | None) -> int:
    return hash(tokens) if extra is None else hash((hash(tokens), extra))


def prompt_keys(tokens: Sequence[int], block_size: int,
                first_extra: tuple[Any, ...] | None = None) -> list[int]:  # fmt: skip
    """The keys of the prompt's full blocks, in order. ``first_extra``: the first block's extra
    keys (``(cache_salt,)``), as vLLM adds them."""
    count = len(tokens) // block_size
    if not count:
        return []
    whole = tokens[: count * block_size]
    bodies = list(map(hash, zip(*[iter(whole)] * block_size, strict=True)))
    if first_extra is not None:
        bodies[0] = hash((bodies[0], first_extra))
    keys = list(accumulate(bodies, chain, initial=ROOT))
    del keys[0]
    return keys


def reusable(matched_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """The tokens an engine holding ``matched_blocks`` of the prompt's blocks will not compute
    again: vLLM always computes a prompt's last token, so a fully cached prompt reuses all
    but its last block."""
    most = (max(prompt_tokens - 1, 0) // block_size) * block_size
    return min(matched_blocks * block_size, most)
