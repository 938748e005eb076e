"""Fuzzing every verifier an auditor runs on bytes it was handed: Merkle proofs, exports, signed
notes and checkpoints, record headers.

``test_merkle.py`` checks the published vectors, a reference tree and corruptions of small
proofs. Here Hypothesis mutates real proofs of trees up to ``MAX`` leaves one way at a time (a
flipped bit anywhere, items truncated, extended, dropped, inserted, duplicated, swapped, taken
from another proof; the leaf, root, index or size changed, sizes up to 2**200) and checks one
exact rule: **a proof verifies if and only if it is the genuine proof of a true statement**, and
every failure is ``ProofError`` and nothing else. The same "only the documented error" rule is
applied to ``check_export`` (``ExportInvalid``), ``NoteVerifier`` and ``parse_checkpoint``
(``NoteError``) and ``parse_header`` / ``Sealed.from_leaf_data`` (``RecordFormatError``).

A size is always paired with its own root or with a random one: an RFC 9162 verifier trusts the
(size, root) pair of a signed tree head, and a proof for size ``n`` may legitimately verify
against ``root(n)`` under another size of the same shape.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.export import ExportInvalid, check_export
from audit.merkle import (
    EMPTY_ROOT,
    HASH_SIZE,
    CompactRange,
    NodeID,
    ProofError,
    assemble,
    consistency_plan,
    inclusion_plan,
    leaf_hash,
    root_from_inclusion_proof,
    verify_consistency,
    verify_inclusion,
)
from audit.note import Checkpoint, NoteError, NoteSigner, NoteVerifier, parse_checkpoint
from audit.record import RecordFormatError, Sealed, parse_header

MAX = 700  # leaves of the real tree; every prefix of it is a real tree too


@dataclass(frozen=True)
class Tree:
    records: list[Sealed]
    leaves: list[bytes]
    roots: list[bytes]  # roots[n]: the root of the first n leaves
    nodes: dict[NodeID, bytes]

    def inclusion(self, index: int, size: int) -> list[bytes]:
        return assemble(inclusion_plan(index, size), self.nodes)

    def consistency(self, first: int, second: int) -> list[bytes]:
        return assemble(consistency_plan(first, second), self.nodes)


@functools.cache
def tree(salt: bytes = b"") -> Tree:
    """Grown with ``CompactRange`` (checked against a reference tree by ``test_merkle.py``);
    every complete subtree of every prefix is in ``nodes``."""
    records = [Sealed(b'{"i":%d}' % i + salt, b"ciphertext %d" % i) for i in range(MAX)]
    leaves = [leaf_hash(record.leaf_data()) for record in records]
    compact, roots, nodes = CompactRange(), [EMPTY_ROOT], {}
    for leaf in leaves:
        nodes.update(compact.append(leaf))
        roots.append(compact.root())
    return Tree(records, leaves, roots, nodes)


REAL = tree()
OTHER = tree(b"other")  # an unrelated log: differs at every leaf
REAL_HASHES = [*REAL.leaves[:50], *REAL.roots[:50], *list(REAL.nodes.values())[:50],
               *OTHER.roots[:20]]  # fmt: skip
HASHES = st.binary(min_size=HASH_SIZE, max_size=HASH_SIZE) | st.sampled_from(REAL_HASHES)
GARBAGE_ITEMS = st.binary(max_size=40) | HASHES
HUGE = st.integers(-(2**70), 2**200)


def root_of(size: int, fallback: bytes) -> bytes:
    """The real root of ``size`` leaves, or ``fallback`` where no such tree exists here."""
    return REAL.roots[size] if 0 <= size <= MAX else fallback


# --- mutations -----------------------------------------------------------------------------------


def flip(value: bytes, byte: int, bit: int) -> bytes:
    if not value:
        return b"\x00"
    changed = bytearray(value)
    changed[byte % len(value)] ^= 1 << bit
    return bytes(changed)


@st.composite
def mutated_list(draw: st.DrawFn, proof: list[bytes]) -> list[bytes]:
    """``proof`` changed in one way (the result may, rarely, equal ``proof``)."""
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "drop", "insert", "duplicate",
                                 "swap", "replace", "reverse", "append", "empty"]))  # fmt: skip
    if not proof or kind in ("insert", "append"):
        item = draw(GARBAGE_ITEMS)
        position = draw(st.integers(0, len(proof)))
        return [*proof[:position], item, *proof[position:]]
    if kind == "empty":
        return []
    if kind == "reverse":
        return proof[::-1]
    i = draw(st.integers(0, len(proof) - 1))
    j = draw(st.integers(0, len(proof) - 1))
    changed = list(proof)
    if kind == "flip":
        changed[i] = flip(proof[i], draw(st.integers(0, HASH_SIZE - 1)), draw(st.integers(0, 7)))
    elif kind == "truncate":
        changed[i] = proof[i][: draw(st.integers(0, HASH_SIZE - 1))]
    elif kind == "extend":
        changed[i] = proof[i] + draw(st.binary(min_size=1, max_size=8))
    elif kind == "drop":
        del changed[i]
    elif kind == "duplicate":
        changed.insert(i, proof[i])
    elif kind == "swap":
        changed[i], changed[j] = proof[j], proof[i]
    else:
        changed[i] = draw(HASHES)
    return changed


@st.composite
def mutated_hash(draw: st.DrawFn, value: bytes) -> bytes:
    return draw(st.one_of(
        st.tuples(st.integers(0, HASH_SIZE - 1), st.integers(0, 7)).map(lambda p: flip(value, *p)),
        st.integers(0, HASH_SIZE - 1).map(lambda n: value[:n]),
        st.binary(min_size=1, max_size=4).map(lambda extra: value + extra),
        HASHES,
    ))  # fmt: skip


def mutated_size(value: int, limit: int) -> st.SearchStrategy[int]:
    near = st.integers(-3, 3).map(lambda delta: value + delta)
    return near | st.integers(0, limit) | HUGE | st.sampled_from([value * 2, value // 2, value ^ 2])


# --- inclusion -----------------------------------------------------------------------------------

Inclusion = tuple[bytes, int, int, list[bytes], bytes]


def genuine_inclusion(leaf: bytes, index: int, size: int, proof: list[bytes], root: bytes) -> bool:
    """The statement is true of the real tree and ``proof`` is its one proof; or it is about a
    one-leaf tree, whose root is its leaf (RFC 9162 §2.1.1), with the empty proof."""
    if (index, size, proof) == (0, 1, []) and leaf == root and len(root) == HASH_SIZE:
        return True
    return (
        0 <= index < size <= MAX
        and leaf == REAL.leaves[index]
        and root == REAL.roots[size]
        and proof == REAL.inclusion(index, size)
    )


def check_inclusion(case: Inclusion) -> None:
    leaf, index, size, proof, root = case
    if genuine_inclusion(*case):
        verify_inclusion(leaf, index, size, proof, root)
        return
    with pytest.raises(ProofError):
        verify_inclusion(leaf, index, size, proof, root)
    try:
        implied = root_from_inclusion_proof(leaf, index, size, proof)
    except ProofError:
        return
    assert len(implied) == HASH_SIZE and implied != root


@st.composite
def inclusion_cases(draw: st.DrawFn) -> Inclusion:
    size = draw(st.integers(1, MAX))
    index = draw(st.integers(0, size - 1))
    proof, leaf, root = REAL.inclusion(index, size), REAL.leaves[index], REAL.roots[size]
    what = draw(st.sampled_from(["proof", "leaf", "root", "index", "size", "other proof"]))
    if what == "proof":
        proof = draw(mutated_list(proof))
    elif what == "leaf":
        leaf = draw(st.sampled_from(REAL.leaves) | mutated_hash(leaf))
    elif what == "root":
        root = draw(st.sampled_from(REAL.roots) | mutated_hash(root))
    elif what == "index":
        index = draw(mutated_size(index, size - 1))
    elif what == "size":
        size = draw(mutated_size(size, MAX))
        root = root_of(size, draw(HASHES))
    else:  # another leaf's or another tree's proof, for this leaf
        other = draw(st.integers(0, size - 1))
        proof = draw(st.sampled_from([REAL.inclusion(other, size), OTHER.inclusion(index, size)]))
    return leaf, index, size, proof, root


@settings(max_examples=250, deadline=None)
@given(case=inclusion_cases())
def test_a_mutated_inclusion_proof_verifies_only_if_it_is_still_genuine(case: Inclusion) -> None:
    check_inclusion(case)


@st.composite
def huge_inclusion_cases(draw: st.DrawFn) -> Inclusion:
    """Any index and size; where a proof can exist, random hashes of exactly its length, so the
    check reaches the hashing loop (up to ~200 items for trees of 2**200 leaves)."""
    index, size = draw(HUGE), draw(HUGE)
    try:
        length = len(inclusion_plan(index, size))
    except ProofError:
        length = draw(st.integers(0, 12))
    proof = draw(st.lists(HASHES, min_size=length, max_size=length))
    return draw(HASHES), index, size, proof, root_of(size, draw(HASHES))


@settings(max_examples=100, deadline=None)
@given(case=huge_inclusion_cases())
def test_random_proofs_of_the_right_length_never_verify_at_any_size(case: Inclusion) -> None:
    check_inclusion(case)


@settings(max_examples=100, deadline=None)
@given(
    leaf=GARBAGE_ITEMS, index=HUGE | st.integers(-2, MAX), size=HUGE | st.integers(-2, MAX + 2),
    proof=st.lists(GARBAGE_ITEMS, max_size=12), root=GARBAGE_ITEMS,
)  # fmt: skip
def test_garbage_everywhere_raises_only_proof_error(
    leaf: bytes, index: int, size: int, proof: list[bytes], root: bytes
) -> None:
    check_inclusion((leaf, index, size, proof, root))
    check_consistency((index, size, proof, leaf, root))


# --- consistency ---------------------------------------------------------------------------------

Consistency = tuple[int, int, list[bytes], bytes, bytes]


def genuine_consistency(
    first: int, second: int, proof: list[bytes], first_root: bytes, second_root: bytes
) -> bool:
    """As for inclusion; any tree is consistent with itself, with the empty proof."""
    if first == second > 0 and proof == [] and first_root == second_root:
        return len(first_root) == HASH_SIZE
    return (
        0 < first <= second <= MAX
        and first_root == REAL.roots[first]
        and second_root == REAL.roots[second]
        and proof == REAL.consistency(first, second)
    )


def check_consistency(case: Consistency) -> None:
    if genuine_consistency(*case):
        verify_consistency(*case)
        return
    with pytest.raises(ProofError):
        verify_consistency(*case)


@st.composite
def consistency_cases(draw: st.DrawFn) -> Consistency:
    second = draw(st.integers(1, MAX))
    first = draw(st.integers(1, second))
    proof = REAL.consistency(first, second)
    roots = [REAL.roots[first], REAL.roots[second]]
    what = draw(st.sampled_from(["proof", "root", "first", "second", "swap", "other proof"]))
    if what == "proof":
        proof = draw(mutated_list(proof))
    elif what == "root":
        which = draw(st.integers(0, 1))
        roots[which] = draw(st.sampled_from(REAL.roots) | mutated_hash(roots[which]))
    elif what == "first":
        first = draw(mutated_size(first, second))
        roots[0] = root_of(first, draw(HASHES))
    elif what == "second":
        second = draw(mutated_size(second, MAX))
        roots[1] = root_of(second, draw(HASHES))
    elif what == "swap":
        roots.reverse()
    else:
        other_first = draw(st.integers(1, second))
        proof = draw(st.sampled_from([REAL.consistency(other_first, second),
                                      OTHER.consistency(first, second)]))  # fmt: skip
    return first, second, proof, roots[0], roots[1]


@settings(max_examples=250, deadline=None)
@given(case=consistency_cases())
def test_a_mutated_consistency_proof_verifies_only_if_it_is_still_genuine(
    case: Consistency,
) -> None:
    check_consistency(case)


@settings(max_examples=80, deadline=None)
@given(first=HUGE, second=HUGE, data=st.data())
def test_random_consistency_proofs_of_the_right_length_never_verify(
    first: int, second: int, data: st.DataObject
) -> None:
    try:
        length = len(consistency_plan(first, second))
    except ProofError:
        length = data.draw(st.integers(0, 12))
    proof = data.draw(st.lists(HASHES, min_size=length, max_size=length))
    roots = data.draw(st.tuples(HASHES, HASHES))
    check_consistency((first, second, proof, root_of(first, roots[0]), root_of(second, roots[1])))


# --- exports -------------------------------------------------------------------------------------

SIGNER = NoteSigner("thinkgate.test/fuzz", Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
VERIFIER = NoteVerifier(SIGNER.verifier_key())
EXPORT_SIZE = 37


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@functools.cache
def export(size: int = EXPORT_SIZE) -> tuple[bytes, ...]:
    """A genuine ``ledger export`` of the first ``size`` records (the format of audit/export)."""
    note = SIGNER.sign(Checkpoint(SIGNER.name, size, REAL.roots[size]).body())
    lines = [orjson.dumps({"checkpoint": note})]
    for index in range(size):
        record = REAL.records[index]
        hashes = [b64(h) for h in REAL.inclusion(index, size)]
        leaf = b64(REAL.leaves[index])
        line = {"index": index, "header": b64(record.header), "hashes": hashes,
                "ciphertext": b64(record.ciphertext), "leaf_hash": leaf}  # fmt: skip
        lines.append(orjson.dumps(line))
    return tuple(lines)


def checked_export(lines: list[bytes]) -> None:
    """``ExportInvalid``, or an export whose every record is a real one at its real index."""
    try:
        report = check_export(lines, VERIFIER)
    except ExportInvalid:
        return
    assert report.tree_size <= MAX
    for line in lines[1:]:
        if line.strip():
            raw = orjson.loads(line)
            record = REAL.records[raw["index"]]
            assert base64.b64decode(raw["header"]) == record.header
            assert base64.b64decode(raw["ciphertext"]) == record.ciphertext


def test_the_genuine_export_verifies() -> None:
    assert check_export(export(), VERIFIER).records == EXPORT_SIZE


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6,
)  # fmt: skip


@st.composite
def mutated_lines(draw: st.DrawFn) -> list[bytes]:
    lines = list(export())
    position = draw(st.integers(0, len(lines) - 1))
    line = lines[position]
    kind = draw(st.sampled_from(["bit", "field", "drop field", "swap lines", "garbage line"]))
    if kind == "bit":
        lines[position] = flip(line, draw(st.integers(0, len(line) - 1)), draw(st.integers(0, 7)))
    elif kind in ("field", "drop field"):
        raw = orjson.loads(line)
        name = draw(st.sampled_from(sorted(raw)))
        if kind == "field":
            raw[name] = draw(JSON | st.sampled_from([b64(h) for h in REAL_HASHES]))
        else:
            del raw[name]
        lines[position] = orjson.dumps(raw)
    elif kind == "swap lines":
        other = draw(st.integers(0, len(lines) - 1))
        lines[position], lines[other] = lines[other], lines[position]
    else:
        lines[position] = draw(st.binary(max_size=60) | JSON.map(orjson.dumps))
    return lines


@settings(max_examples=150, deadline=None)
@given(lines=mutated_lines())
def test_a_mutated_export_is_refused_or_still_only_holds_real_records(lines: list[bytes]) -> None:
    checked_export(lines)


@settings(max_examples=100, deadline=None)
@given(lines=st.lists(st.binary(max_size=40) | JSON.map(orjson.dumps), max_size=4))
def test_garbage_exports_raise_only_export_invalid(lines: list[bytes]) -> None:
    with pytest.raises(ExportInvalid):
        check_export(lines, VERIFIER)


# --- signed notes and checkpoints ----------------------------------------------------------------

ANY_TEXT = st.text(st.characters(codec=None) | st.characters(categories=["Cs"]), max_size=60)
NOTE_PIECES = st.sampled_from(["\n", "\n\n", "— ", SIGNER.name, " ", "+", "=", "AAAA", "\t",
                               SIGNER.verifier_key(), "0", "\u2014"])  # fmt: skip
NOTE_TEXT = ANY_TEXT | st.lists(NOTE_PIECES | ANY_TEXT, max_size=12).map("".join)
SIGNED = SIGNER.sign(Checkpoint(SIGNER.name, 5, REAL.roots[5], ("ext",)).body())


def only_note_error(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except NoteError:
        return None


@settings(max_examples=150, deadline=None)
@given(text=NOTE_TEXT)
def test_arbitrary_text_is_never_a_note_or_a_bad_key_and_only_note_error(text: str) -> None:
    assert only_note_error(lambda: VERIFIER.open(text)) is None
    only_note_error(lambda: NoteVerifier(text))


@settings(max_examples=100, deadline=None)
@given(text=NOTE_TEXT | st.sampled_from([SIGNED.split("\n\n")[0] + "\n"]))
def test_a_checkpoint_parses_only_from_its_one_canonical_text(text: str) -> None:
    checkpoint = only_note_error(lambda: parse_checkpoint(text))
    assert checkpoint is None or checkpoint.body() == text


@st.composite
def mutated_notes(draw: st.DrawFn) -> str:
    position = draw(st.integers(0, len(SIGNED) - 1))
    kind = draw(st.sampled_from(["replace", "insert", "delete"]))
    piece = draw(NOTE_PIECES | st.characters(codec=None))
    end = position + (kind != "insert")
    return SIGNED[:position] + ("" if kind == "delete" else piece) + SIGNED[end:]


@settings(max_examples=150, deadline=None)
@given(note=mutated_notes())
def test_a_mutated_note_never_opens_to_another_text(note: str) -> None:
    """A changed signature line may still decode to the same signature (base64's unused low
    bits), but the text a verifier returns is always the one that was signed."""
    text = only_note_error(lambda: VERIFIER.open(note))
    assert text is None or text == SIGNED.split("\n\n")[0] + "\n"
    if text is not None:
        assert parse_checkpoint(text).root == REAL.roots[5]


# --- record headers and leaf data ----------------------------------------------------------------

DEEP = [b"[" * 2000 + b"]" * 2000, b'{"a":' * 1100 + b"1" + b"}" * 1100]
NUMBERS = [b"1e308", b"-1e308", b"1e-400", b"18446744073709551616", b"-9223372036854775809"]


@st.composite
def header_bytes(draw: st.DrawFn) -> bytes:
    real = parse_header_source()
    kind = draw(st.sampled_from(["bit", "cut", "number", "deep", "garbage"]))
    if kind == "bit":
        return flip(real, draw(st.integers(0, len(real) - 1)), draw(st.integers(0, 7)))
    if kind == "cut":
        return real[: draw(st.integers(0, len(real)))]
    if kind == "number":
        field = draw(st.sampled_from([b'"sequence":7', b'"created_at":1.5']))
        name = field.split(b":")[0]
        return real.replace(field, name + b":" + draw(st.sampled_from(NUMBERS)))
    if kind == "deep":
        return draw(st.sampled_from(DEEP))
    return draw(st.binary(max_size=80))


@functools.cache
def parse_header_source() -> bytes:
    """A real header as the ledger writes it (sorted keys, compact)."""
    fields = {"v": 1, "origin": "o", "writer": "w", "sequence": 7, "dek": "d",
              "salt": b64(b"s" * 16), "commitment": b64(b"c" * 32), "kind": "completion",
              "tenant": "acme", "key_id": "k", "request_id": "r", "created_at": 1.5}  # fmt: skip
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)


@settings(max_examples=150, deadline=None)
@given(data=header_bytes())
def test_damaged_headers_raise_only_record_format_error(data: bytes) -> None:
    try:
        header = parse_header(data)
    except RecordFormatError:
        return
    assert isinstance(header.sequence, int) and isinstance(header.created_at, float)


@settings(max_examples=150, deadline=None)
@given(position=st.integers(0, 200), byte=st.integers(0, 255), cut=st.integers(0, 300))
def test_damaged_leaf_data_raises_only_record_format_error(
    position: int, byte: int, cut: int
) -> None:
    data = bytearray(Sealed(parse_header_source(), b"ciphertext").leaf_data())
    data[position % len(data)] = byte
    try:
        sealed = Sealed.from_leaf_data(bytes(data[:cut]))
    except RecordFormatError:
        return
    assert sealed.leaf_data() == bytes(data[:cut])
