"""RFC 9162 Merkle tree math: hashes, the compact range, proof plans and strict verification.

Pure: data in, data out, only :mod:`hashlib`. No I/O, no clocks, nothing happens at import.

The tree (RFC 9162 §2.1.1): ``MTH({}) = SHA-256()``, ``MTH({d}) = SHA-256(0x00 || d)`` and, for
``n > 1`` with ``k`` the largest power of two below ``n``,
``MTH(D[n]) = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))``. Equivalently: lay the leaves out
under a perfect binary tree and collapse every node whose right child lies wholly past the end.

Rules and invariants:

* Everything here works on *leaf hashes*, never entries: the caller hashes an entry once with
  :func:`leaf_hash`. Every hash is exactly ``HASH_SIZE`` bytes.
* ``NodeID(level, index)`` names the *complete* subtree of ``2**level`` leaves
  ``[index << level, (index + 1) << level)``. In a tree of ``n`` leaves it exists iff its end is
  ``<= n``, and from then on its hash never changes (the log is append-only). So storage writes
  each complete subtree once and never updates it; :meth:`CompactRange.append` reports exactly
  these, each exactly once over the life of a log.
* Nodes on the right edge whose range is not complete are *ephemeral*: never stored, always
  recomputed from the complete subtrees covering their range (a ``Range``, folded right to
  left). So every hash a proof needs is a complete subtree that ``append`` already reported.
* Proof generation is two-phase (plan, then :func:`assemble`) so that storage can fetch every
  hash a proof needs in one query. Plans list proof items in RFC 9162 order, lowest level first.
* Verification is strict, like transparency-dev/merkle ``proof/verify.go``: hash lengths, index
  and sizes are checked and the proof must have exactly the expected length. Any failure, on
  any input of the declared types, raises :class:`ProofError` and nothing else.
* Roots are public values, so they are compared with ``==``: timing reveals no secret.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from audit.errors import AuditError

HASH_SIZE = 32
# RFC 9162 §2.1.1: the hash of an empty list is the hash of an empty string.
EMPTY_ROOT: bytes = hashlib.sha256(b"").digest()


class ProofError(AuditError, ValueError):
    """The one error of this module: a proof does not verify, or the API was misused.

    Bad sizes or indexes, hashes of the wrong length, a proof of the wrong length, a mismatch
    against a root, a missing hash while assembling: all raise this, and nothing else.
    """


def leaf_hash(data: bytes) -> bytes:
    """``SHA-256(0x00 || data)``; the 0x00/0x01 prefixes keep leaves and nodes apart (§2.1.1)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``, the hash of an interior node (RFC 9162 §2.1.1)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


@dataclass(frozen=True, slots=True, order=True)
class NodeID:
    """A complete subtree: leaves [index << level, (index + 1) << level).

    Orders by level, then index. Negative fields raise :class:`ProofError`.
    """

    level: int
    index: int

    def __post_init__(self) -> None:
        if self.level < 0 or self.index < 0:
            raise ProofError(f"bad node id: level {self.level}, index {self.index}")

    @property
    def begin(self) -> int:
        """The first leaf under this node."""
        return self.index << self.level

    @property
    def end(self) -> int:
        """One past the last leaf under this node."""
        return (self.index + 1) << self.level


Range: TypeAlias = tuple[NodeID, ...]
"""One proof item: the complete subtrees that make up its range, left to right."""


def _check_hash(value: bytes, what: str) -> None:
    if len(value) != HASH_SIZE:
        raise ProofError(f"{what} is {len(value)} bytes, want {HASH_SIZE}")


def _fold(hashes: Sequence[bytes]) -> bytes:
    """The hash of adjacent complete subtrees, given left to right with non-increasing sizes.

    MTH splits off the largest power of two first (§2.1.1), so the rightmost pair joins first.
    """
    value = hashes[-1]
    for left in reversed(hashes[:-1]):
        value = node_hash(left, value)
    return value


def range_plan(begin: int, end: int) -> Range:
    """The fewest complete subtrees that make up ``[begin, end)``, left to right.

    Greedy: take the largest subtree that starts at ``begin`` (aligned: ``begin`` is a multiple
    of its size) and ends at or before ``end``, then repeat from its end.
    """
    if not 0 <= begin <= end:
        raise ProofError(f"bad range [{begin}, {end})")
    nodes: list[NodeID] = []
    while begin < end:
        level = (end - begin).bit_length() - 1
        if begin:
            level = min(level, (begin & -begin).bit_length() - 1)
        nodes.append(NodeID(level, begin >> level))
        begin += 1 << level
    return tuple(nodes)


def frontier(size: int) -> list[NodeID]:
    """The complete subtrees that make up ``[0, size)``, largest first: one per set bit."""
    return list(range_plan(0, size))


class CompactRange:
    """The right frontier of a tree (its complete subtrees' hashes), enough to append and to
    compute the root. Mutable, small (<= 64 hashes for any 64-bit size)."""

    __slots__ = ("_hashes", "_size")

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        expected = len(frontier(size))
        if len(hashes) != expected:
            raise ProofError(f"a tree of {size} needs {expected} frontier hashes")
        for value in hashes:
            _check_hash(value, "frontier hash")
        self._size = size
        self._hashes = [bytes(value) for value in hashes]

    def __repr__(self) -> str:
        return f"CompactRange(size={self._size})"

    @property
    def size(self) -> int:
        """The number of leaves so far."""
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        """The hashes of ``frontier(size)``, in the same order."""
        return tuple(self._hashes)

    def append(self, leaf: bytes) -> list[tuple[NodeID, bytes]]:
        """Append one leaf hash; return the complete subtrees it completes, lowest level first.

        The leaf itself comes first. Each time the new node is a right child it completes its
        parent, whose left child is the frontier's last (lowest) subtree: as many merges as
        ``size`` has trailing one bits.
        """
        _check_hash(leaf, "leaf hash")
        node, value = NodeID(0, self._size), bytes(leaf)
        completed = [(node, value)]
        while node.index & 1:
            value = node_hash(self._hashes.pop(), value)
            node = NodeID(node.level + 1, node.index >> 1)
            completed.append((node, value))
        self._hashes.append(value)
        self._size += 1
        return completed

    def root(self) -> bytes:
        """RFC 9162 MTH of the current tree; ``EMPTY_ROOT`` when it is empty."""
        return _fold(self._hashes) if self._hashes else EMPTY_ROOT


def _path(node: NodeID, size: int) -> list[Range]:
    """What proves the complete ``node`` is in the tree of ``size`` leaves, lowest first.

    The ``fork`` is the highest complete ancestor of ``node`` (maybe ``node`` itself). Below it
    every sibling is complete; its right sibling is ephemeral (``[fork.end, size)``, maybe
    empty); above it, every ancestor with a sibling has it on the left, and those siblings are
    the complete subtrees of ``[0, fork.begin)``. Mirrors transparency-dev ``proof.nodes``.
    """
    inner = (node.index ^ (size >> node.level)).bit_length() - 1
    fork = NodeID(node.level + inner, node.index >> inner)
    plan: list[Range] = [(NodeID(node.level + i, (node.index >> i) ^ 1),) for i in range(inner)]
    if ephemeral := range_plan(fork.end, size):
        plan.append(ephemeral)
    plan.extend((left,) for left in reversed(range_plan(0, fork.begin)))
    return plan


def inclusion_plan(index: int, size: int) -> list[Range]:
    """The plan of RFC 9162 §2.1.3.1 ``PATH(index, D[size])``. Requires ``0 <= index < size``."""
    if not 0 <= index < size:
        raise ProofError(f"no leaf {index} in a tree of {size}")
    return _path(NodeID(0, index), size)


def consistency_plan(first: int, second: int) -> list[Range]:
    """The plan of RFC 9162 §2.1.4.1 ``PROOF(first, D[second])``. Requires
    ``0 < first <= second``; equal sizes need no proof."""
    if not 0 < first <= second:
        raise ProofError(f"no consistency proof from {first} to {second}")
    if first == second:
        return []
    # SUBPROOF descends the first tree's right edge to its last complete subtree, and proves
    # that subtree is in the second tree. The verifier knows it already (SUBPROOF with b = true)
    # only when it is the whole first tree, i.e. when first is a power of two.
    node = frontier(first)[-1]
    plan = _path(node, second)
    return plan if node.begin == 0 else [(node,), *plan]


def plan_nodes(plan: Sequence[Range]) -> set[NodeID]:
    """Every complete subtree whose hash ``assemble`` will need."""
    return {node for nodes in plan for node in nodes}


def assemble(plan: Sequence[Range], hashes: Mapping[NodeID, bytes]) -> list[bytes]:
    """The proof, in RFC 9162 order: one hash per range, ephemeral ranges folded."""
    proof = []
    for nodes in plan:
        if not nodes:
            raise ProofError("empty range in plan")
        proof.append(_fold([_fetch(hashes, node) for node in nodes]))
    return proof


def _fetch(hashes: Mapping[NodeID, bytes], node: NodeID) -> bytes:
    value = hashes.get(node)
    if value is None:
        raise ProofError(f"no hash for {node}")
    _check_hash(value, f"hash of {node}")
    return value


def _check_proof(proof: Sequence[bytes], expected: int) -> None:
    if len(proof) != expected:
        raise ProofError(f"proof has {len(proof)} hashes, want {expected}")
    for value in proof:
        _check_hash(value, "proof hash")


def _inclusion_shape(index: int, size: int) -> tuple[int, int]:
    """(inner, border) proof lengths, split where the paths to ``index`` and ``size - 1``
    part (transparency-dev ``decompInclProof``)."""
    inner = (index ^ (size - 1)).bit_length()
    return inner, (index >> inner).bit_count()


def _consistency_length(first: int, second: int) -> int:
    """Exact proof length for ``0 < first < second`` (transparency-dev ``verify.go``)."""
    inner, border = _inclusion_shape(first - 1, second)
    shift = (first & -first).bit_length() - 1
    seed = 0 if first == 1 << shift else 1
    return seed + inner - shift + border


def _shift_to_odd(fn: int, sn: int) -> tuple[int, int]:
    """Right-shift both until LSB(fn) is set or fn is 0 (§2.1.3.2 step 4b, §2.1.4.2 step 6b)."""
    while fn and not fn & 1:
        fn, sn = fn >> 1, sn >> 1
    return fn, sn


def root_from_inclusion_proof(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` implies for ``leaf`` at ``index`` in a tree of ``size``."""
    _check_hash(leaf, "leaf hash")
    if not 0 <= index < size:  # RFC 9162 §2.1.3.2 step 1
        raise ProofError(f"no leaf {index} in a tree of {size}")
    _check_proof(proof, sum(_inclusion_shape(index, size)))
    fn, sn, r = index, size - 1, bytes(leaf)  # steps 2 and 3
    for p in proof:  # step 4
        if sn == 0:  # 4a; unreachable once the length is checked, kept as the RFC says
            raise ProofError("inclusion proof too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            fn, sn = _shift_to_odd(fn, sn)
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:  # step 5
        raise ProofError("inclusion proof too short")
    return r


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that ``leaf`` is at ``index`` in the tree of ``size`` with ``root`` (§2.1.3.2)."""
    _check_hash(root, "root")
    if root_from_inclusion_proof(leaf, index, size, proof) != root:
        raise ProofError("inclusion proof does not match the root")


def _consistency_roots(
    first: int, second: int, proof: Sequence[bytes], first_root: bytes
) -> tuple[bytes, bytes]:
    """RFC 9162 §2.1.4.2 steps 2-7: the (first, second) roots the proof implies."""
    path = [first_root, *proof] if first & (first - 1) == 0 else list(proof)  # step 2
    fn, sn = first - 1, second - 1  # step 3
    while fn & 1:  # step 4
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]  # step 5
    for c in path[1:]:  # step 6
        if sn == 0:  # 6a; unreachable once the length is checked, kept as the RFC says
            raise ProofError("consistency proof too long")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            fn, sn = _shift_to_odd(fn, sn)
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:  # step 7
        raise ProofError("consistency proof too short")
    return fr, sr


def verify_consistency(
    first: int, second: int, proof: Sequence[bytes], first_root: bytes, second_root: bytes
) -> None:
    """Check that the tree of ``first`` leaves is a prefix of the tree of ``second`` (§2.1.4.2)."""
    _check_hash(first_root, "first root")
    _check_hash(second_root, "second root")
    if first > second:
        raise ProofError(f"first size {first} > second size {second}")
    if first <= 0:
        raise ProofError(f"no consistency proof from size {first}")
    if first == second:
        _check_proof(proof, 0)
        if first_root != second_root:
            raise ProofError("equal sizes with different roots")
        return
    # Step 1 (an empty proof fails) is covered: the expected length is at least 1 here.
    _check_proof(proof, _consistency_length(first, second))
    if _consistency_roots(first, second, proof, first_root) != (first_root, second_root):
        raise ProofError("consistency proof does not match the roots")
