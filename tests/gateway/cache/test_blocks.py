"""``gateway.cache.blocks``: the vectorised chain of block keys against the recurrence it stands
for, the events' scalar path against the vectorised one, and ``/tokenize``'s answer read into
an array."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cache.blocks import (
    MASK,
    ROOT,
    Q,
    multipliers,
    prompt_keys,
    reusable,
    stored_keys,
    token_ids,
)

TOKENS = st.lists(st.integers(0, 2**20), max_size=400)
EXTRA = st.none() | st.tuples(st.text(min_size=1, max_size=8))


def splitmix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def recurrence(tokens: list[int], size: int, extras: list[tuple[str, ...] | None],
               parent: int = ROOT) -> list[int]:  # fmt: skip
    """The module docstring's definition, one block at a time."""
    keys = []
    for b, extra in enumerate(extras):
        block = tokens[b * size : (b + 1) * size]
        body = sum(t * m for t, m in zip(block, multipliers(size), strict=True)) % 2**64
        if extra is not None:
            body ^= hash(extra) & MASK
        parent = (parent * Q + splitmix(body)) % 2**64
        keys.append(parent)
    return keys


@settings(max_examples=200, deadline=None)
@given(TOKENS, st.integers(1, 32), EXTRA, st.integers(0, MASK))
def test_a_prompts_keys_are_the_chain_the_docstring_defines(
    tokens: list[int], size: int, extra: tuple[str, ...] | None, parent: int
) -> None:
    count = len(tokens) // size
    expected = recurrence(tokens, size, ([extra] + [None] * (count - 1))[:count], parent)
    got = prompt_keys(tokens, size, extra, parent=parent)
    assert got.dtype == np.uint64
    assert got.tolist() == expected
    assert prompt_keys(np.array(tokens, dtype=np.int64), size, extra, parent=parent).tolist() == (
        expected
    )


@settings(max_examples=200, deadline=None)
@given(TOKENS, st.integers(1, 16), st.lists(EXTRA, min_size=1, max_size=1), st.booleans(),
       st.integers(0, MASK))  # fmt: skip
def test_an_events_blocks_get_the_keys_a_prompt_gives(
    tokens: list[int], size: int, first: list[tuple[str, ...] | None], every: bool, parent: int
) -> None:
    """Up to 8 blocks in plain Python, more vectorised (when only the first has extra keys):
    the same keys either way, and per-block extras (a LoRA's name) change every key."""
    count = len(tokens) // size
    if not count:
        return
    extras = first + [("lora",) if every else None] * (count - 1)
    whole = tokens[: count * size]
    assert stored_keys(parent, whole, size, extras) == recurrence(whole, size, extras, parent)
    if not every:
        assert stored_keys(parent, whole, size, extras) == (
            prompt_keys(whole, size, first[0], parent=parent).tolist()
        )


def test_a_later_blocks_key_covers_every_block_before_it() -> None:
    a = prompt_keys(list(range(64)), 16).tolist()
    changed = prompt_keys([99, *range(1, 64)], 16).tolist()
    salted = prompt_keys(list(range(64)), 16, ("tenant-a",)).tolist()
    assert len(set(a)) == 4
    assert not set(a) & set(changed)  # the first block differs: every key does
    assert not set(a) & set(salted)
    swapped = prompt_keys([1, 0, *range(2, 64)], 16).tolist()  # positions count, not just sums
    assert swapped[0] != a[0]
    assert prompt_keys(list(range(15)), 16).tolist() == []  # no full block


def test_blocks_of_small_structured_ids_do_not_collide() -> None:
    """Every 4-token block over 13 ids (28,561 of them) and runs of one id: distinct keys (a
    weighted sum with weights in arithmetic progression gave ``[0, 1, 2, 3]`` the key of
    ``[2, 2, 2, 2]``)."""
    grid = np.stack(np.meshgrid(*[np.arange(13)] * 4, indexing="ij"), axis=-1).reshape(-1)
    firsts = [int(prompt_keys(block, 4)[0]) for block in grid.reshape(-1, 4)]
    runs = [int(prompt_keys([n] * 16, 16)[0]) for n in range(2000)]
    assert len(set(firsts)) == len(firsts) == 13**4
    assert len(set(runs)) == len(runs)


def test_reusable_leaves_the_last_token_to_compute() -> None:
    assert reusable(4, 64, 16) == 48
    assert reusable(3, 64, 16) == 48
    assert reusable(2, 64, 16) == 32
    assert reusable(0, 64, 16) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=3000))
def test_tokenizes_answer_reads_as_json_does(tokens: list[int]) -> None:
    answer = orjson.dumps({"count": len(tokens), "max_model_len": 4096, "tokens": tokens,
                           "token_strs": None})  # fmt: skip
    got = token_ids(answer)
    assert got is not None and got.tolist() == tokens


@pytest.mark.parametrize("answer", [
    b'{"count": 3, "tokens": [1, 2, 3]}',
    b'{"tokens" :[ 1,2 ,3 ], "token_strs": ["a", "b", "c"]}',
])  # fmt: skip
def test_tokenizes_answer_with_spaces(answer: bytes) -> None:
    got = token_ids(answer)
    assert got is not None and got.tolist() == [1, 2, 3]


@pytest.mark.parametrize("answer", [
    b'{"count": 0, "tokens": []}', b'{"tokens": [ ]}', b'{"count": 2}', b"not json",
    b'{"tokens": [1, "a", 3]}', b'{"tokens": [1.5, 2]}', b'{"tokens": [1, -2]}',
    b'{"tokens": [1, 2', b'{"tokens": [1,,2]}',
])  # fmt: skip
def test_an_answer_without_token_ids_gives_none(answer: bytes) -> None:
    assert token_ids(answer) is None


def test_numpy_loaded_the_gateways_way_runs_on_the_calling_thread_alone() -> None:
    """``one_blas_thread`` before numpy's import: no OpenBLAS worker spinning beside the event
    loop (with one, the process spent twice the calling thread's CPU on the block keys)."""
    probe = ("import os; from gateway.cache import one_blas_thread; one_blas_thread(); "
             "from gateway.cache.blocks import prompt_keys; "
             "[prompt_keys(list(range(30_000)), 16) for _ in range(50)]; "
             "print(len(os.listdir('/proc/self/task')))")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env=env, check=True, timeout=120)  # fmt: skip
    assert shown.stdout.strip() == "1"
