"""``gateway/ledger/sink.py``: a ``CompletionRecord`` becomes the ledger's header facts and a
body trimmed to ``AUDIT_CAPTURE``; when the ledger's writer refuses a record (neither the
database nor the spool takes it), ``AUDIT_FAIL=closed`` fails the request with
``LedgerUnavailable`` and ``open`` logs the loss; ``ensure_keys`` never invents keys unless
told to. The ledgers are real, on SQLite files under ``tmp_path``."""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.ledger import Ledger
from audit.record import Body, Usage
from gateway.db import create_engine
from gateway.errors import InvalidRequest, LedgerUnavailable
from gateway.ledger.record import recordable, request_fields
from gateway.ledger.sink import (
    LedgerKeysMissing,
    LedgerSink,
    ensure_keys,
    open_ledger,
    record_body,
    record_facts,
)
from gateway.settings import Settings
from gateway.spend.prices import parse_prices
from tests.records import completion_record

SinkFactory = Callable[..., Awaitable[LedgerSink]]


def settings_in(directory: Path, **changes: Any) -> Settings:
    return Settings(
        database_url=f"sqlite+aiosqlite:///{directory / 'thinkgate.db'}",
        ledger_key_file=directory / "keys" / "ledger-keys.json",
        signing_key_file=directory / "keys" / "signing-key.pem",
        audit_spool_file=directory / "spool" / "ledger-spool.log",
        **changes,
    )


@pytest.fixture
async def make_sink(tmp_path: Path) -> AsyncIterator[SinkFactory]:
    """``await make_sink(audit_capture=..., audit_fail=...)``: a sink over a fresh ledger."""
    opened: list[tuple[Ledger, AsyncEngine]] = []

    async def make(**changes: Any) -> LedgerSink:
        settings = settings_in(tmp_path / str(len(opened)), **changes)
        ensure_keys(settings.ledger, create=True)
        engine = create_engine(settings.database_url)
        ledger = await open_ledger(settings.ledger, engine)
        opened.append((ledger, engine))
        return LedgerSink(ledger, settings.ledger)

    try:
        yield make
    finally:
        for ledger, engine in opened:
            await ledger.aclose()
            await engine.dispose()


async def break_ledger(settings: Settings) -> None:
    """Leave the writer nowhere to put a record: the database's table is gone (a commit fails)
    and the spool's directory is a file (the spool cannot take the batch either)."""
    engine = create_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TABLE ledger_entries"))
    finally:
        await engine.dispose()
    shutil.rmtree(settings.audit_spool_file.parent, ignore_errors=True)
    settings.audit_spool_file.parent.write_bytes(b"")


@pytest.mark.parametrize(("thinking", "expected"), [(True, None), (False, False)])
def test_record_facts_carry_the_header_facts_as_given(
    thinking: bool, expected: bool | None
) -> None:
    usage = Usage(prompt_tokens=3, completion_tokens=9, reasoning_tokens=9, total_tokens=12)
    record = completion_record(usage=usage, thinking=thinking, reasoning_format="qwen3",
                               endpoint="completions",
                               traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")  # fmt: skip
    facts = record_facts(record, "reasoning")
    assert (facts.kind, facts.endpoint, facts.reasoning_format) == (
        "completion", "completions", "qwen3"
    )  # fmt: skip
    assert facts.thinking is expected  # only "off" is recorded: on is the default
    assert facts.usage is usage
    assert facts.capture == "reasoning"
    assert facts.created_at == record.ended_at == 103.0
    assert (facts.tenant, facts.key_id, facts.request_id) == ("acme", "k1", "req_1")
    assert (facts.started_at, facts.first_token_at, facts.finish_reasons) == (
        100.0, 100.5, ("stop",)
    )  # fmt: skip
    assert facts.traceparent == record.traceparent


def test_record_facts_keep_a_missing_usage_and_an_error() -> None:
    record = completion_record(usage=None, status="upstream_error", error_code="upstream_timeout",
                               client_disconnected=True, upstream=None)  # fmt: skip
    facts = record_facts(record, "full")
    assert facts.usage is None
    assert (facts.status, facts.error_code, facts.client_disconnected, facts.upstream) == (
        "upstream_error", "upstream_timeout", True, None
    )  # fmt: skip


def test_a_cost_of_nothing_is_written_as_a_plain_decimal() -> None:
    prices = parse_prices(b"currency: EUR\nmodels: {m: {input: 1, output: 2}}\n")
    nothing = record_facts(completion_record(usage=None), "full", prices)
    assert nothing.cost is not None and nothing.cost["amount"] == "0.000000000"  # not 0E-9
    assert nothing.cost["currency"] == "EUR" and nothing.cost["prices"] == prices.digest


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        ("full", Body([{"role": "user", "content": "hi"}], {"temperature": 0}, ("r",), ("a",))),
        ("reasoning", Body(None, None, ("r",), ("a",))),
        ("metadata", Body()),
    ],
)
async def test_the_stored_body_is_what_audit_capture_keeps(
    make_sink: SinkFactory, capture: str, expected: Body
) -> None:
    sink = await make_sink(audit_capture=capture)
    await sink.submit(completion_record(params={"temperature": 0}, thinking=False))
    stored = await sink.ledger.read(0)
    assert stored is not None
    assert (stored.body or Body()) == expected
    assert stored.header["capture"] == capture
    assert stored.header["thinking"] is False
    assert stored.header["endpoint"] == "chat.completions"


async def test_closed_fails_the_request_when_the_writer_refuses(
    make_sink: SinkFactory, tmp_path: Path
) -> None:
    sink = await make_sink(audit_fail="closed")
    await sink.submit(completion_record(request_id="before"))
    assert sink.accepting()
    await break_ledger(settings_in(tmp_path / "0"))
    with pytest.raises(LedgerUnavailable) as refused:
        await sink.submit(completion_record(request_id="refused"))
    assert (refused.value.status, refused.value.code) == (503, "ledger_unavailable")
    assert refused.value.__cause__ is None  # the writer's paths stay out of the response
    assert not sink.accepting()  # new requests are refused while it lasts


async def test_open_logs_the_loss_and_goes_on(
    make_sink: SinkFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = await make_sink(audit_fail="open")
    await break_ledger(settings_in(tmp_path / "0"))
    with caplog.at_level(logging.ERROR, logger="thinkgate"):
        await sink.submit(completion_record(request_id="req_lost"))
    lost = [r for r in caplog.records if r.name == "thinkgate"]
    assert [r.getMessage() for r in lost] == [
        "audit record lost (request req_lost): ledger unavailable"
    ]
    assert not sink.ledger.accepting()
    assert sink.accepting()  # open: requests go on without the ledger


def test_ensure_keys_refuses_missing_files_unless_told_to_create(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    with pytest.raises(LedgerKeysMissing, match="thinkgate ledger init"):
        ensure_keys(settings.ledger, create=False)
    assert not settings.ledger_key_file.exists()
    assert not settings.signing_key_file.exists()
    made = ensure_keys(settings.ledger, create=True)
    assert made == [str(settings.ledger_key_file), str(settings.signing_key_file)]
    assert ensure_keys(settings.ledger, create=False) == []


def test_ensure_keys_creates_only_what_is_missing(tmp_path: Path) -> None:
    settings = settings_in(tmp_path)
    ensure_keys(settings.ledger, create=True)
    kept = settings.ledger_key_file.read_bytes()
    settings.signing_key_file.unlink()
    with pytest.raises(LedgerKeysMissing, match=str(settings.signing_key_file)):
        ensure_keys(settings.ledger, create=False)
    assert ensure_keys(settings.ledger, create=True) == [str(settings.signing_key_file)]
    assert settings.ledger_key_file.read_bytes() == kept  # an existing key is never replaced


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


async def test_a_record_whose_body_cannot_be_encoded_is_kept_without_it(
    make_sink: SinkFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Never expected (``recordable`` runs before the engine is asked), never a reason
    to lose a record: the header is written with why, the body (and its text) left out, and
    the failed attempt takes no sequence number (the next record follows without a gap)."""
    sink = await make_sink()
    await sink.submit(completion_record(params={"x": deep(300)}, content=("secret-answer",)))
    await sink.submit(completion_record(request_id="req_2"))
    kept, after = await sink.ledger.read(0), await sink.ledger.read(1)
    assert kept is not None and after is not None
    assert kept.header["request_id"] == "req_1" and kept.body == Body()
    assert kept.header["error_code"] == "record_body_unencodable"
    assert (kept.header["sequence"], after.header["sequence"]) == (0, 1)  # the writer's first
    assert "secret-answer" not in caplog.text and "req_1" in caplog.text


def test_recordable_names_the_field_that_cannot_be_recorded() -> None:
    recordable([{"role": "user", "content": "hi"}], {"x": deep(200), "n": 2**64 - 1})
    with pytest.raises(InvalidRequest) as raised:
        recordable([{"role": "user", "content": "hi"}], {"ok": 1, "x": deep(253)})
    assert raised.value.param == "x" and "cannot be recorded" in raised.value.message
    with pytest.raises(InvalidRequest) as raised:
        recordable([{"role": "user", "content": "hi"}], {"seed": 2**64})  # past u64
    assert raised.value.param == "seed"
    with pytest.raises(InvalidRequest) as raised:
        recordable([{"role": "user", "content": deep(253)}], {})
    assert raised.value.param == "messages"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                               max_size=4),
    max_leaves=24,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(JSON, max_size=4), st.dictionaries(st.text(max_size=6), JSON, max_size=4))
def test_the_request_part_encoded_once_gives_the_bodys_own_bytes(
    messages: list[Any], params: dict[str, Any]
) -> None:
    """The intent and the record embed the part ``recordable`` encoded at admission: the
    bytes sealed must be those a fresh encoding of the values gives (keys sorted at every
    level), or a verifier re-encoding a body would not find the ledger's."""
    record = completion_record(messages=messages, params=params,
                               request=recordable(messages, params))  # fmt: skip
    spliced = record_body(record).encode()
    fresh = Body(messages=messages, params=params, reasoning=record.reasoning,
                 content=record.content).encode()  # fmt: skip
    assert spliced == fresh


def test_the_request_part_serves_only_the_objects_it_encoded() -> None:
    messages, params = [{"role": "user", "content": "my SSN"}], {"n": 1}
    part = recordable(messages, params)
    assert part.of(messages, params) is part
    redacted = [{"role": "user", "content": "my [REDACTED]"}]  # a guardrail changed it
    again = part.of(redacted, params)
    assert orjson.dumps(again.encoded[0]) == orjson.dumps(redacted, option=orjson.OPT_SORT_KEYS)
    with pytest.raises(InvalidRequest):
        part.of(messages, {"seed": 2**64})
    # a record whose messages are not the part's own is recorded from its values
    stale = completion_record(messages=redacted, params=params, request=part)
    assert request_fields(stale) == (redacted, params)
    assert b"SSN" not in record_body(stale).encode()
