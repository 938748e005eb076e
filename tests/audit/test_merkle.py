"""RFC 9162 Merkle math: published RFC 6962 vectors, a naive reference tree written straight from
the RFC text, Hypothesis properties, and the strict verification rules.

Nothing "expected" here is computed with the code under test: hashes come from the published
vectors or from ``Reference``, which uses hashlib directly.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.merkle import (
    EMPTY_ROOT,
    HASH_SIZE,
    CompactRange,
    NodeID,
    ProofError,
    Range,
    assemble,
    consistency_plan,
    frontier,
    inclusion_plan,
    leaf_hash,
    node_hash,
    plan_nodes,
    range_plan,
    root_from_inclusion_proof,
    verify_consistency,
    verify_inclusion,
)


def h(hex_digest: str) -> bytes:
    return bytes.fromhex(hex_digest)


# --- Published vectors ----------------------------------------------------------------------
# transparency-dev/merkle testonly/constants.go (LeafInputs, NodeHashes, RootHashes,
# CompactTrees), the RFC 6962 reference data also used by Certificate Transparency.

LEAVES = [
    h(""),
    h("00"),
    h("10"),
    h("2021"),
    h("3031"),
    h("40414243"),
    h("5051525354555657"),
    h("606162636465666768696a6b6c6d6e6f"),
]

# NODE_HASHES[level][index]: every complete subtree of the 8-leaf tree.
NODE_HASHES = [
    [
        h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
        h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
        h("0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7"),
        h("07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7"),
        h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        h("4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658"),
        h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
        h("46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1"),
    ],
    [
        h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
        h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
        h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
        h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
    ],
    [
        h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
    ],
    [h("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")],
]

# ROOTS[size] for sizes 0..8.
ROOTS = [
    h("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
    h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
    h("aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77"),
    h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
    h("4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4"),
    h("76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef"),
    h("ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c"),
    h("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"),
]

# CompactTrees: the frontier hashes of every size, as (level, index) into NODE_HASHES.
FRONTIERS = [
    [],
    [(0, 0)],
    [(1, 0)],
    [(1, 0), (0, 2)],
    [(2, 0)],
    [(2, 0), (0, 4)],
    [(2, 0), (1, 2)],
    [(2, 0), (1, 2), (0, 6)],
    [(3, 0)],
]

# (index, size, proof): proof/verify_test.go inclusionProofs (whose leaf numbers are 1-based;
# converted to 0-based indexes here) and testonly/reference_test.go TestRefInclusionProof.
INCLUSION_VECTORS = [
    (0, 1, []),
    (0, 2, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"]),
    (1, 2, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"]),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
]

# (first, second, proof): proof/verify_test.go consistencyProofs.
CONSISTENCY_VECTORS = [
    (1, 1, []),
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
    (
        6,
        7,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
]

# proof/proof_test.go TestInclusion / TestConsistency: the node IDs (level, index) of a proof;
# IDs[begin:end] are the children of the one ephemeral node, listed lowest level first (so a
# Range, left to right, is that slice reversed). (size, index, ids, begin, end):
GO_INCLUSION_PLANS: list[tuple[int, int, list[tuple[int, int]], int, int]] = [
    (1, 0, [], 0, 0),
    (2, 0, [(0, 1)], 0, 0),
    (2, 1, [(0, 0)], 0, 0),
    (3, 1, [(0, 0), (0, 2)], 0, 0),
    (7, 0, [(0, 1), (1, 1), (0, 6), (1, 2)], 2, 4),
    (7, 1, [(0, 0), (1, 1), (0, 6), (1, 2)], 2, 4),
    (7, 2, [(0, 3), (1, 0), (0, 6), (1, 2)], 2, 4),
    (7, 3, [(0, 2), (1, 0), (0, 6), (1, 2)], 2, 4),
    (7, 4, [(0, 5), (0, 6), (2, 0)], 0, 0),
    (7, 5, [(0, 4), (0, 6), (2, 0)], 0, 0),
    (7, 6, [(1, 2), (2, 0)], 0, 0),
    (4, 2, [(0, 3), (1, 0)], 0, 0),
    (5, 3, [(0, 2), (1, 0), (0, 4)], 0, 0),
    (6, 3, [(0, 2), (1, 0), (1, 2)], 0, 0),
    (6, 4, [(0, 5), (2, 0)], 0, 0),
    (15, 10, [(0, 11), (1, 4), (0, 14), (1, 6), (3, 0)], 2, 4),
    (31, 24, [(0, 25), (1, 13), (0, 30), (1, 14), (3, 2), (4, 0)], 2, 4),
    (95, 81, [(0, 80), (1, 41), (2, 21), (0, 94), (1, 46), (2, 22), (4, 4), (6, 0)], 3, 6),
]
# (first, second, ids, begin, end):
GO_CONSISTENCY_PLANS: list[tuple[int, int, list[tuple[int, int]], int, int]] = [
    (1, 2, [(0, 1)], 0, 0),
    (1, 4, [(0, 1), (1, 1)], 0, 0),
    (1, 6, [(0, 1), (1, 1), (1, 2)], 0, 0),
    (2, 3, [(0, 2)], 0, 0),
    (2, 8, [(1, 1), (2, 1)], 0, 0),
    (3, 7, [(0, 2), (0, 3), (1, 0), (0, 6), (1, 2)], 3, 5),
    (4, 7, [(0, 6), (1, 2)], 0, 2),
    (5, 7, [(0, 4), (0, 5), (0, 6), (2, 0)], 0, 0),
    (6, 7, [(1, 2), (0, 6), (2, 0)], 0, 0),
    (7, 8, [(0, 6), (0, 7), (1, 2), (2, 0)], 0, 0),
    (1, 1, [], 0, 0),
    (2, 2, [], 0, 0),
    (3, 3, [], 0, 0),
    (4, 4, [], 0, 0),
    (5, 5, [], 0, 0),
    (7, 7, [], 0, 0),
    (8, 8, [], 0, 0),
    (2, 4, [(1, 1)], 0, 0),
    (3, 5, [(0, 2), (0, 3), (1, 0), (0, 4)], 0, 0),
    (3, 6, [(0, 2), (0, 3), (1, 0), (1, 2)], 0, 0),
    (4, 6, [(1, 2)], 0, 0),
    (1, 7, [(0, 1), (1, 1), (0, 6), (1, 2)], 2, 4),
    (10, 15, [(1, 4), (1, 5), (0, 14), (1, 6), (3, 0)], 2, 4),
    (24, 31, [(3, 2), (0, 30), (1, 14), (2, 6), (4, 0)], 1, 4),
    (81, 95, [(0, 80), (0, 81), (1, 41), (2, 21), (0, 94), (1, 46), (2, 22), (4, 4), (6, 0)], 4, 7),
]

SOME_HASH = h("abacaba000000000000000000000000000000000000000000060061e00123456")


def go_plan(ids: list[tuple[int, int]], begin: int, end: int) -> list[Range]:
    """A Go ``proof.Nodes`` as a list of Ranges."""
    nodes = [NodeID(level, index) for level, index in ids]
    if begin >= end:
        return [(node,) for node in nodes]
    ephemeral = tuple(reversed(nodes[begin:end]))
    return [(n,) for n in nodes[:begin]] + [ephemeral] + [(n,) for n in nodes[end:]]


# --- The reference tree: RFC 9162 §2.1 straight from the text ------------------------------


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


class Reference:
    """MTH (§2.1.1), PATH (§2.1.3.1) and SUBPROOF (§2.1.4.1) over ``D[begin:end]``, using
    hashlib directly. MTH is memoised, which changes nothing but the cost."""

    def __init__(self, entries: Sequence[bytes]) -> None:
        self.entries = entries
        self._mth: dict[tuple[int, int], bytes] = {}

    def mth(self, begin: int, end: int) -> bytes:
        if end - begin == 0:
            return hashlib.sha256(b"").digest()
        if end - begin == 1:
            return hashlib.sha256(b"\x00" + self.entries[begin]).digest()
        if (begin, end) not in self._mth:
            k = _split(end - begin)
            both = self.mth(begin, begin + k) + self.mth(begin + k, end)
            self._mth[begin, end] = hashlib.sha256(b"\x01" + both).digest()
        return self._mth[begin, end]

    def path(self, m: int, begin: int, end: int) -> list[bytes]:
        if end - begin == 1:
            return []
        k = _split(end - begin)
        if m < k:
            return [*self.path(m, begin, begin + k), self.mth(begin + k, end)]
        return [*self.path(m - k, begin + k, end), self.mth(begin, begin + k)]

    def proof(self, m: int, n: int) -> list[bytes]:
        return self.subproof(m, 0, n, True)

    def subproof(self, m: int, begin: int, end: int, b: bool) -> list[bytes]:
        if m == end - begin:
            return [] if b else [self.mth(begin, end)]
        k = _split(end - begin)
        if m <= k:
            return [*self.subproof(m, begin, begin + k, b), self.mth(begin + k, end)]
        return [*self.subproof(m - k, begin + k, end, False), self.mth(begin, begin + k)]


def grow(entries: Sequence[bytes]) -> tuple[CompactRange, list[list[tuple[NodeID, bytes]]]]:
    """Append every entry's leaf hash (hashed by hashlib, not the code under test)."""
    tree = CompactRange()
    rows = [tree.append(hashlib.sha256(b"\x00" + e).digest()) for e in entries]
    return tree, rows


MAX = 300
ENTRIES = [b"entry %d" % i for i in range(MAX)]
OTHER_ENTRIES = [b"other %d" % i for i in range(MAX)]  # differs from ENTRIES at every leaf
REF = Reference(ENTRIES)
OTHER = Reference(OTHER_ENTRIES)


@functools.cache
def store(size: int) -> dict[NodeID, bytes]:
    """Every row storage would hold after ``size`` appends of ENTRIES."""
    _, rows = grow(ENTRIES[:size])
    return {node: value for batch in rows for node, value in batch}


PUBLISHED_STORE = {
    NodeID(level, index): value
    for level, hashes in enumerate(NODE_HASHES)
    for index, value in enumerate(hashes)
}


# --- Hashes, NodeID, frontier, range_plan ---------------------------------------------------


def test_hash_primitives_match_the_published_leaves_and_empty_root() -> None:
    assert HASH_SIZE == 32
    assert ROOTS[0] == EMPTY_ROOT
    assert [leaf_hash(d) for d in LEAVES] == NODE_HASHES[0]
    assert node_hash(NODE_HASHES[0][0], NODE_HASHES[0][1]) == NODE_HASHES[1][0]


def test_node_id_covers_its_leaves_and_orders_by_level_then_index() -> None:
    node = NodeID(3, 5)
    assert (node.begin, node.end) == (40, 48)
    assert sorted([NodeID(1, 0), NodeID(0, 9), NodeID(0, 2)]) == [
        NodeID(0, 2),
        NodeID(0, 9),
        NodeID(1, 0),
    ]
    with pytest.raises(ProofError):
        NodeID(-1, 0)


@pytest.mark.parametrize("size", range(9))
def test_frontier_matches_the_published_compact_trees(size: int) -> None:
    assert frontier(size) == [NodeID(level, index) for level, index in FRONTIERS[size]]


def test_range_plan_matches_the_go_decompose_example() -> None:
    # compact/range.go Decompose: (0b110, 0b11101) is a sequence of sizes 2,8; 8,4,1.
    assert [1 << n.level for n in range_plan(0b110, 0b11101)] == [2, 8, 8, 4, 1]


def decompose_count(begin: int, end: int) -> int:
    """How many subtrees compact/range.go ``Decompose`` puts in [begin, end): the minimum."""
    if begin == 0:
        return end.bit_count()
    mask = (1 << (((begin - 1) ^ end).bit_length() - 1)) - 1
    return (~(begin - 1) & mask).bit_count() + (end & mask).bit_count()


@settings(max_examples=300, deadline=None)
@given(begin=st.integers(0, 5000), length=st.integers(0, 5000))
def test_range_plan_is_a_minimal_cover_left_to_right(begin: int, length: int) -> None:
    nodes = range_plan(begin, begin + length)
    assert len(nodes) == decompose_count(begin, begin + length)
    edges = [begin, *(n.end for n in nodes)]
    assert [n.begin for n in nodes] == edges[:-1]
    assert edges[-1] == begin + length


@pytest.mark.parametrize(("begin", "end"), [(-1, 3), (4, 3)])
def test_range_plan_rejects_bad_ranges(begin: int, end: int) -> None:
    with pytest.raises(ProofError):
        range_plan(begin, end)


# --- CompactRange ----------------------------------------------------------------------------


def test_compact_range_roots_and_frontiers_match_the_published_tree() -> None:
    tree = CompactRange()
    assert (tree.size, tree.hashes, tree.root()) == (0, (), ROOTS[0])
    for size, data in enumerate(LEAVES, start=1):
        tree.append(leaf_hash(data))
        assert tree.size == size
        assert tree.root() == ROOTS[size]
        assert tree.hashes == tuple(NODE_HASHES[lv][ix] for lv, ix in FRONTIERS[size])


def test_append_reports_each_published_node_once_lowest_first() -> None:
    tree = CompactRange()
    for size, data in enumerate(LEAVES, start=1):
        rows = tree.append(leaf_hash(data))
        ends_here = [(lv, (size >> lv) - 1) for lv in range(4) if size % (1 << lv) == 0]
        assert rows == [(NodeID(lv, ix), NODE_HASHES[lv][ix]) for lv, ix in ends_here]


@pytest.mark.parametrize("size", range(9))
def test_compact_range_restored_from_published_hashes_continues(size: int) -> None:
    hashes = [NODE_HASHES[lv][ix] for lv, ix in FRONTIERS[size]]
    tree = CompactRange(size, hashes)
    assert tree.root() == ROOTS[size]
    for data in LEAVES[size:]:
        tree.append(leaf_hash(data))
    assert tree.root() == ROOTS[8]


@pytest.mark.parametrize(
    ("size", "hashes"),
    [
        (-1, []),
        (3, [ROOTS[2]]),
        (3, [ROOTS[2], ROOTS[1], ROOTS[3]]),
        (2, [ROOTS[2][:31]]),
        (2, [ROOTS[2] + b"\x00"]),
    ],
)
def test_compact_range_rejects_a_bad_frontier(size: int, hashes: list[bytes]) -> None:
    with pytest.raises(ProofError):
        CompactRange(size, hashes)


@pytest.mark.parametrize("leaf", [b"", b"\x00" * 31, b"\x00" * 33])
def test_append_rejects_a_bad_leaf_hash(leaf: bytes) -> None:
    tree = CompactRange()
    with pytest.raises(ProofError):
        tree.append(leaf)
    assert tree.size == 0


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, MAX), salt=st.binary(max_size=8))
def test_every_prefix_root_is_the_reference_mth(size: int, salt: bytes) -> None:
    entries = [salt + i.to_bytes(2, "big") for i in range(size)]
    ref = Reference(entries)
    tree = CompactRange()
    assert tree.root() == ref.mth(0, 0)
    for n, entry in enumerate(entries, start=1):
        tree.append(hashlib.sha256(b"\x00" + entry).digest())
        assert tree.root() == ref.mth(0, n)


@settings(max_examples=100, deadline=None)
@given(size=st.integers(0, MAX))
def test_appended_rows_are_exactly_the_complete_subtrees(size: int) -> None:
    _, batches = grow(ENTRIES[:size])
    rows = [row for batch in batches for row in batch]
    complete = {NodeID(lv, ix) for lv in range(size.bit_length()) for ix in range(size >> lv)}
    assert len(rows) == len(complete)  # no subtree is reported twice
    assert {node for node, _ in rows} == complete
    for node, value in rows:
        assert value == REF.mth(node.begin, node.end)
    for batch in batches:
        assert [node.level for node, _ in batch] == list(range(len(batch)))


# --- Proof generation --------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "index", "ids", "begin", "end"), GO_INCLUSION_PLANS)
def test_inclusion_plan_matches_go(
    size: int, index: int, ids: list[tuple[int, int]], begin: int, end: int
) -> None:
    assert inclusion_plan(index, size) == go_plan(ids, begin, end)


@pytest.mark.parametrize(("first", "second", "ids", "begin", "end"), GO_CONSISTENCY_PLANS)
def test_consistency_plan_matches_go(
    first: int, second: int, ids: list[tuple[int, int]], begin: int, end: int
) -> None:
    assert consistency_plan(first, second) == go_plan(ids, begin, end)


@pytest.mark.parametrize(("index", "size"), [(0, 0), (1, 0), (2, 1), (3, 0), (8, 7), (-1, 5)])
def test_inclusion_plan_rejects_an_index_outside_the_tree(index: int, size: int) -> None:
    with pytest.raises(ProofError):
        inclusion_plan(index, size)


@pytest.mark.parametrize(("first", "second"), [(5, 0), (9, 8), (0, 0), (0, 5), (-1, 5)])
def test_consistency_plan_rejects_bad_sizes(first: int, second: int) -> None:
    with pytest.raises(ProofError):
        consistency_plan(first, second)


@pytest.mark.parametrize(("index", "size", "proof"), INCLUSION_VECTORS)
def test_published_inclusion_proofs_are_generated_and_verify(
    index: int, size: int, proof: list[str]
) -> None:
    expected = [h(p) for p in proof]
    stored = {n: v for n, v in PUBLISHED_STORE.items() if n.end <= size}
    plan = inclusion_plan(index, size)
    assert plan_nodes(plan) <= stored.keys()
    assert assemble(plan, stored) == expected
    leaf = NODE_HASHES[0][index]
    assert root_from_inclusion_proof(leaf, index, size, expected) == ROOTS[size]
    verify_inclusion(leaf, index, size, expected, ROOTS[size])


@pytest.mark.parametrize(("first", "second", "proof"), CONSISTENCY_VECTORS)
def test_published_consistency_proofs_are_generated_and_verify(
    first: int, second: int, proof: list[str]
) -> None:
    expected = [h(p) for p in proof]
    stored = {n: v for n, v in PUBLISHED_STORE.items() if n.end <= second}
    plan = consistency_plan(first, second)
    assert plan_nodes(plan) <= stored.keys()
    assert assemble(plan, stored) == expected
    verify_consistency(first, second, expected, ROOTS[first], ROOTS[second])


def test_assemble_rejects_missing_or_bad_hashes_and_empty_ranges() -> None:
    plan = inclusion_plan(0, 8)
    missing = dict(PUBLISHED_STORE)
    del missing[NodeID(1, 1)]
    bad = {**PUBLISHED_STORE, NodeID(1, 1): b"short"}
    for hashes in (missing, bad, {}):
        with pytest.raises(ProofError):
            assemble(plan, hashes)
    with pytest.raises(ProofError):
        assemble([()], PUBLISHED_STORE)


def one_too_short_and_one_too_long(proof: list[bytes]) -> list[list[bytes]]:
    longer = [*proof, proof[-1] if proof else SOME_HASH]
    return [proof[:-1], longer] if proof else [longer]


@st.composite
def index_and_size(draw: st.DrawFn) -> tuple[int, int]:
    size = draw(st.integers(1, MAX))
    return draw(st.integers(0, size - 1)), size


@st.composite
def two_sizes(draw: st.DrawFn) -> tuple[int, int]:
    second = draw(st.integers(1, MAX))
    return draw(st.integers(1, second)), second


@settings(max_examples=300, deadline=None)
@given(case=index_and_size())
def test_inclusion_proofs_equal_the_reference_and_verify(case: tuple[int, int]) -> None:
    index, size = case
    plan = inclusion_plan(index, size)
    assert plan_nodes(plan) <= store(size).keys()  # only complete subtrees are ever needed
    proof = assemble(plan, store(size))
    assert proof == REF.path(index, 0, size)
    leaf = REF.mth(index, index + 1)
    verify_inclusion(leaf, index, size, proof, REF.mth(0, size))
    for wrong in one_too_short_and_one_too_long(proof):
        with pytest.raises(ProofError):
            verify_inclusion(leaf, index, size, wrong, REF.mth(0, size))


@settings(max_examples=300, deadline=None)
@given(case=two_sizes())
def test_consistency_proofs_equal_the_reference_and_verify(case: tuple[int, int]) -> None:
    first, second = case
    plan = consistency_plan(first, second)
    assert plan_nodes(plan) <= store(second).keys()  # only complete subtrees are ever needed
    proof = assemble(plan, store(second))
    assert proof == REF.proof(first, second)
    roots = REF.mth(0, first), REF.mth(0, second)
    verify_consistency(first, second, proof, *roots)
    for wrong in one_too_short_and_one_too_long(proof):
        with pytest.raises(ProofError):
            verify_consistency(first, second, wrong, *roots)


@settings(max_examples=300, deadline=None)
@given(a=st.integers(-(2**70), 2**70), b=st.integers(-(2**70), 2**70))
def test_plans_return_or_raise_proof_error_for_any_ints(a: int, b: int) -> None:
    for make in (inclusion_plan, consistency_plan):
        try:
            plan = make(a, b)
        except ProofError:
            continue
        assert all(plan) and len(plan) <= 2 * 72


# --- Strict verification -------------------------------------------------------------------

Check = Callable[[], None]


def flipped(proof: list[bytes], position: int, byte: int, bit: int) -> list[bytes]:
    item = bytearray(proof[position])
    item[byte] ^= 1 << bit
    return [*proof[:position], bytes(item), *proof[position + 1 :]]


def inclusion_probes(index: int, size: int, proof: list[bytes]) -> list[tuple[str, Check]]:
    """proof/verify_test.go corruptInclusionProof, plus bit flips at both ends of each hash."""
    root, leaf = ROOTS[size], NODE_HASHES[0][index]

    def probe(i: int, n: int, lf: bytes, p: list[bytes], rt: bytes) -> Check:
        return lambda: verify_inclusion(lf, i, n, p, rt)

    probes = [
        ("index - 1", probe(index - 1, size, leaf, proof, root)),
        ("index + 1", probe(index + 1, size, leaf, proof, root)),
        ("index ^ 2", probe(index ^ 2, size, leaf, proof, root)),
        ("size * 2", probe(index, size * 2, leaf, proof, root)),
        ("size // 2", probe(index, size // 2, leaf, proof, root)),
        ("wrong leaf", probe(index, size, b"WrongLeaf", proof, root)),
        ("other leaf", probe(index, size, SOME_HASH, proof, root)),
        ("empty root", probe(index, size, leaf, proof, EMPTY_ROOT)),
        ("random root", probe(index, size, leaf, proof, SOME_HASH)),
        ("short root", probe(index, size, leaf, proof, root[:31])),
        ("trailing garbage", probe(index, size, leaf, [*proof, b""], root)),
        ("trailing root", probe(index, size, leaf, [*proof, root], root)),
        ("preceding garbage", probe(index, size, leaf, [b"", *proof], root)),
        ("preceding root", probe(index, size, leaf, [root, *proof], root)),
    ]
    if proof:
        probes.append(("removed component", probe(index, size, leaf, proof[:-1], root)))
        longer = [proof[0] + b"\x00", *proof[1:]]
        probes.append(("long item", probe(index, size, leaf, longer, root)))
    if len(proof) > 1:
        inserted = [proof[0], SOME_HASH, *proof[1:]]
        probes.append(("inserted component", probe(index, size, leaf, inserted, root)))
    for pos in range(len(proof)):
        for byte, bit in ((0, 3), (0, 0), (31, 7)):
            wrong = flipped(proof, pos, byte, bit)
            probes.append((f"flip {pos}/{byte}/{bit}", probe(index, size, leaf, wrong, root)))
    return probes


def consistency_probes(first: int, second: int, proof: list[bytes]) -> list[tuple[str, Check]]:
    """proof/verify_test.go corruptConsistencyProof, plus bit flips at both ends of each hash."""
    r1, r2 = ROOTS[first], ROOTS[second]

    def probe(m: int, n: int, p: list[bytes], a: bytes, b: bytes) -> Check:
        return lambda: verify_consistency(m, n, p, a, b)

    probes = [
        ("first - 1", probe(first - 1, second, proof, r1, r2)),
        ("first + 1", probe(first + 1, second, proof, r1, r2)),
        ("first ^ 2", probe(first ^ 2, second, proof, r1, r2)),
        ("second * 2", probe(first, second * 2, proof, r1, r2)),
        ("second // 2", probe(first, second // 2, proof, r1, r2)),
        ("wrong root1", probe(first, second, proof, b"WrongRoot", r2)),
        ("wrong root2", probe(first, second, proof, r1, b"WrongRoot")),
        ("other root1", probe(first, second, proof, SOME_HASH, r2)),
        ("other root2", probe(first, second, proof, r1, SOME_HASH)),
        ("swapped roots", probe(first, second, proof, r2, r1)),
        ("empty proof", probe(first, second, [], r1, r2)),
        ("trailing garbage", probe(first, second, [*proof, b""], r1, r2)),
        ("trailing root1", probe(first, second, [*proof, r1], r1, r2)),
        ("trailing root2", probe(first, second, [*proof, r2], r1, r2)),
        ("preceding garbage", probe(first, second, [b"", *proof], r1, r2)),
        ("preceding root1", probe(first, second, [r1, *proof], r1, r2)),
        ("preceding root2", probe(first, second, [r2, *proof], r1, r2)),
        ("preceding proof[0]", probe(first, second, [proof[0], *proof], r1, r2)),
        ("truncated proof", probe(first, second, proof[:-1], r1, r2)),
    ]
    for pos in range(len(proof)):
        for byte, bit in ((0, 4), (0, 0), (31, 7)):
            wrong = flipped(proof, pos, byte, bit)
            probes.append((f"flip {pos}/{byte}/{bit}", probe(first, second, wrong, r1, r2)))
    return probes


@pytest.mark.parametrize(("index", "size", "proof"), INCLUSION_VECTORS)
def test_corrupted_inclusion_proofs_raise_proof_error(
    index: int, size: int, proof: list[str]
) -> None:
    wrongly_verified = []
    for desc, check in inclusion_probes(index, size, [h(p) for p in proof]):
        try:
            check()
        except ProofError:
            continue
        wrongly_verified.append(desc)
    assert wrongly_verified == []


@pytest.mark.parametrize(("first", "second", "proof"), CONSISTENCY_VECTORS[1:])
def test_corrupted_consistency_proofs_raise_proof_error(
    first: int, second: int, proof: list[str]
) -> None:
    wrongly_verified = []
    for desc, check in consistency_probes(first, second, [h(p) for p in proof]):
        try:
            check()
        except ProofError:
            continue
        wrongly_verified.append(desc)
    assert wrongly_verified == []


def test_inclusion_single_entry() -> None:
    # proof/verify_test.go TestVerifyInclusionSingleEntry: for one entry, leaf hash == root.
    value = leaf_hash(b"data")
    verify_inclusion(value, 0, 1, [], value)
    for root, leaf in ((value, b""), (b"", value), (b"", b"")):
        with pytest.raises(ProofError):
            verify_inclusion(leaf, 0, 1, [], root)


@pytest.mark.parametrize(("index", "size"), [(0, 0), (0, 1), (1, 0), (2, 1), (1, 1), (-1, 1)])
def test_inclusion_rejects_bad_index_or_root(index: int, size: int) -> None:
    # proof/verify_test.go TestVerifyInclusion probes: none of these may verify.
    for leaf, root in ((SOME_HASH, b""), (b"", EMPTY_ROOT), (SOME_HASH, EMPTY_ROOT)):
        with pytest.raises(ProofError):
            verify_inclusion(leaf, index, size, [], root)


@pytest.mark.parametrize(
    ("first", "second", "root1", "root2", "proof"),
    [
        # proof/verify_test.go TestVerifyConsistency, made strict: size 0 never verifies.
        (0, 0, EMPTY_ROOT, EMPTY_ROOT, []),
        (0, 1, EMPTY_ROOT, ROOTS[1], []),
        (0, 1, EMPTY_ROOT, EMPTY_ROOT, [EMPTY_ROOT]),
        (1, 0, ROOTS[1], EMPTY_ROOT, []),
        (2, 1, ROOTS[2], ROOTS[1], []),
        (1, 2, ROOTS[1], ROOTS[2], []),
        (1, 1, EMPTY_ROOT, ROOTS[1], []),
        (1, 1, ROOTS[1], ROOTS[1], [EMPTY_ROOT]),
        (1, 1, ROOTS[1], ROOTS[1], [b""]),
        (1, 1, ROOTS[1][:31], ROOTS[1][:31], []),
        (-1, 1, ROOTS[1], ROOTS[1], []),
    ],
)
def test_consistency_rejects_bad_sizes_and_equal_size_misuse(
    first: int, second: int, root1: bytes, root2: bytes, proof: list[bytes]
) -> None:
    with pytest.raises(ProofError):
        verify_consistency(first, second, proof, root1, root2)


def test_consistency_of_equal_sizes_needs_equal_roots_and_no_proof() -> None:
    verify_consistency(5, 5, [], ROOTS[5], ROOTS[5])


def _real_hashes() -> list[bytes]:
    nodes = [*store(64).values(), *store(37).values()]
    return nodes + [REF.mth(0, n) for n in range(MAX + 1)] + [OTHER.mth(0, n) for n in range(65)]


# Garbage of every length, plus 32-byte values; the second strategy also offers real node and
# root hashes, so it is only used where no proof can exist at all.
GARBAGE = st.one_of(st.binary(max_size=40), st.binary(min_size=HASH_SIZE, max_size=HASH_SIZE))
GARBAGE_OR_REAL = st.one_of(GARBAGE, st.sampled_from(_real_hashes()))
SIZES = st.integers(-3, MAX + 20)


def _root(ref: Reference, size: int) -> bytes:
    return ref.mth(0, min(max(size, 0), MAX))


@settings(max_examples=500, deadline=None)
@given(index=SIZES, size=SIZES, proof=st.lists(GARBAGE, max_size=12))
def test_garbage_inclusion_proofs_never_verify(index: int, size: int, proof: list[bytes]) -> None:
    if index == 0 and size == 1 and not proof:
        proof = [b""]  # a one-leaf tree's root is its leaf: an empty proof is genuinely valid
    leaf = REF.mth(index, index + 1) if 0 <= index < MAX else SOME_HASH
    with pytest.raises(ProofError):
        verify_inclusion(leaf, index, size, proof, _root(REF, size))


@settings(max_examples=500, deadline=None)
@given(index=SIZES, size=SIZES, proof=st.lists(GARBAGE_OR_REAL, max_size=12))
def test_no_inclusion_proof_verifies_a_leaf_that_is_not_there(
    index: int, size: int, proof: list[bytes]
) -> None:
    absent = hashlib.sha256(b"\x00" + b"not in any tree").digest()
    with pytest.raises(ProofError):
        verify_inclusion(absent, index, size, proof, _root(REF, size))


@settings(max_examples=500, deadline=None)
@given(first=SIZES, second=SIZES, proof=st.lists(GARBAGE_OR_REAL, max_size=12))
def test_no_consistency_proof_links_unrelated_trees(
    first: int, second: int, proof: list[bytes]
) -> None:
    with pytest.raises(ProofError):
        verify_consistency(first, second, proof, _root(REF, first), _root(OTHER, second))


@settings(max_examples=500, deadline=None)
@given(first=SIZES, second=SIZES, proof=st.lists(GARBAGE, max_size=12))
def test_garbage_consistency_proofs_never_verify(
    first: int, second: int, proof: list[bytes]
) -> None:
    if first == second and not proof:
        proof = [b""]  # an empty proof between equal trees is genuinely valid
    with pytest.raises(ProofError):
        verify_consistency(first, second, proof, _root(REF, first), _root(REF, second))
