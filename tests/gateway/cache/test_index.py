"""The prefix index from vLLM-shaped events, against the keys a prompt's blocks give."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cache.blocks import prompt_keys, reusable
from gateway.cache.events import (
    AllCleared,
    BadEvents,
    BlocksRemoved,
    BlocksStored,
    decode,
    sequence_of,
)
from gateway.cache.index import PrefixIndex
from tests.gateway.cache.vllmwire import FakeEngine, batch, cleared, removed, stored

SYSTEM = list(range(1000, 1300))  # a shared system prompt: 300 tokens


def test_a_batch_decodes_in_both_of_vllms_encodings() -> None:
    as_map = stored([7, 8], 6, list(range(8)), 4, [["salt"], None])
    fields = ["BlockStored", [7, 8], 6, list(range(8)), 4, None, "GPU", None, [["salt"], None]]
    for event in (as_map, fields):
        (got,) = decode(msgpack.packb([1.5, [event], 0]))
        assert got == BlocksStored((7, 8), 6, tuple(range(8)), 4, (("salt",), None))
    assert decode(batch(removed([7]), cleared())) == [BlocksRemoved((7,)), AllCleared()]


def test_blocks_off_the_gpu_or_of_another_group_are_not_indexed() -> None:
    offloaded = {**stored([1], None, [1, 2], 2), "medium": "CPU"}
    sliding = {**stored([2], None, [1, 2], 2), "group_idx": 1}
    assert decode(batch(offloaded, sliding, {**removed([1]), "medium": "CPU"})) == []


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1.0, 2]),
                                     batch(stored([1], None, [1, 2, 3], 2)),
                                     batch({**stored([1, 2], None, [1, 2, 3, 4], 2),
                                            "extra_keys": [None]}),
                                     msgpack.packb([1.0, [[1, 2]], 0])])  # fmt: skip
def test_a_payload_that_is_not_events_is_refused(payload: bytes) -> None:
    with pytest.raises(BadEvents):
        decode(payload)


def test_the_sequence_is_eight_bytes_big_endian() -> None:
    assert sequence_of((5).to_bytes(8, "big")) == 5
    assert sequence_of((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(BadEvents):
        sequence_of(b"\x00")


def test_an_engine_holding_a_conversation_matches_its_next_turn() -> None:
    index, engine = PrefixIndex(), FakeEngine(16)
    turn1 = SYSTEM + list(range(50))
    index.apply("a", decode(batch(engine.store(turn1))))
    turn2 = turn1 + list(range(500, 600))
    keys = prompt_keys(turn2, 16)
    assert index.matched("a", keys) == len(turn1) // 16
    assert index.matched("b", keys) == 0
    assert reusable(index.matched("a", keys), len(turn2), 16) == (len(turn1) // 16) * 16


def test_a_salt_keeps_the_same_tokens_apart() -> None:
    index, engine = PrefixIndex(), FakeEngine(16)
    index.apply("a", decode(batch(engine.store(SYSTEM, salt="tenant-a"))))
    assert index.matched("a", prompt_keys(SYSTEM, 16, ("tenant-a",))) == len(SYSTEM) // 16
    assert index.matched("a", prompt_keys(SYSTEM, 16, ("tenant-b",))) == 0
    assert index.matched("a", prompt_keys(SYSTEM, 16)) == 0


def test_removed_blocks_and_a_clear_are_forgotten() -> None:
    index, engine = PrefixIndex(), FakeEngine(4)
    event = engine.store(list(range(12)))
    assert event is not None
    index.apply("a", decode(batch(event)))
    keys = prompt_keys(list(range(12)), 4)
    assert index.matched("a", keys) == 3
    index.apply("a", decode(batch(removed(event["block_hashes"][2:]))))
    assert index.matched("a", keys) == 2
    index.apply("a", decode(batch(cleared())))
    assert index.matched("a", keys) == 0 and index.size("a") == 0
    assert index.block_size("a") == 4


def test_a_block_whose_parent_was_never_seen_is_an_orphan() -> None:
    index = PrefixIndex()
    index.apply("a", decode(batch(stored([9], 8, [1, 2, 3, 4], 4))))
    assert index.size("a") == 0 and index.engines["a"].orphans == 1


def test_the_last_token_is_always_computed() -> None:
    assert reusable(3, 48, 16) == 32  # all three blocks held, the last one recomputed
    assert reusable(3, 49, 16) == 48
    assert reusable(0, 49, 16) == 0


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=40), min_size=1, max_size=6),
    probe=st.lists(st.integers(0, 5), max_size=40),
    size=st.sampled_from([1, 2, 4]),
)
def test_the_index_agrees_with_the_engine_on_every_prefix(
    prompts: list[list[int]], probe: list[int], size: int
) -> None:
    """Whatever prompts an engine stored, the index finds exactly the longest prefix of a
    probe whose blocks the engine holds."""
    index, engine = PrefixIndex(), FakeEngine(size)
    for prompt in prompts:
        index.apply("e", decode(batch(engine.store(prompt))))
    expected = 0
    while (expected + 1) * size <= len(probe) and (
        (None, tuple(probe[: (expected + 1) * size])) in engine.blocks
    ):
        expected += 1
    assert index.matched("e", prompt_keys(probe, size)) == expected
