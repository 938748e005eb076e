"""Sealed reasoning (``encrypted_content``) against real data keys in SQLite: it opens only for
its tenant and model, before its expiry, unaltered and unshredded, and every failure looks alike."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.pool import QueuePool

from audit import migrate
from audit.crypto import FileKeyProvider
from audit.datakeys import DataKeys
from gateway.api.items import SealedReasoning
from gateway.conversation import sealing
from gateway.conversation.sealing import InvalidEncryptedContent, ReasoningSealer
from gateway.db import create_engine
from tests.clock import FakeClock

TTL_S = 3_600.0
PARAM = "input[0].encrypted_content"
OPAQUE = InvalidEncryptedContent(PARAM).message


@pytest.fixture
async def keys(tmp_path: Path) -> AsyncIterator[DataKeys]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    try:
        await migrate.upgrade(engine)
        FileKeyProvider.create(tmp_path / "keys.json")
        yield DataKeys(engine, FileKeyProvider.load(tmp_path / "keys.json"))
        pool = engine.pool  # no connection left checked out by the sealer
        assert isinstance(pool, QueuePool) and pool.checkedout() == 0
    finally:
        await engine.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_767_225_600.0)


@pytest.fixture
def sealer(keys: DataKeys, clock: FakeClock) -> ReasoningSealer:
    return ReasoningSealer(keys, TTL_S, clock=clock)


async def seal(sealer: ReasoningSealer, text: str = "thinking", tenant: str = "acme") -> str:
    return (await sealer.sealer(tenant, "qwen3-8b"))(text)


async def refused(
    sealer: ReasoningSealer, token: str, tenant: str = "acme", model: str = "qwen3-8b"
) -> None:
    """One opaque 400 naming the field, whatever went wrong."""
    with pytest.raises(InvalidEncryptedContent) as error:
        await sealer.open(tenant, model, [SealedReasoning(token, PARAM)])
    assert (error.value.status, error.value.code) == (400, "invalid_encrypted_content")
    assert (error.value.param, error.value.message) == (PARAM, OPAQUE)


def decoded(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def encoded(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "text", ["the answer is 42", "", "思考中… ünïcode, emoji 🧠, RTL שלום\n\ttabs", "x" * 100_000]
)
async def test_a_token_opens_to_its_text(sealer: ReasoningSealer, text: str) -> None:
    token = await seal(sealer, text)
    assert await sealer.open("acme", "qwen3-8b", [SealedReasoning(token, PARAM)]) == {token: text}


async def test_several_tokens_open_together(sealer: ReasoningSealer) -> None:
    first, second = await seal(sealer, "one"), await seal(sealer, "two")
    items = [SealedReasoning(first, "input[0].encrypted_content"),
             SealedReasoning(second, "input[2].encrypted_content"),
             SealedReasoning(first, "input[5].encrypted_content")]  # fmt: skip
    assert await sealer.open("acme", "qwen3-8b", items) == {first: "one", second: "two"}


async def test_the_first_token_that_fails_is_named(sealer: ReasoningSealer) -> None:
    good = await seal(sealer)
    items = [SealedReasoning(good, "input[0].encrypted_content"),
             SealedReasoning("garbage", "input[3].encrypted_content")]  # fmt: skip
    with pytest.raises(InvalidEncryptedContent) as error:
        await sealer.open("acme", "qwen3-8b", items)
    assert error.value.param == "input[3].encrypted_content"


async def test_another_tenants_token_is_refused_before_any_decryption(
    sealer: ReasoningSealer, keys: DataKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = await seal(sealer, tenant="acme")
    await seal(sealer, tenant="globex")  # globex has a data key of its own
    answers: list[tuple[str | None, bytes | None]] = []
    derived: list[bytes] = []
    opening, key = keys.opening, sealing._key

    async def recorded_opening(dek_id: str, *, tenant: str | None = None) -> bytes | None:
        dek = await opening(dek_id, tenant=tenant)
        answers.append((tenant, dek))
        return dek

    def recorded_key(dek: bytes, salt: bytes) -> Any:
        derived.append(dek)
        return key(dek, salt)

    monkeypatch.setattr(keys, "opening", recorded_opening)
    monkeypatch.setattr(sealing, "_key", recorded_key)
    await refused(sealer, token, tenant="globex")
    assert answers == [("globex", None)] and derived == []
    assert await sealer.open("acme", "qwen3-8b", [SealedReasoning(token, PARAM)])
    assert answers[1][0] == "acme" and answers[1][1] is not None and derived == [answers[1][1]]


async def test_a_token_is_bound_to_its_model(sealer: ReasoningSealer) -> None:
    await refused(sealer, await seal(sealer), model="deepseek-r1")


def field_bounds(raw: bytes) -> dict[str, tuple[int, int]]:
    """``[start, end)`` of each field of a version 1 token (the module docstring's layout)."""
    n = raw[4]
    return {"version": (0, 4), "key id length": (4, 5), "key id": (5, 5 + n),
            "expiry": (5 + n, 13 + n), "salt": (13 + n, 29 + n), "nonce": (29 + n, 41 + n),
            "ciphertext": (41 + n, len(raw) - 16), "tag": (len(raw) - 16, len(raw))}  # fmt: skip


@pytest.mark.parametrize("end", ["first", "last"])
@pytest.mark.parametrize(
    "field", ["version", "key id length", "key id", "expiry", "salt", "nonce", "ciphertext", "tag"]
)
async def test_a_flipped_bit_anywhere_is_refused(
    sealer: ReasoningSealer, field: str, end: str
) -> None:
    raw = bytearray(decoded(await seal(sealer, "some reasoning")))
    start, stop = field_bounds(bytes(raw))[field]
    raw[start if end == "first" else stop - 1] ^= 0x01
    await refused(sealer, encoded(bytes(raw)))


PREFIX = b"tgr1\x14dek-0123456789abcdef"
TOO_SHORT = PREFIX + bytes(8 + 16 + 12 + 15)  # one byte short of an empty ciphertext's tag


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda t: t[:-1], id="one-char-short"),
        pytest.param(lambda t: t[: len(t) // 2], id="half"),
        pytest.param(lambda t: t[:8], id="version-only"),
        pytest.param(lambda t: t + "AAAA", id="extended"),
        pytest.param(lambda t: t[::-1], id="reversed"),
        pytest.param(lambda t: "", id="empty"),
        pytest.param(lambda t: "=", id="padding"),
        pytest.param(lambda t: "%%%%", id="no-base64-characters"),
        pytest.param(lambda t: "tgr1 sealed ✓", id="not-ascii"),
        pytest.param(lambda t: encoded(b"tgr1"), id="no-key-id-length"),
        pytest.param(lambda t: encoded(b"tgr1\x14dek-"), id="key-id-cut"),
        pytest.param(lambda t: encoded(TOO_SHORT), id="tag-cut"),
        pytest.param(lambda t: encoded(b"tgr2" + decoded(t)[4:]), id="other-version"),
        pytest.param(lambda t: encoded(b"tgr1\x02\xff\xfe" + decoded(t)[25:]), id="key-id-binary"),
    ],
)
async def test_a_malformed_token_is_refused(
    sealer: ReasoningSealer, damage: Callable[[str], str]
) -> None:
    await refused(sealer, damage(await seal(sealer)))


@pytest.mark.parametrize("junk", ["!!!!", "===="])
async def test_a_token_with_junk_appended_is_refused(sealer: ReasoningSealer, junk: str) -> None:
    await refused(sealer, await seal(sealer) + junk)


@pytest.mark.parametrize(
    ("elapsed", "opens"), [(TTL_S - 1, True), (TTL_S, True), (TTL_S + 1, False)]
)
async def test_a_token_expires_after_its_ttl_with_the_same_message(
    sealer: ReasoningSealer, clock: FakeClock, elapsed: float, opens: bool
) -> None:
    token = await seal(sealer)
    clock.now += elapsed
    if opens:
        assert await sealer.open("acme", "qwen3-8b", [SealedReasoning(token, PARAM)])
    else:
        await refused(sealer, token)


async def test_shredding_the_tenant_makes_its_tokens_unopenable(
    sealer: ReasoningSealer, keys: DataKeys, clock: FakeClock
) -> None:
    token, theirs = await seal(sealer, "mine"), await seal(sealer, "theirs", tenant="globex")
    assert await sealer.open("acme", "qwen3-8b", [SealedReasoning(token, PARAM)])
    assert await keys.shred("acme", clock.now) == 1
    await refused(sealer, token)
    fresh = await seal(sealer, "after")  # the tenant goes on under a new key
    assert await sealer.open("acme", "qwen3-8b", [SealedReasoning(fresh, PARAM)]) == {
        fresh: "after"
    }
    opened = await sealer.open("globex", "qwen3-8b", [SealedReasoning(theirs, PARAM)])
    assert opened == {theirs: "theirs"}


async def test_a_token_does_not_show_its_text(sealer: ReasoningSealer) -> None:
    text = "the secret plan is to attack at dawn"
    token = await seal(sealer, text)
    raw = decoded(token)
    assert b"secret" not in raw and "secret" not in token
    assert encoded(text.encode())[:16] not in token


async def test_sealing_the_same_text_twice_gives_different_tokens(
    sealer: ReasoningSealer,
) -> None:
    seal_one = await sealer.sealer("acme", "qwen3-8b")
    first, second = seal_one("same"), seal_one("same")
    assert first != second
    a, b = field_bounds(decoded(first)), decoded(second)
    assert decoded(first)[slice(*a["salt"])] != b[slice(*a["salt"])]
    assert decoded(first)[slice(*a["nonce"])] != b[slice(*a["nonce"])]
    items = [SealedReasoning(first, PARAM), SealedReasoning(second, PARAM)]
    assert await sealer.open("acme", "qwen3-8b", items) == {first: "same", second: "same"}
