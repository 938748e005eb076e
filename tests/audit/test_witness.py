"""C2SP tlog-cosignature and the witness's decisions (``audit.witness``): signatures that
verify only as they were made, and each answer the spec prescribes."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import merkle
from audit.note import Checkpoint, NoteSigner, NoteVerifier
from audit.witness import (
    AddCheckpoint,
    Cosigner,
    CosignerKey,
    WitnessError,
    WitnessPolicy,
    add_checkpoint_body,
    decide,
    parse_add_checkpoint,
)

ORIGIN = "example.com/log"
LOG = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
LOGS = {ORIGIN: NoteVerifier(LOG.verifier_key())}
LEAVES = [merkle.leaf_hash(bytes([i])) for i in range(8)]


NODES = {merkle.NodeID(0, i): h for i, h in enumerate(LEAVES)}  # every complete subtree
for level in range(1, 4):
    for i in range(8 >> level):
        NODES[merkle.NodeID(level, i)] = merkle.node_hash(
            NODES[merkle.NodeID(level - 1, 2 * i)], NODES[merkle.NodeID(level - 1, 2 * i + 1)]
        )


def mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 §2.1.1, as written."""
    if len(leaves) == 1:
        return leaves[0]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return merkle.node_hash(mth(leaves[:k]), mth(leaves[k:]))


def root(size: int) -> bytes:
    return mth(LEAVES[:size])


def signed(size: int, at: bytes | None = None) -> str:
    return LOG.sign(Checkpoint(ORIGIN, size, root(size) if at is None else at).body())


def proof(first: int, second: int) -> tuple[bytes, ...]:
    return tuple(merkle.assemble(merkle.consistency_plan(first, second), NODES))


def test_a_cosignature_verifies_only_over_what_it_signed() -> None:
    witness = Cosigner("witness.example/w1", Ed25519PrivateKey.generate())
    key = CosignerKey.parse(witness.verifier_key)
    body = Checkpoint(ORIGIN, 5, root(5)).body()
    line = witness.cosign(body, 1_700_000_000)
    assert key.timestamp(body, line) == 1_700_000_000
    assert witness.verifier_key.split("+")[1] == key.key_id.hex()
    assert base64.b64decode(witness.verifier_key.split("+", 2)[2])[0] == 4  # cosignature/v1
    assert key.timestamp(Checkpoint(ORIGIN, 6, root(6)).body(), line) is None  # another one
    raw = bytearray(base64.b64decode(line.split(" ")[2]))
    raw[11] ^= 1  # the timestamp is signed too
    assert key.timestamp(body, f"— witness.example/w1 {base64.b64encode(raw).decode()}\n") is None
    other = CosignerKey.parse(Cosigner("witness.example/w1", Ed25519PrivateKey.generate())
                              .verifier_key)  # fmt: skip
    assert other.timestamp(body, line) is None  # same name, another key


@pytest.mark.parametrize(
    "vkey",
    ["nope", "w+00000000+AQ==", "w+zz+" + "A" * 44, LOG.verifier_key()],
    ids=["not-a-key", "short", "bad-id", "a-log-key"],
)
def test_only_ed25519_cosigner_keys_parse(vkey: str) -> None:
    with pytest.raises(WitnessError):
        CosignerKey.parse(vkey)  # the log's own key is type 0x01, not a cosigner's


def test_a_policy_counts_distinct_trusted_cosigners() -> None:
    w1, w2, w3 = (Cosigner(f"w{i}", Ed25519PrivateKey.generate()) for i in (1, 2, 3))
    note = signed(4)
    body = note.split("\n\n")[0] + "\n"
    cosigned = note + w1.cosign(body, 1) + w1.cosign(body, 2) + w3.cosign(body, 3)
    keys = tuple(CosignerKey.parse(w.verifier_key) for w in (w1, w2))
    assert WitnessPolicy(keys, 1).check(cosigned) == ["w1"]
    with pytest.raises(WitnessError, match="1 valid cosignatures of 2 required"):
        WitnessPolicy(keys, 2).check(cosigned)  # w1 twice is one; w3 is not trusted


def test_add_checkpoint_bodies_round_trip_and_refuse_junk() -> None:
    body = add_checkpoint_body(3, proof(3, 7), signed(7))
    assert parse_add_checkpoint(body) == AddCheckpoint(3, proof(3, 7), signed(7))
    for junk in (b"old 03\n\n" + signed(7).encode(), b"old 3\n" + signed(7).encode(),
                 b"old 3\nnot base64!\n\n" + signed(7).encode(),
                 b"old 3\n" + b"AAAA\n\n" + signed(7).encode(), b"\xff",
                 b"old 3\n" + (base64.b64encode(bytes(32)) + b"\n") * 64 + b"\n"):  # fmt: skip
        with pytest.raises(WitnessError):
            parse_add_checkpoint(junk)


def test_the_witness_answers_as_the_spec_says() -> None:
    first = decide(AddCheckpoint(0, (), signed(3)), LOGS, None)
    assert first.status == 200 and first.checkpoint is not None and first.checkpoint.size == 3
    assert decide(AddCheckpoint(3, proof(3, 7), signed(7)), LOGS, (3, root(3))).status == 200
    assert decide(AddCheckpoint(3, (), signed(3)), LOGS, (3, root(3))).status == 200  # again
    stale = decide(AddCheckpoint(2, proof(2, 7), signed(7)), LOGS, (3, root(3)))
    assert (stale.status, stale.body) == (409, "3\n")
    fork = decide(AddCheckpoint(3, (), signed(3, bytes(32))), LOGS, (3, root(3)))
    assert (fork.status, fork.body) == (409, "3\n")  # two checkpoints of one size
    bad = decide(AddCheckpoint(3, proof(3, 7), signed(7, bytes(32))), LOGS, (3, root(3)))
    assert bad.status == 422  # a history that does not extend the cosigned one
    assert decide(AddCheckpoint(0, proof(3, 7), signed(7)), LOGS, None).status == 422
    assert decide(AddCheckpoint(8, (), signed(7)), LOGS, (3, root(3))).status == 400
    stranger = NoteSigner("other.example/log", Ed25519PrivateKey.generate())
    unknown = stranger.sign(Checkpoint("other.example/log", 1, root(1)).body())
    assert decide(AddCheckpoint(0, (), unknown), LOGS, None).status == 404
    impostor = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    forged = impostor.sign(Checkpoint(ORIGIN, 3, root(3)).body())
    assert decide(AddCheckpoint(0, (), forged), LOGS, None).status == 403
