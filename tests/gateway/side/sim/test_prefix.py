"""The simulator's prefix cache: hits, eviction, salts and the events vLLM would publish, read
back by the gateway's own decoder and index (the two agree on every prefix)."""

from __future__ import annotations

import msgpack

from gateway.cache.blocks import prompt_keys
from gateway.cache.events import decode
from gateway.cache.index import PrefixIndex
from gateway.side.sim.prefix import PrefixCache, prompt_ids
from gateway.side.sim.script import count_prompt_tokens


def _index(cache_events: list[dict[str, object]], index: PrefixIndex | None = None) -> PrefixIndex:
    index = index or PrefixIndex()
    index.apply("sim", decode(msgpack.packb([0.0, cache_events, 0])))
    return index


def test_the_tokenizer_counts_as_the_simulator_counts() -> None:
    for text in ("", "abc", "abcd", "x" * 1001):
        assert len(prompt_ids(text)) == count_prompt_tokens(text)
    assert prompt_ids("abcdefgh")[:1] == prompt_ids("abcdijkl")[:1]


def test_a_repeated_prompt_hits_all_but_its_last_block() -> None:
    cache, ids = PrefixCache(100, 4), list(range(16))
    first = cache.lookup(ids, None)
    assert (first.hits, first.cached_tokens) == (0, 0)
    events = cache.acquire(first, ids, None)
    cache.release(first)
    assert [e["type"] for e in events] == ["BlockStored"]
    again = cache.lookup(ids, None)
    assert (again.hits, again.cached_tokens) == (4, 12)
    assert cache.acquire(again, ids, None) == []  # nothing new to store
    assert (cache.queries, cache.hit_tokens) == (32, 12)


def test_a_longer_prompt_stores_only_its_new_blocks_under_the_last_held() -> None:
    cache, index = PrefixCache(100, 4), PrefixIndex()
    short, longer = list(range(8)), list(range(14))
    for ids in (short, longer):
        found = cache.lookup(ids, None)
        _index(cache.acquire(found, ids, None), index)
        cache.release(found)
    assert index.matched("sim", prompt_keys(longer, 4)) == 3
    assert index.engines["sim"].orphans == 0


def test_the_least_recently_used_unpinned_blocks_are_evicted() -> None:
    cache, index = PrefixCache(4, 2), PrefixIndex()
    a, b = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]
    held = cache.lookup(a, None)
    _index(cache.acquire(held, a, None), index)  # pinned: a's 3 blocks
    other = cache.lookup(b, None)
    events = cache.acquire(other, b, None)  # 6 blocks, room for 4: b's unpinned ones? none
    assert [e["type"] for e in events] == ["BlockStored"] and len(cache) == 6
    cache.release(held)
    cache.release(other)
    c = [13, 14]
    found = cache.lookup(c, None)
    events = cache.acquire(found, c, None)
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    _index(events, index)
    assert len(cache) == 4 and removed and removed[0]["block_hashes"] == list(held.hashes)
    assert index.matched("sim", prompt_keys(a, 2)) == 0  # a went first: least recently used


def test_a_salt_keys_the_first_block_and_reaches_the_index() -> None:
    cache, ids = PrefixCache(100, 4), list(range(12))
    found = cache.lookup(ids, "tenant-a")
    index = _index(cache.acquire(found, ids, "tenant-a"))
    assert cache.lookup(ids, "tenant-b").hits == 0
    assert cache.lookup(ids, "tenant-a").hits == 3
    assert index.matched("sim", prompt_keys(ids, 4, ("tenant-a",))) == 3
    assert index.matched("sim", prompt_keys(ids, 4)) == 0


def test_clear_forgets_everything_not_in_use() -> None:
    cache, ids = PrefixCache(100, 4), list(range(8))
    cache.acquire(cache.lookup(ids, None), ids, None)
    assert cache.clear() == [{"type": "AllBlocksCleared"}]
    assert len(cache) == 2  # still pinned by its request
