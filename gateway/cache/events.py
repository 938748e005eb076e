"""vLLM's KV cache events, decoded (sans-I/O).

An engine started with ``--kv-events-config`` publishes, on a ZMQ PUB socket, multipart messages
``(topic, sequence, payload)``: ``sequence`` an 8-byte big-endian counter from 0 at the engine's
start, ``payload`` msgpack ``[ts, events, data_parallel_rank]``. Each event is a tagged struct:
vLLM 0.32 encodes it as a map with a ``type`` key; earlier versions as an array whose first
item is the tag (both are read). What the index needs:

- ``BlockStored``: the new blocks' hashes (the engine's own: ints or bytes, opaque here), the
  hash of the block before the first of them (``None``: they start a prompt), the blocks'
  token ids (``block_size`` per block, in order), and each block's extra keys (the
  ``cache_salt`` on a prompt's first block, a LoRA's name on each);
- ``BlockRemoved``: hashes evicted;
- ``AllBlocksCleared``: everything gone (``/reset_prefix_cache``).

Blocks on another medium than the GPU's (an offloading tier) and of a group other than the
first (a hybrid model's sliding-window layers) are not indexed: a prefix hit means the
full-attention blocks are on the GPU. A payload that cannot be read raises ``BadEvents``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

BlockHash = int | bytes
END_OF_REPLAY = -1  # the sequence number a replay's last message carries


class BadEvents(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class BlocksStored:
    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    tokens: tuple[int, ...]
    block_size: int
    extras: tuple[tuple[Any, ...] | None, ...]  # one per block


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class AllCleared:
    pass


Event = BlocksStored | BlocksRemoved | AllCleared

# The array form's fields after the tag, in vLLM's declaration order.
_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}  # fmt: skip


def sequence_of(frame: bytes) -> int:
    if len(frame) != 8:
        raise BadEvents(f"a sequence frame of {len(frame)} bytes")
    return int.from_bytes(frame, "big", signed=True)


def decode(payload: bytes) -> list[Event]:
    """The events of one published batch, in order; those the index ignores left out."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise BadEvents(f"not msgpack: {exc}") from None
    if not isinstance(batch, list | tuple) or len(batch) < 2 or not isinstance(batch[1], list):
        raise BadEvents("not an event batch")
    events = []
    for raw in batch[1]:
        event = _event(_fields(raw))
        if event is not None:
            events.append(event)
    return events


def _fields(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, list | tuple) and raw and raw[0] in _FIELDS:
        return {"type": raw[0], **dict(zip(_FIELDS[raw[0]], raw[1:], strict=False))}
    raise BadEvents("an event that is neither a map nor a tagged array")


def _ours(fields: dict[str, Any]) -> bool:
    return fields.get("medium") in (None, "GPU") and fields.get("group_idx") in (None, 0)


def _event(fields: dict[str, Any]) -> Event | None:
    kind = fields.get("type")
    if kind == "AllBlocksCleared":
        return AllCleared()
    if kind not in ("BlockStored", "BlockRemoved") or not _ours(fields):
        return None
    hashes = tuple(fields.get("block_hashes") or ())
    if kind == "BlockRemoved":
        return BlocksRemoved(hashes)
    tokens, size = fields.get("token_ids") or (), fields.get("block_size")
    if not isinstance(size, int) or size < 1 or len(tokens) != size * len(hashes):
        raise BadEvents("a BlockStored whose token ids are not its blocks'")
    extras = fields.get("extra_keys") or [None] * len(hashes)
    if len(extras) != len(hashes):
        raise BadEvents("a BlockStored whose extra keys are not one per block")
    return BlocksStored(hashes, fields.get("parent_block_hash"), tuple(tokens), size,
                  tuple(_extra(e) for e in extras))  # fmt: skip


def _extra(keys: Sequence[Any] | None) -> tuple[Any, ...] | None:
    if not keys:
        return None
    return tuple(tuple(k) if isinstance(k, list) else k for k in keys)
