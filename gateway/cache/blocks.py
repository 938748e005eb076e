"""A prompt's blocks as an engine will cache them, keyed the index's way (sans-I/O).

vLLM caches a prompt in blocks of ``block_size`` tokens (16 on GPUs by default, 128 on the
CPU); only full blocks, and each block's hash covers every block before it, so a block is a hit
only when the whole prefix up to it is. The index keys a block by a hash of its own (choice
and why in ``docs/routing.md``), a 64-bit chain over the blocks:

    body(b)  = mix(Σ tokenᵢ · Mᵢ  ⊕  hash(extra keys))        (mod 2⁶⁴; extra keys: the
    key(b)   = key(b − 1) · Q + body(b)                          ``cache_salt`` on a first block)

with ``Mᵢ`` random-looking per-position weights, ``mix`` SplitMix64's finaliser and ``key(−1)`` the
``ROOT``. Every ``BlockStored`` event carries its blocks' token ids, so the index computes the
same keys from an engine's events as ``prompt_keys`` does from a prompt, whatever hash
algorithm the engine was started with (``--prefix-caching-hash-algo``).

Why this hash: the chain is linear in the bodies, so a whole prompt's keys are one vectorised
pass (``key(k) = Qᵏ · Σⱼ≤ₖ body(j) · Q⁻ʲ + ROOT · Qᵏ⁺¹``, ``Q`` odd hence invertible mod
2⁶⁴) over the token ids as one buffer, in numpy: a 30k-token prompt's 1,875 keys in tens of µs
where hashing 30,000 Python ints takes hundreds. It is not collision-resistant against a
crafted prompt; a collision can only misplace a routing preference (the engine checks its own
hashes), never an answer. ``hash`` of the extra keys (strings) is salted per process, so keys
are this process's own: each replica builds its index from the events itself.

An event's few blocks take the same arithmetic in plain Python (``stored_keys``), cheaper than
numpy's per-call overhead for a handful; a test holds the two to each other.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

Keys = npt.NDArray[np.uint64]
MASK = (1 << 64) - 1
ROOT = 0x7468696E6B676174  # the parent of a prompt's first block ("thinkgat")
Q = 0xFF51AFD7ED558CCD  # odd: invertible mod 2**64
Q_INVERSE = pow(Q, -1, 1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_SCALAR_BLOCKS = 8  # up to this many blocks, plain Python beats numpy's per-call overhead
_TOKENS = re.compile(rb'"tokens"\s*:\s*\[')


@lru_cache(maxsize=8)
def multipliers(block_size: int) -> tuple[int, ...]:
    """A random-looking weight per position (SplitMix64's outputs): weights in arithmetic
    progression would give ``[0, 1, 2, 3]`` and ``[2, 2, 2, 2]`` one sum."""
    return tuple(_mix((i + 1) * _GOLDEN & MASK) for i in range(block_size))


@lru_cache(maxsize=8)
def _multipliers_array(block_size: int) -> Keys:
    return np.array(multipliers(block_size), dtype=np.uint64)


@lru_cache(maxsize=4)
def _powers(count: int) -> tuple[Keys, Keys]:
    """``Qᵏ`` and ``Q⁻ᵏ`` for k in [0, count], mod 2⁶⁴ (``count`` a power of two: few tables)."""
    up = np.full(count + 1, Q, dtype=np.uint64)
    down = np.full(count + 1, Q_INVERSE, dtype=np.uint64)
    up[0] = down[0] = 1
    return np.cumprod(up, dtype=np.uint64), np.cumprod(down, dtype=np.uint64)


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _MIX1) & MASK
    z = ((z ^ (z >> 27)) * _MIX2) & MASK
    return z ^ (z >> 31)


def _mix_array(z: Keys) -> Keys:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def _extra(extra: tuple[Any, ...] | None) -> int:
    return 0 if extra is None else hash(extra) & MASK


def prompt_keys(tokens: Sequence[int] | npt.NDArray[Any], block_size: int,
                first_extra: tuple[Any, ...] | None = None, *,
                parent: int = ROOT) -> Keys:  # fmt: skip
    """The keys of the prompt's full blocks, in order. ``first_extra``: the first block's extra
    keys (``(cache_salt,)``), as vLLM adds them; ``parent``: the key before the first block."""
    count = len(tokens) // block_size
    if not count:
        return np.empty(0, dtype=np.uint64)
    ids = np.asarray(tokens[: count * block_size])
    ids = ids.view(np.uint64) if ids.dtype == np.int64 else ids.astype(np.uint64)
    bodies = ids.reshape(count, block_size) @ _multipliers_array(block_size)  # wraps mod 2**64
    bodies[0] ^= np.uint64(_extra(first_extra))
    bodies = _mix_array(bodies)
    up, down = _powers(1 << count.bit_length())
    keys: Keys = np.cumsum(bodies * down[:count], dtype=np.uint64) * up[:count]
    keys += np.uint64(parent) * up[1 : count + 1]
    return keys


def stored_keys(parent: int, tokens: Sequence[int], block_size: int,
                extras: Sequence[tuple[Any, ...] | None]) -> list[int]:  # fmt: skip
    """The keys of an event's blocks (``extras``: one per block), chained on ``parent``."""
    if len(extras) > _SCALAR_BLOCKS and all(e is None for e in extras[1:]):
        return prompt_keys(tokens, block_size, extras[0], parent=parent).tolist()  # type: ignore[no-any-return]
    weights, keys = multipliers(block_size), []
    for i, extra in enumerate(extras):
        block = tokens[i * block_size : (i + 1) * block_size]
        body = sum(map(int.__mul__, block, weights)) & MASK
        parent = (parent * Q + _mix(body ^ _extra(extra))) & MASK
        keys.append(parent)
    return keys


def token_ids(answer: bytes) -> npt.NDArray[np.int64] | None:
    """The ``tokens`` of vLLM's ``/tokenize`` answer, read straight into an array (no Python
    int per token: 30,000 ids in ~640 µs, where a JSON parse and the array made from its list
    take ~1,060); ``None`` if it holds none or is not that."""
    found = _TOKENS.search(answer)
    if found is None:
        return None
    start = found.end()
    end = answer.find(b"]", start)
    if end < 0 or end == start:
        return None
    listed = answer[start:end]
    if not listed.strip():
        return None
    with warnings.catch_warnings():  # numpy warns where it stopped reading: refused here
        warnings.simplefilter("error")
        try:
            ids = np.fromstring(listed, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):
            return None
    if len(ids) != listed.count(b",") + 1 or (len(ids) and ids.min() < 0):
        return None  # something other than ints: stopped early
    return ids


def reusable(matched_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """The tokens an engine holding ``matched_blocks`` of the prompt's blocks will not compute
    again: vLLM always computes a prompt's last token, so a fully cached prompt reuses all
    but its last block."""
    most = (max(prompt_tokens - 1, 0) // block_size) * block_size
    return min(matched_blocks * block_size, most)
