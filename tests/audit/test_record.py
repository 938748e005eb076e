"""Record bytes: one canonical header encoding, a parser that fails only one way, and leaf data
whose length prefix keeps every (header, ciphertext) pair apart."""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.record import (
    MAX_HEADER_BYTES,
    SCHEMA_VERSION,
    Body,
    Facts,
    RecordFormatError,
    Seal,
    Sealed,
    Usage,
    captured,
    encode_header,
    header_columns,
    index_columns,
    parse_header,
)

FACTS = Facts(
    kind="completion",
    tenant="acme",
    key_id="key-1",
    request_id="req-42",
    created_at=1_700_000_000.25,
    model="qwen3-0.6b",
    status="ok",
    upstream="vllm-a",
    stream=True,
    started_at=1_700_000_000.5,
    first_token_at=1_700_000_001.0,
    ended_at=1_700_000_002.75,
    usage=Usage(prompt_tokens=11, completion_tokens=22, reasoning_tokens=7, total_tokens=33),
    finish_reasons=("stop", None),
    error_code=None,
    client_disconnected=False,
    capture="reasoning",
)
SEAL = Seal(
    origin="thinkgate.example/ledger",
    writer="w-0123456789abcdef",
    sequence=7,
    dek_id="dek-00112233",
    salt=bytes(range(32)),
    commitment=bytes(range(32, 64)),
)
BODY = Body(
    messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
    params={"temperature": 0.6, "max_tokens": 64, "stop": ["\n\n"]},
    reasoning=("Two plus two ", "is four."),
    content=("4",),
)


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# --- header ---------------------------------------------------------------------------------------


def test_header_is_canonical_sorted_and_compact() -> None:
    header = encode_header(FACTS, SEAL)
    decoded = orjson.loads(header)
    assert list(decoded) == sorted(decoded)
    assert header == canonical_json(decoded)
    assert header == orjson.dumps(decoded, option=orjson.OPT_SORT_KEYS)
    assert b" " not in header.replace(b"Two plus two ", b"")  # no whitespace between tokens


def test_header_encoding_is_deterministic() -> None:
    assert encode_header(FACTS, SEAL) == encode_header(replace(FACTS), replace(SEAL))


def test_header_carries_the_seal_and_every_fact_that_is_set() -> None:
    fields = orjson.loads(encode_header(FACTS, SEAL))
    assert fields["v"] == SCHEMA_VERSION
    assert fields["origin"] == SEAL.origin
    assert fields["dek"] == SEAL.dek_id
    assert base64.b64decode(fields["salt"]) == SEAL.salt
    assert base64.b64decode(fields["commitment"]) == SEAL.commitment
    assert fields["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 22,
        "reasoning_tokens": 7,
        "total_tokens": 33,
    }
    assert fields["finish_reasons"] == ["stop", None]
    assert "error_code" not in fields  # None is left out, not written as null
    assert "subject" not in fields and "statement" not in fields


def test_header_never_holds_body_text() -> None:
    header = encode_header(FACTS, SEAL)
    for text in ("be brief", "2+2?", "is four.", "temperature"):
        assert text.encode() not in header


def test_parse_header_recovers_every_field() -> None:
    header = parse_header(encode_header(FACTS, SEAL))
    assert (header.kind, header.tenant, header.key_id, header.request_id) == (
        "completion",
        "acme",
        "key-1",
        "req-42",
    )
    assert (header.model, header.status, header.created_at) == ("qwen3-0.6b", "ok", 1.7e9 + 0.25)
    assert (header.writer, header.sequence, header.dek_id) == (SEAL.writer, 7, SEAL.dek_id)
    assert (header.salt, header.commitment) == (SEAL.salt, SEAL.commitment)
    for name in Facts.__dataclass_fields__:
        value = getattr(FACTS, name)
        if isinstance(value, Usage):  # "counted" and "cached_tokens" are written only when set
            expected = {k: getattr(value, k) for k in Usage.__dataclass_fields__}
            assert header.fields[name] == {
                k: v for k, v in expected.items() if k not in ("counted", "cached_tokens")
            }
        elif isinstance(value, tuple):
            assert header.fields[name] == list(value)
        elif value is not None:
            assert header.fields[name] == value


def test_cached_tokens_are_in_the_header_when_the_engine_found_some() -> None:
    facts = dataclasses.replace(FACTS, usage=Usage(400, 10, 0, 410, cached_tokens=384))
    assert parse_header(encode_header(facts, SEAL)).fields["usage"]["cached_tokens"] == 384


def test_system_record_headers_parse_too() -> None:
    facts = Facts(
        kind="access", tenant="acme", key_id="auditor", request_id="read-3",
        created_at=1.0, subject=3,
    )  # fmt: skip
    header = parse_header(encode_header(facts, SEAL))
    assert header.kind == "access"
    assert header.fields["subject"] == 3
    assert header.model == ""


NAMES = st.text(st.characters(codec="utf-8"), max_size=20)  # orjson needs valid UTF-8
FINITE = st.floats(allow_nan=False, allow_infinity=False)
COUNTS = st.integers(0, 2**63 - 1)
FACTS_STRATEGY = st.builds(
    Facts,
    kind=st.sampled_from(["completion", "access", "shred"]),
    tenant=NAMES,
    key_id=NAMES,
    request_id=NAMES,
    created_at=FINITE,
    model=NAMES,
    status=NAMES,
    upstream=st.none() | NAMES,
    stream=st.booleans(),
    started_at=st.none() | FINITE,
    first_token_at=st.none() | FINITE,
    ended_at=st.none() | FINITE,
    usage=st.none() | st.builds(Usage, COUNTS, COUNTS, COUNTS, COUNTS),
    finish_reasons=st.lists(st.none() | NAMES, max_size=3).map(tuple),
    error_code=st.none() | NAMES,
    client_disconnected=st.booleans(),
    capture=st.sampled_from(["full", "reasoning", "metadata"]),
    subject=st.none() | COUNTS,
    statement=st.none() | NAMES,
)
SEAL_STRATEGY = st.builds(
    Seal,
    origin=NAMES,
    writer=NAMES,
    sequence=COUNTS,
    dek_id=NAMES,
    salt=st.binary(max_size=40),
    commitment=st.binary(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(facts=FACTS_STRATEGY, seal=SEAL_STRATEGY)
def test_any_header_round_trips_and_is_canonical(facts: Facts, seal: Seal) -> None:
    data = encode_header(facts, seal)
    header = parse_header(data)
    assert (header.kind, header.tenant, header.key_id, header.request_id) == (
        facts.kind,
        facts.tenant,
        facts.key_id,
        facts.request_id,
    )
    assert (header.model, header.status, header.created_at) == (
        facts.model,
        facts.status,
        facts.created_at,
    )
    assert (header.writer, header.sequence, header.dek_id) == (
        seal.writer,
        seal.sequence,
        seal.dek_id,
    )
    assert (header.salt, header.commitment) == (seal.salt, seal.commitment)
    assert header.fields.get("subject") == facts.subject
    assert header.fields.get("statement") == facts.statement
    assert data == orjson.dumps(header.fields, option=orjson.OPT_SORT_KEYS)
    assert list(header.fields) == sorted(header.fields)


# --- parse errors ---------------------------------------------------------------------------------

VALID = orjson.loads(encode_header(FACTS, SEAL))


def mutated(**changes: Any) -> bytes:
    document = {**VALID, **changes}
    return orjson.dumps({k: v for k, v in document.items() if v is not ...})


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b"null",
        b'"a string"',
        b"42",
        b"{}",
        b"\xff\xfe{}",
        encode_header(FACTS, SEAL)[:-1],
        mutated(tenant=...),
        mutated(created_at=...),
        mutated(sequence=...),
        mutated(salt=...),
        mutated(tenant=7),
        mutated(writer=None),
        mutated(dek=["a"]),
        mutated(created_at="yesterday"),
        mutated(created_at=None),
        mutated(sequence="seven"),
        mutated(sequence=[7]),
        mutated(salt="not base64!"),
        mutated(salt="é"),
        mutated(commitment=12),
    ],
)
def test_garbage_raises_record_format_error(data: bytes) -> None:
    with pytest.raises(RecordFormatError, match="not a thinkgate ledger header"):
        parse_header(data)


def test_record_format_error_is_a_value_error_and_hides_its_cause() -> None:
    with pytest.raises(RecordFormatError) as info:
        parse_header(b"{")
    assert isinstance(info.value, ValueError)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def parsed_or_rejected(data: bytes) -> None:
    """``RecordFormatError`` or a header whose typed fields really have their types."""
    try:
        header = parse_header(data)
    except RecordFormatError:
        return
    for name in ("kind", "tenant", "key_id", "request_id", "model", "status", "writer", "dek_id"):
        assert isinstance(getattr(header, name), str)
    assert isinstance(header.sequence, int) and isinstance(header.created_at, float)
    assert isinstance(header.salt, bytes) and isinstance(header.commitment, bytes)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | FINITE | NAMES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_record_format_error(data: bytes) -> None:
    parsed_or_rejected(data)


@settings(max_examples=500, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(sorted(VALID)) | NAMES, JSON | st.just(...), max_size=4)
)
def test_any_damaged_header_parses_or_raises_record_format_error(
    changes: dict[str, Any],
) -> None:
    """JSON-shaped garbage reaches past the decoder, into every field conversion."""
    parsed_or_rejected(mutated(**changes))


@settings(max_examples=200, deadline=None)
@given(document=JSON)
def test_any_json_document_parses_or_raises_record_format_error(document: Any) -> None:
    parsed_or_rejected(orjson.dumps(document))


# --- leaf data ------------------------------------------------------------------------------------


def test_leaf_data_is_length_prefixed_header_then_ciphertext() -> None:
    sealed = Sealed(b'{"a":1}', b"\x00cipher")
    assert sealed.leaf_data() == b"\x00\x00\x00\x07" + b'{"a":1}' + b"\x00cipher"
    assert Sealed.from_leaf_data(sealed.leaf_data()) == sealed


def test_leaf_data_of_empty_parts_round_trips() -> None:
    assert Sealed(b"", b"").leaf_data() == b"\x00\x00\x00\x00"
    assert Sealed.from_leaf_data(b"\x00\x00\x00\x00") == Sealed(b"", b"")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "too short"),
        (b"\x00\x00\x00", "too short"),
        (b"\x00\x00\x00\x05abcd", "out of range"),
        (b"\xff\xff\xff\xff" + b"x" * 10, "out of range"),
        ((MAX_HEADER_BYTES + 1).to_bytes(4, "big") + b"x" * (MAX_HEADER_BYTES + 2), "out of range"),
    ],
)
def test_impossible_leaf_data_raises_record_format_error(data: bytes, message: str) -> None:
    with pytest.raises(RecordFormatError, match=message):
        Sealed.from_leaf_data(data)


def test_the_length_prefix_separates_pairs_with_equal_concatenations() -> None:
    a, b = Sealed(b"head", b"ertext"), Sealed(b"header", b"text")
    assert a.header + a.ciphertext == b.header + b.ciphertext
    assert a.leaf_data() != b.leaf_data()


PARTS = st.binary(max_size=64)


@settings(max_examples=300, deadline=None)
@given(header=PARTS, ciphertext=PARTS)
def test_leaf_data_round_trips(header: bytes, ciphertext: bytes) -> None:
    assert Sealed.from_leaf_data(Sealed(header, ciphertext).leaf_data()) == Sealed(
        header, ciphertext
    )


@settings(max_examples=300, deadline=None)
@given(first=st.tuples(PARTS, PARTS), second=st.tuples(PARTS, PARTS))
def test_distinct_pairs_never_share_leaf_data(
    first: tuple[bytes, bytes], second: tuple[bytes, bytes]
) -> None:
    if first != second:
        assert Sealed(*first).leaf_data() != Sealed(*second).leaf_data()


@settings(max_examples=300, deadline=None)
@given(joined=st.binary(max_size=64), cuts=st.lists(st.integers(0, 64), min_size=2, max_size=5))
def test_every_split_of_the_same_bytes_gives_different_leaf_data(
    joined: bytes, cuts: list[int]
) -> None:
    splits = {min(cut, len(joined)) for cut in cuts}
    leaves = {Sealed(joined[:cut], joined[cut:]).leaf_data() for cut in splits}
    assert len(leaves) == len(splits)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=80))
def test_from_leaf_data_of_arbitrary_bytes_raises_only_record_format_error(data: bytes) -> None:
    try:
        sealed = Sealed.from_leaf_data(data)
    except RecordFormatError:
        return
    assert sealed.leaf_data() == data


# --- body and capture -----------------------------------------------------------------------------


def test_body_round_trips() -> None:
    assert Body.decode(BODY.encode()) == BODY


def test_body_encoding_is_canonical_and_leaves_out_what_was_not_captured() -> None:
    encoded = BODY.encode()
    assert encoded == canonical_json(orjson.loads(encoded))
    assert Body().encode() == b"{}"
    assert Body.decode(b"{}") == Body()
    assert orjson.loads(Body(content=("a",)).encode()) == {"content": ["a"]}


def test_empty_but_captured_parts_stay_distinct_from_missing_ones() -> None:
    body = Body(messages=[], params={}, reasoning=(), content=())
    assert Body.decode(body.encode()) == body
    assert Body.decode(body.encode()) != Body()


@settings(max_examples=200, deadline=None)
@given(
    messages=st.none() | st.lists(JSON, max_size=3),
    params=st.none() | st.dictionaries(NAMES, JSON, max_size=3),
    reasoning=st.none() | st.lists(NAMES, max_size=3).map(tuple),
    content=st.none() | st.lists(NAMES, max_size=3).map(tuple),
)
def test_any_body_round_trips(
    messages: list[Any] | None,
    params: dict[str, Any] | None,
    reasoning: tuple[str, ...] | None,
    content: tuple[str, ...] | None,
) -> None:
    body = Body(messages, params, reasoning, content)
    assert Body.decode(body.encode()) == body


def test_capture_full_keeps_everything() -> None:
    assert captured(BODY, "full") == BODY


def test_capture_reasoning_drops_the_prompt() -> None:
    kept = captured(BODY, "reasoning")
    assert kept == Body(reasoning=BODY.reasoning, content=BODY.content)
    assert kept.messages is None and kept.params is None
    assert b"be brief" not in kept.encode() and b"temperature" not in kept.encode()


def test_capture_metadata_keeps_nothing() -> None:
    assert captured(BODY, "metadata") == Body()
    assert captured(BODY, "metadata").encode() == b"{}"


def test_usage_counted_by_the_gateway_says_so_in_the_header() -> None:
    counted = replace(FACTS, usage=Usage(5, 20, 12, 25, counted=True))
    header = parse_header(encode_header(counted, SEAL))
    assert header.fields["usage"] == {"prompt_tokens": 5, "completion_tokens": 20,
                                      "reasoning_tokens": 12, "total_tokens": 25,
                                      "counted": True}  # fmt: skip


@settings(max_examples=200)
@given(
    kind=st.sampled_from(["completion", "access", "shred"]),
    text=st.text(max_size=12),
    created=st.one_of(st.floats(0, 4e9, allow_nan=False), st.integers(0, 4_000_000_000)),
    sequence=st.integers(0, 2**53),
)
def test_the_columns_kept_at_sealing_are_what_the_header_parses_to(
    kind: Any, text: str, created: float, sequence: int
) -> None:
    """The store indexes a freshly sealed record by the columns sealing kept, and a record
    read back (the spool's replay) by its parsed header: both must be the same row."""
    facts = replace(FACTS, kind=kind, tenant=text, key_id=text[::-1], request_id=text + "r",
                    model=text, status=text or "ok", created_at=created)  # fmt: skip
    seal = replace(SEAL, sequence=sequence, writer=text + "w")
    parsed = header_columns(parse_header(encode_header(facts, seal)))
    kept = index_columns(seal.writer, seal.sequence, facts)
    assert kept == parsed
    assert [type(v) for v in kept] == [type(v) for v in parsed]
