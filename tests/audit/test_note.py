"""Signed notes and checkpoints against the published vectors of Go's sumdb/note and C2SP.

The PeterNeumann and EnochRoot keys, notes and signatures are the public test vectors of
golang.org/x/mod/sumdb/note (note_test.go); every other key is generated at run time.
"""

from __future__ import annotations

import base64
import hashlib
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from audit.note import (
    Checkpoint,
    NoteError,
    NoteSigner,
    NoteVerifier,
    create_signing_key,
    load_signing_key,
    parse_checkpoint,
)

# golang.org/x/mod/sumdb/note, note_test.go (TestNewVerifier, TestSign, TestOpen).
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
PETER_SIG = (
    "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotp"
    "RZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIG = (
    "— EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33"
    "WWd1RvMc+QQ=\n"
)
# c2sp.org/tlog-checkpoint, the example checkpoint's body.
C2SP_CHECKPOINT = (
    "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
)


def peter() -> NoteSigner:
    encoded = PETER_SKEY.split("+", 4)[4]
    seed = base64.b64decode(encoded)[1:]  # after the 0x01 algorithm byte
    return NoteSigner("PeterNeumann", Ed25519PrivateKey.from_private_bytes(seed))


def vkey_for(name: str, typed_key: bytes) -> str:
    """A verifier key string with a correct key ID, whatever the name and key bytes."""
    key_id = hashlib.sha256(name.encode() + b"\n" + typed_key).digest()[:4].hex()
    return f"{name}+{key_id}+{base64.b64encode(typed_key).decode()}"


# --- published vectors --------------------------------------------------------------------------


def test_signer_reproduces_the_published_keys_and_signature() -> None:
    signer = peter()
    assert signer.name == "PeterNeumann" and signer.key_hash == 0xC74F20A3
    assert signer.verifier_key() == PETER_VKEY
    assert signer.sign(TEXT) == TEXT + "\n" + PETER_SIG  # Ed25519 is deterministic


def test_verifier_opens_the_published_notes() -> None:
    verifier = NoteVerifier(PETER_VKEY)
    assert verifier.name == "PeterNeumann" and verifier.key_hash == 0xC74F20A3
    assert verifier.open(TEXT + "\n" + PETER_SIG) == TEXT
    enoch = NoteVerifier(ENOCH_VKEY)
    assert enoch.name == "EnochRoot" and enoch.key_hash == 0xAF0CFE78
    assert enoch.open(TEXT + "\n" + PETER_SIG + ENOCH_SIG) == TEXT  # signed by Go, not by us


def test_other_keys_lines_are_ignored_and_repeats_skipped() -> None:
    verifier = NoteVerifier(PETER_VKEY)
    assert verifier.open(TEXT + "\n" + PETER_SIG + ENOCH_SIG) == TEXT
    enoch_abcd = ENOCH_SIG[:60] + "ABCD" + ENOCH_SIG[60:]
    note = TEXT + "\n" + PETER_SIG + PETER_SIG + ENOCH_SIG + ENOCH_SIG + enoch_abcd
    assert verifier.open(note) == TEXT  # Go: "Duplicated verified and unverified signatures"


def test_a_note_without_this_keys_line_is_rejected() -> None:
    verifier = NoteVerifier(PETER_VKEY)
    with pytest.raises(NoteError, match="no signature by key PeterNeumann\\+c74f20a3"):
        verifier.open(TEXT + "\n" + ENOCH_SIG)
    misnamed = PETER_SIG.replace("PeterNeumann", "CarmenSandiego")
    wrong_hash = PETER_SIG.replace("x08g", "xxxx")  # same name, another key ID: not our key
    for note in (misnamed, wrong_hash):
        with pytest.raises(NoteError, match="no signature"):
            verifier.open(TEXT + "\n" + note)


def test_an_invalid_signature_by_this_key_rejects_the_note() -> None:
    verifier = NoteVerifier(PETER_VKEY)
    longer = PETER_SIG[:60] + "ABCD" + PETER_SIG[60:]
    swapped = PETER_SIG[:40] + ("A" if PETER_SIG[40] != "A" else "B") + PETER_SIG[41:]
    for line in (longer, swapped):
        with pytest.raises(NoteError, match="invalid signature for key PeterNeumann\\+c74f20a3"):
            verifier.open(TEXT + "\n" + line + ENOCH_SIG)
    with pytest.raises(NoteError, match="invalid signature"):
        verifier.open(TEXT.replace("problem,", "problem;") + "\n" + PETER_SIG)


def test_signature_count_limit() -> None:
    verifier = NoteVerifier(PETER_VKEY)
    assert verifier.open(TEXT + "\n" + PETER_SIG * 100) == TEXT
    with pytest.raises(NoteError, match="more than 100 signatures"):
        verifier.open(TEXT + "\n" + PETER_SIG * 101)


@pytest.mark.parametrize(
    "note",
    [  # Go's TestOpen "badMsgs", then a few more
        TEXT,
        TEXT + "\n",
        TEXT + "\n" + PETER_SIG[:-1],
        "\x01" + TEXT + "\n" + PETER_SIG,
        "\udcff" + TEXT + "\n" + PETER_SIG,  # Python's spelling of the invalid UTF-8 byte 0xff
        TEXT
        + "\n"
        + "— Bad Name x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvq"
        "fqdngotpRZb6KE6RyyBwJnAM=",
        TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
        TEXT + "\n" + PETER_SIG.replace("— ", "- "),
        TEXT + "\n" + PETER_SIG.replace("— ", "—"),
        TEXT + "\n" + PETER_SIG.replace("=\n", "\n"),  # base64 padding is required
        TEXT + "\n" + PETER_SIG.replace("=\n", "=\r\n"),
        TEXT + "\n" + "— PeterNeumann\n",
        TEXT + "\n" + "— PeterNeumann AAAAAA==\n",  # shorter than key ID + 1 byte
        TEXT + "\n" + PETER_SIG + "\n",
        TEXT.replace("\n", "\t", 1) + "\n" + PETER_SIG,
    ],
)
def test_malformed_notes_are_rejected(note: str) -> None:
    with pytest.raises(NoteError, match=r"malformed|control character|UTF-8|invalid key name"):
        NoteVerifier(PETER_VKEY).open(note)


def test_verifier_key_manglings_are_rejected() -> None:
    # Go's TestNewVerifier: every proper substring and every single-byte increment fails.
    for start in range(len(PETER_VKEY) + 1):
        for end in range(start + 1, len(PETER_VKEY) + 1):
            if (start, end) != (0, len(PETER_VKEY)):
                with pytest.raises(NoteError):
                    NoteVerifier(PETER_VKEY[start:end])
    for index, char in enumerate(PETER_VKEY):
        with pytest.raises(NoteError):
            NoteVerifier(PETER_VKEY[:index] + chr(ord(char) + 1) + PETER_VKEY[index + 1 :])


@pytest.mark.parametrize(
    ("vkey", "message"),
    [  # the first two are Go's, with key IDs adjusted to the mangled keys
        (
            "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
            "not an Ed25519 key",
        ),
        ("PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", "not an Ed25519"),
        (PETER_VKEY.replace("c74f20a3", "c74f20a4"), "key ID does not match"),
        (PETER_VKEY.replace("c74f20a3", "0xc74f20"), "malformed"),
        (PETER_VKEY.replace("c74f20a3", " c74f20a"), "malformed"),
        (PETER_VKEY.replace("c74f20a3", "c74f20a3a"), "malformed"),
        (vkey_for("Peter Neumann", b"\x01" + bytes(32)), "invalid key name"),
        (vkey_for("Peter\u00a0Neumann", b"\x01" + bytes(32)), "invalid key name"),
        (vkey_for("", b"\x01" + bytes(32)), "invalid key name"),
        (vkey_for("PeterNeumann", b"\x02" + bytes(32)), "not an Ed25519 key"),
        (vkey_for("PeterNeumann", b"\x01" + bytes(31)), "not an Ed25519 key"),
        ("PeterNeumann+c74f20a3+", "malformed"),
        ("Peter+Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW", "malformed"),
    ],
)
def test_bad_verifier_keys(vkey: str, message: str) -> None:
    with pytest.raises(NoteError, match=message):
        NoteVerifier(vkey)


# --- signing with generated keys ----------------------------------------------------------------


def test_sign_open_roundtrip_with_a_generated_key() -> None:
    signer = NoteSigner("example.com/ledger", Ed25519PrivateKey.generate())
    verifier = NoteVerifier(signer.verifier_key())
    assert (verifier.name, verifier.key_hash) == (signer.name, signer.key_hash)
    for text in (TEXT, "\n", "a\n\nb\n", "a\n\n\n", "ünïcödé — ok\n"):
        assert verifier.open(signer.sign(text)) == text
    assert verifier.open(signer.sign(TEXT) + ENOCH_SIG) == TEXT


@given(
    text=st.text(
        alphabet=st.one_of(st.just("\n"), st.characters(min_codepoint=0x20, codec="utf-8"))
    )
)
def test_sign_open_property(text: str) -> None:
    signer = peter()
    assert NoteVerifier(PETER_VKEY).open(signer.sign(text + "\n")) == text + "\n"


def test_another_key_under_the_same_name_does_not_verify() -> None:
    signer = NoteSigner("PeterNeumann", Ed25519PrivateKey.generate())
    with pytest.raises(NoteError, match="no signature by key"):
        NoteVerifier(PETER_VKEY).open(signer.sign(TEXT))
    # A forged line: Peter's name and key ID, another key's valid signature of the text.
    raw = base64.b64decode(signer.sign(TEXT).rsplit(" ", 1)[1].strip())
    forged = base64.b64encode(bytes.fromhex("c74f20a3") + raw[4:]).decode()
    with pytest.raises(NoteError, match="invalid signature"):
        NoteVerifier(PETER_VKEY).open(f"{TEXT}\n— PeterNeumann {forged}\n")


@pytest.mark.parametrize("text", ["", "no final newline", "tab\there\n", "cr\r\n", "\ud800\n"])
def test_sign_refuses_malformed_text(text: str) -> None:
    with pytest.raises(NoteError):
        peter().sign(text)


@pytest.mark.parametrize(
    "name", ["", "Peter+Neumann", "Peter Neumann", "Peter\tNeumann", "a\u2003b"]
)
def test_signer_refuses_bad_names(name: str) -> None:
    with pytest.raises(NoteError, match="invalid key name"):
        NoteSigner(name, Ed25519PrivateKey.generate())


def test_reprs_show_only_public_parts() -> None:
    signer = peter()
    assert repr(signer) == f"NoteSigner({PETER_VKEY!r})"
    assert (
        repr(NoteVerifier(PETER_VKEY)) == "NoteVerifier(name='PeterNeumann', key_hash=0xc74f20a3)"
    )


# --- checkpoints --------------------------------------------------------------------------------


def test_the_c2sp_example_checkpoint_parses() -> None:
    checkpoint = parse_checkpoint(C2SP_CHECKPOINT)
    assert checkpoint.origin == "example.com/behind-the-sofa"
    assert checkpoint.size == 20852163
    assert checkpoint.root == base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
    assert checkpoint.extensions == ()
    assert checkpoint.body() == C2SP_CHECKPOINT


@pytest.mark.parametrize(
    "checkpoint",
    [
        Checkpoint("example.com/ledger", 0, bytes(32)),
        Checkpoint("example.com/ledger", 2**64 - 1, bytes(range(32))),
        Checkpoint("o", 7, bytes(32), ("ext one", "— ext two")),
    ],
)
def test_checkpoint_roundtrip(checkpoint: Checkpoint) -> None:
    body = checkpoint.body()
    assert body.endswith("\n") and body.count("\n") == 3 + len(checkpoint.extensions)
    assert parse_checkpoint(body) == checkpoint


def test_checkpoint_body_format() -> None:
    root = bytes(range(32))
    expected = f"example.com/ledger\n42\n{base64.b64encode(root).decode()}\n"
    assert Checkpoint("example.com/ledger", 42, root).body() == expected


def test_signed_checkpoint_end_to_end() -> None:
    signer = NoteSigner("example.com/ledger", Ed25519PrivateKey.generate())
    checkpoint = Checkpoint("example.com/ledger", 3, bytes(range(32)))
    note = signer.sign(checkpoint.body())
    assert parse_checkpoint(NoteVerifier(signer.verifier_key()).open(note)) == checkpoint


ROOT = "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I="


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "origin\n1\n",
        f"origin\n1\n{ROOT}",  # no final newline
        f"\n1\n{ROOT}\n",  # empty origin
        f"origin\n01\n{ROOT}\n",
        f"origin\n00\n{ROOT}\n",
        f"origin\n-1\n{ROOT}\n",
        f"origin\n+1\n{ROOT}\n",
        f"origin\n 1\n{ROOT}\n",
        f"origin\n1 \n{ROOT}\n",
        f"origin\n1.0\n{ROOT}\n",
        f"origin\n1_000\n{ROOT}\n",
        f"origin\n\u0661\n{ROOT}\n",  # ARABIC-INDIC DIGIT ONE
        f"origin\n\n{ROOT}\n",
        f"origin\n{2**64}\n{ROOT}\n",
        f"origin\n1\n{ROOT[:-2]}=\n",  # not base64
        f"origin\n1\n{ROOT.rstrip('=')}\n",  # padding missing
        f"origin\n1\n{base64.b64encode(bytes(31)).decode()}\n",
        f"origin\n1\n{base64.b64encode(bytes(33)).decode()}\n",
        f"origin\n1\n{ROOT[:-2]}J=\n",  # non-canonical: the last character's unused bits set
        f"origin\n1\n{ROOT}\n\n",  # empty extension line
        f"origin\n1\n{ROOT}\next\n\n",
        f"origin\r\n1\n{ROOT}\n",
        f"origin\n1\n{ROOT}\nbad\x00ext\n",
    ],
)
def test_parse_checkpoint_is_strict(text: str) -> None:
    with pytest.raises(NoteError, match="malformed checkpoint"):
        parse_checkpoint(text)


@pytest.mark.parametrize(
    ("origin", "size", "root", "extensions"),
    [
        ("", 1, bytes(32), ()),
        ("a\nb", 1, bytes(32), ()),
        ("o", -1, bytes(32), ()),
        ("o", 2**64, bytes(32), ()),
        ("o", 1, bytes(31), ()),
        ("o", 1, bytes(32), ("",)),
        ("o", 1, bytes(32), ("a\nb",)),
    ],
)
def test_checkpoint_refuses_invalid_fields(
    origin: str, size: int, root: bytes, extensions: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match="must"):
        Checkpoint(origin, size, root, extensions)


# --- key files ----------------------------------------------------------------------------------


def test_create_signing_key_is_0600_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "nested" / "log.pem"
    create_signing_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    key = load_signing_key(path)
    signer = NoteSigner("example.com/ledger", key)
    assert NoteVerifier(signer.verifier_key()).open(signer.sign(TEXT)) == TEXT


def test_create_signing_key_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "log.pem"
    create_signing_key(path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        create_signing_key(path)
    assert path.read_bytes() == before


def other_key_files() -> list[bytes]:
    ed25519 = Ed25519PrivateKey.generate()
    return [
        b"not a key",
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        ed25519.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"a passphrase"),
        ),
        ed25519.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    ]


def test_load_signing_key_refuses_anything_else(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    for content in other_key_files():
        path.write_bytes(content)
        with pytest.raises(ValueError, match="not an unencrypted PEM PKCS#8 Ed25519") as info:
            load_signing_key(path)
        assert "PRIVATE KEY" not in str(info.value)
