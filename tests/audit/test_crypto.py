"""Record encryption: derivation checked independently, every tampering opaque, key files safe.

Keys are generated at run time; none is written into this file.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import pickle
import re
import stat
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.keywrap import aes_key_wrap
from hypothesis import given
from hypothesis import strategies as st

from audit.crypto import (
    SALT_SIZE,
    DecryptionError,
    FileKeyProvider,
    KeyFileError,
    WrappedKey,
    new_data_key,
    record_key,
    rewrap,
    seal,
    unseal,
)
from audit.crypto import hkdf_sha256 as crypto_hkdf

OPAQUE = "The record could not be decrypted."
INFO = b"thinkgate/ledger/record/v1"
LABEL = b"thinkgate/ledger/commitment/v1"
HEADER = b'{"origin":"example.com/ledger","sequence":7}'
BODY = b'{"reasoning":"...","answer":"42"}'


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 §2.2 (extract) and §2.3 (expand), with the standard library only."""
    prk = hmac.digest(salt, ikm, "sha256")
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.digest(prk, block + info + bytes([counter]), "sha256")
        okm += block
    return okm[:length]


def failure(call: Callable[[], object]) -> DecryptionError:
    with pytest.raises(DecryptionError) as info:
        call()
    return info.value


def assert_opaque(error: DecryptionError) -> None:
    """Same message, and nothing chained that a traceback would show."""
    assert str(error) == OPAQUE
    assert error.__cause__ is None
    assert "During handling" not in "".join(traceback.format_exception(error))


def flipped(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# --- derivation ---------------------------------------------------------------------------------


def test_reference_hkdf_matches_rfc5869_test_case_1() -> None:
    okm = hkdf_sha256(
        bytes([0x0B] * 22), bytes(range(0x0D)), bytes(range(0xF0, 0xFA)), 42
    )  # RFC 5869 A.1
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_record_key_is_hkdf_sha256_of_the_data_key() -> None:
    dek = new_data_key()
    key = record_key(dek)
    okm = hkdf_sha256(dek, key.salt, INFO, 64)
    assert key.commitment == hmac.digest(okm[32:], LABEL, "sha256")
    sealed = seal(key, BODY, HEADER)
    assert AESGCM(okm[:32]).decrypt(sealed[:12], sealed[12:], HEADER) == BODY


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32),
       st.binary(max_size=64))  # fmt: skip
def test_the_written_out_hkdf_is_cryptographys(ikm: bytes, salt: bytes, info: bytes) -> None:
    expected = HKDF(algorithm=hashes.SHA256(), length=64, salt=salt, info=info).derive(ikm)
    assert crypto_hkdf(ikm, salt, info) == expected == hkdf_sha256(ikm, salt, info, 64)


def test_sizes_and_fresh_randomness() -> None:
    dek = new_data_key()
    assert len(dek) == 32 and dek != new_data_key()
    first, second = record_key(dek), record_key(dek)
    assert len(first.salt) == SALT_SIZE and len(first.commitment) == 32
    assert first.salt != second.salt and first.commitment != second.commitment
    assert record_key(dek, first.salt) == first
    one, two = seal(first, BODY, HEADER), seal(first, BODY, HEADER)
    assert len(one) == 12 + len(BODY) + 16
    assert one[:12] != two[:12]  # fresh nonce even when a caller reuses a key


def test_caller_misuse_is_a_value_error() -> None:
    dek = new_data_key()
    with pytest.raises(ValueError, match="data key must be 32 bytes"):
        record_key(dek[:31])
    with pytest.raises(ValueError, match="salt must be 32 bytes"):
        record_key(dek, b"\x00" * 16)


def test_record_key_repr_hides_the_aes_key() -> None:
    dek = new_data_key()
    key = record_key(dek)
    aes_key = hkdf_sha256(dek, key.salt, INFO, 64)[:32]
    for shown in (repr(key), str(key)):
        for form in (repr(aes_key), aes_key.hex(), base64.b64encode(aes_key).decode()):
            assert form not in shown
        assert repr(dek) not in shown and dek.hex() not in shown


# --- sealing and every way to fail --------------------------------------------------------------


def test_roundtrip() -> None:
    dek = new_data_key()
    key = record_key(dek)
    sealed = seal(key, BODY, HEADER)
    assert unseal(dek, key.salt, key.commitment, HEADER, sealed) == BODY


@given(plaintext=st.binary(max_size=300), header=st.binary(max_size=100), other=st.binary())
def test_roundtrip_property(plaintext: bytes, header: bytes, other: bytes) -> None:
    dek = new_data_key()
    key = record_key(dek)
    sealed = seal(key, plaintext, header)
    assert unseal(dek, key.salt, key.commitment, header, sealed) == plaintext
    if other != header:
        assert_opaque(failure(lambda: unseal(dek, key.salt, key.commitment, other, sealed)))


def test_every_bit_flip_of_header_nonce_ciphertext_or_tag_fails() -> None:
    dek = new_data_key()
    key = record_key(dek)
    sealed = seal(key, b"short body", HEADER)
    opened = partial(unseal, dek, key.salt, key.commitment)
    for bit in range(len(HEADER) * 8):
        assert_opaque(failure(partial(opened, flipped(HEADER, bit), sealed)))
    for bit in range(len(sealed) * 8):  # nonce, then ciphertext, then tag
        assert_opaque(failure(partial(opened, HEADER, flipped(sealed, bit))))


def test_every_truncation_and_extension_fails() -> None:
    dek = new_data_key()
    key = record_key(dek)
    sealed = seal(key, BODY, HEADER)
    opened = partial(unseal, dek, key.salt, key.commitment, HEADER)
    for cut in range(len(sealed)):
        assert_opaque(failure(partial(opened, sealed[:cut])))
    assert_opaque(failure(partial(opened, sealed + b"\x00")))


def test_wrong_key_material_fails_with_the_same_message() -> None:
    dek = new_data_key()
    key = record_key(dek)
    sealed = seal(key, BODY, HEADER)
    other = record_key(new_data_key(), key.salt)
    wrong: list[Callable[[], object]] = [
        lambda: unseal(new_data_key(), key.salt, key.commitment, HEADER, sealed),
        lambda: unseal(dek, os.urandom(32), key.commitment, HEADER, sealed),
        lambda: unseal(dek, key.salt, other.commitment, HEADER, sealed),
        lambda: unseal(dek, key.salt, flipped(key.commitment, 0), HEADER, sealed),
        lambda: unseal(dek[:31], key.salt, key.commitment, HEADER, sealed),
        lambda: unseal(dek + b"\x00", key.salt, key.commitment, HEADER, sealed),
        lambda: unseal(dek, key.salt[:16], key.commitment, HEADER, sealed),
        lambda: unseal(dek, key.salt, key.commitment[:31], HEADER, sealed),
        lambda: unseal(dek, key.salt, key.commitment + b"\x00", HEADER, sealed),
        lambda: unseal(b"", b"", b"", b"", b""),
    ]
    errors = [failure(call) for call in wrong]
    for error in errors:
        assert_opaque(error)
    assert {str(error) for error in errors} == {OPAQUE}


def test_commitment_binds_the_key() -> None:
    salt = os.urandom(SALT_SIZE)
    commitments = {record_key(new_data_key(), salt).commitment for _ in range(500)}
    assert len(commitments) == 500
    dek_a, dek_b = new_data_key(), new_data_key()
    key_a, key_b = record_key(dek_a, salt), record_key(dek_b, salt)
    sealed = seal(key_a, BODY, HEADER)
    # A's ciphertext with B's commitment opens under neither key.
    assert_opaque(failure(lambda: unseal(dek_a, salt, key_b.commitment, HEADER, sealed)))
    assert_opaque(failure(lambda: unseal(dek_b, salt, key_b.commitment, HEADER, sealed)))


def test_decryption_error_pickles_with_its_message() -> None:
    error = pickle.loads(pickle.dumps(DecryptionError()))
    assert isinstance(error, DecryptionError) and str(error) == OPAQUE


# --- wrapped data keys --------------------------------------------------------------------------


def provider_with(*kek_ids: str) -> FileKeyProvider:
    return FileKeyProvider(kek_ids[0], {kek_id: os.urandom(32) for kek_id in kek_ids})


def test_wrap_unwrap_roundtrip() -> None:
    provider = provider_with("kek-a", "kek-b")
    dek = new_data_key()
    wrapped = provider.wrap(dek)
    assert wrapped.kek_id == "kek-a" == provider.primary_id
    assert len(wrapped.blob) == 40  # RFC 3394: one 8-byte block more than the key
    assert provider.unwrap(wrapped) == dek
    with pytest.raises(ValueError, match="data key must be 32 bytes"):
        provider.wrap(dek[:16])


def test_unwrap_failures_are_opaque() -> None:
    kek_a, kek_b = os.urandom(32), os.urandom(32)
    provider = FileKeyProvider("kek-a", {"kek-a": kek_a, "kek-b": kek_b})
    wrapped = provider.wrap(new_data_key())
    bad = [
        WrappedKey("kek-unknown", wrapped.blob),
        WrappedKey("kek-b", wrapped.blob),
        WrappedKey("kek-a", wrapped.blob[:-8]),
        WrappedKey("kek-a", wrapped.blob[:39]),
        WrappedKey("kek-a", b""),
        WrappedKey("kek-a", wrapped.blob + bytes(8)),
        WrappedKey("kek-b", aes_key_wrap(kek_b, os.urandom(48))),  # valid, but not a data key
        *(WrappedKey("kek-a", flipped(wrapped.blob, bit)) for bit in range(40 * 8)),
    ]
    for item in bad:
        assert_opaque(failure(partial(provider.unwrap, item)))


def test_provider_validates_its_keys() -> None:
    with pytest.raises(KeyFileError, match="primary KEK 'kek-b' is not among the keys"):
        FileKeyProvider("kek-b", {"kek-a": os.urandom(32)})
    with pytest.raises(KeyFileError, match="must be 32 bytes, not 31"):
        FileKeyProvider("kek-a", {"kek-a": os.urandom(31)})
    with pytest.raises(KeyFileError, match="invalid KEK id"):
        FileKeyProvider("kek a", {"kek a": os.urandom(32)})


def test_provider_repr_hides_the_keks() -> None:
    kek = os.urandom(32)
    provider = FileKeyProvider("kek-a", {"kek-a": kek})
    assert repr(provider) == "FileKeyProvider(primary='kek-a', kek_ids=['kek-a'])"
    for form in (repr(kek), kek.hex(), base64.b64encode(kek).decode()):
        assert form not in repr(provider) and form not in str(provider)


# --- key files ----------------------------------------------------------------------------------


def read_keks(path: Path) -> dict[str, str]:
    keys: dict[str, str] = json.loads(path.read_text())["keys"]
    return keys


def test_create_writes_a_0600_file_with_one_primary_kek(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "keks.json"
    FileKeyProvider.create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    document = json.loads(path.read_text())
    assert set(document) == {"primary", "keys"} and list(document["keys"]) == [document["primary"]]
    assert re.fullmatch(r"kek-\d{8}-[0-9a-f]{6}", document["primary"])
    assert len(base64.b64decode(document["keys"][document["primary"]])) == 32
    provider = FileKeyProvider.load(path)
    assert provider.primary_id == document["primary"]
    dek = new_data_key()
    assert provider.unwrap(provider.wrap(dek)) == dek


def test_create_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "keks.json"
    FileKeyProvider.create(path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        FileKeyProvider.create(path)
    assert path.read_bytes() == before
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")  # O_EXCL: not even through a dangling link
    with pytest.raises(FileExistsError):
        FileKeyProvider.create(link)
    assert not (tmp_path / "elsewhere.json").exists()


def bad_key_files(b64: str, short: str) -> list[tuple[bytes, str]]:
    def doc(value: object) -> bytes:
        return json.dumps(value).encode()

    keys = {"kek-a": b64}
    return [
        (doc({"primary": "kek-a", "keys": keys})[:-3], "not valid UTF-8 JSON"),
        (b"\xff" + doc({"primary": "kek-a", "keys": keys}), "not valid UTF-8 JSON"),
        (doc([b64]), "must be"),
        (doc({"keys": keys}), "must be"),
        (doc({"primary": "kek-a", "keys": keys, "comment": b64}), "must be"),
        (doc({"primary": "kek-a", "keys": [b64]}), '"keys" an object'),
        (doc({"primary": 1, "keys": keys}), '"primary" must be a string'),
        (doc({"primary": "kek-b", "keys": keys}), "'kek-b' is not among the keys"),
        (doc({"primary": "kek-a", "keys": {"kek-a": short}}), "must be 32 bytes, not 31"),
        (doc({"primary": "kek-a", "keys": {"kek-a": b64 + "!"}}), "not a standard base64"),
        (doc({"primary": "kek-a", "keys": {"kek-a": b64[:-1]}}), "not a standard base64"),
        (doc({"primary": "kek-a", "keys": {"kek-a": 5}}), "not a standard base64"),
    ]


def test_load_errors_name_the_problem_but_never_the_key(tmp_path: Path) -> None:
    kek, short = os.urandom(32), os.urandom(31)
    b64, short_b64 = base64.b64encode(kek).decode(), base64.b64encode(short).decode()
    path = tmp_path / "keks.json"
    for content, message in bad_key_files(b64, short_b64):
        path.write_bytes(content)
        with pytest.raises(KeyFileError, match=re.escape(message)) as info:
            FileKeyProvider.load(path)
        shown = "".join(traceback.format_exception(info.value))
        for secret in (kek, short):
            for form in (repr(secret), secret.hex(), base64.b64encode(secret).decode()[:-2]):
                assert form not in shown
        assert info.value.__context__ is None and info.value.__cause__ is None


def test_load_of_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FileKeyProvider.load(tmp_path / "absent.json")


def test_rotate_adds_a_primary_and_keeps_old_keks(tmp_path: Path) -> None:
    path = tmp_path / "keks.json"
    FileKeyProvider.create(path)
    old = FileKeyProvider.load(path)
    dek = new_data_key()
    wrapped = old.wrap(dek)
    old_keks = read_keks(path)
    new_id = FileKeyProvider.rotate(path)
    assert new_id != old.primary_id and re.fullmatch(r"kek-\d{8}-[0-9a-f]{6}", new_id)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keks.json"]  # no temporary left
    assert read_keks(path).items() >= old_keks.items() and len(read_keks(path)) == 2
    new = FileKeyProvider.load(path)
    assert new.primary_id == new_id
    assert new.unwrap(wrapped) == dek
    moved = rewrap(new, wrapped)
    assert moved.kek_id == new_id and moved.blob != wrapped.blob
    assert new.unwrap(moved) == dek
    assert_opaque(failure(lambda: old.unwrap(moved)))


def test_rotate_twice_keeps_every_kek(tmp_path: Path) -> None:
    path = tmp_path / "keks.json"
    FileKeyProvider.create(path)
    first = FileKeyProvider.rotate(path)
    second = FileKeyProvider.rotate(path)
    assert first != second and len(read_keks(path)) == 3
    assert FileKeyProvider.load(path).primary_id == second
