"""The ledger's contract, on SQLite and on PostgreSQL alike (``database_url`` runs each test on
both): records read back, search and pagination, signed checkpoints whose roots the records
reproduce, RFC 9162 proofs that verify, group commit, async mode, write-once tables,
crypto-shredding, key rotation and export."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.crypto import FileKeyProvider
from audit.export import ExportInvalid, check_export, export_lines
from audit.ledger import Ledger, ProofUnavailable
from audit.merkle import ProofError, verify_consistency, verify_inclusion
from audit.note import NoteError, NoteSigner, NoteVerifier, parse_checkpoint
from audit.record import Facts
from audit.schema import data_keys, entries
from audit.store import Filter
from tests.audit.conftest import (
    BASE_TIME,
    ORIGIN,
    LedgerFactory,
    append_records,
    body,
    completion,
    execute,
    leaf_hashes,
    root_of,
)

N = 13  # odd and not a power of two: the tree has ephemeral right-edge nodes


def signed_head(ledger: Ledger, note: str | None) -> tuple[int, bytes]:
    """``(size, root)`` of a checkpoint note, after checking its signature and origin."""
    assert note is not None
    head = parse_checkpoint(NoteVerifier(ledger.verifier_key()).open(note))
    assert head.origin == ORIGIN
    return head.size, head.root


async def all_indexes(ledger: Ledger) -> list[int]:
    return [listed.index for listed in await ledger.find(Filter(), 10_000)]


# --- records, search, pagination ------------------------------------------------------------


async def test_read_returns_every_body_and_header(ledger: Ledger) -> None:
    facts = await append_records(ledger, N)

    for index, expected in enumerate(facts):
        opened = await ledger.read(index)
        assert opened is not None
        assert opened.index == index
        assert opened.body == body(index)
        assert not opened.destroyed
        assert opened.header["tenant"] == expected.tenant
        assert opened.header["request_id"] == expected.request_id
        assert opened.header["writer"] == ledger.writer_id
        assert opened.header["sequence"] == index
        assert opened.leaf_hash == (await leaf_hashes(ledger, index + 1))[index]
    assert await ledger.read(N) is None
    assert await all_indexes(ledger) == list(range(N))


FILTERS: list[tuple[str, Filter, Callable[[Facts], bool]]] = [
    ("tenant", Filter(tenant="globex"), lambda f: f.tenant == "globex"),
    ("key_id", Filter(key_id="key-b"), lambda f: f.key_id == "key-b"),
    ("request_id", Filter(request_id="req-0007"), lambda f: f.request_id == "req-0007"),
    ("model", Filter(model="deepseek-r1"), lambda f: f.model == "deepseek-r1"),
    ("status", Filter(status="error"), lambda f: f.status == "error"),
    ("kind", Filter(kind="completion"), lambda f: True),
    ("no such kind", Filter(kind="shred"), lambda f: False),
    ("since", Filter(since=BASE_TIME + 4), lambda f: f.created_at >= BASE_TIME + 4),
    ("until", Filter(until=BASE_TIME + 4), lambda f: f.created_at < BASE_TIME + 4),
    (
        "window and tenant",
        Filter(tenant="acme", since=BASE_TIME + 2, until=BASE_TIME + 10),
        lambda f: f.tenant == "acme" and BASE_TIME + 2 <= f.created_at < BASE_TIME + 10,
    ),
    (
        "key and model",
        Filter(key_id="key-a", model="qwen3-8b"),
        lambda f: f.key_id == "key-a" and f.model == "qwen3-8b",
    ),
    ("unknown tenant", Filter(tenant="nobody"), lambda f: False),
]


async def test_find_filters_on_every_column(ledger: Ledger) -> None:
    facts = await append_records(ledger, N)

    selective = 0
    for name, where, wanted in FILTERS:
        expected = [i for i, f in enumerate(facts) if wanted(f)]
        found = await ledger.find(where, 1000)
        assert [listed.index for listed in found] == expected, name
        for listed in found:
            assert listed.header["request_id"] == facts[listed.index].request_id, name
        selective += 0 < len(found) < N
    assert selective >= 8  # the filters are not vacuous: most select some records, not all


@pytest.mark.parametrize("page_size", [1, 4, N])
async def test_find_paginates_with_after(ledger: Ledger, page_size: int) -> None:
    await append_records(ledger, N)

    for where in (Filter(), Filter(tenant="acme")):
        pages: list[list[int]] = []
        while True:
            page = await ledger.find(where, page_size)
            pages.append([listed.index for listed in page])
            if len(page) < page_size:
                break
            where = replace(where, after=page[-1].index)
        joined = [i for page in pages for i in page]
        everything = [listed.index for listed in await ledger.find(replace(where, after=None), N)]
        assert joined == everything
        assert all(len(page) <= page_size for page in pages)


# --- checkpoints and proofs -----------------------------------------------------------------


async def test_latest_checkpoint_signs_the_root_of_the_records(ledger: Ledger) -> None:
    await append_records(ledger, N)
    leaves = await leaf_hashes(ledger, N)

    assert signed_head(ledger, await ledger.checkpoint()) == (N, root_of(leaves))
    for size in range(1, N + 1):  # one commit per record: a checkpoint at every size
        assert signed_head(ledger, await ledger.checkpoint(size)) == (size, root_of(leaves[:size]))
    assert await ledger.checkpoint(N + 1) is None
    stranger = NoteVerifier(NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier_key())
    with pytest.raises(NoteError, match="no signature"):
        stranger.open(await ledger.checkpoint() or "")


async def test_the_published_checkpoint_is_the_newest_with_the_quorum_and_a_stamp(
    ledger: Ledger,
) -> None:
    await append_records(ledger, 6)
    assert await ledger.published() == await ledger.checkpoint()  # nothing asked: the latest
    assert await ledger.published(["w1"], 1) is None
    for size, witness in ((2, "w1"), (2, "w2"), (4, "w1"), (5, "w2"), (5, "w3")):
        await ledger.add_cosignature(size, witness, f"\u2014 {witness} c2l6ZQ{size}\n")
    await ledger.add_timestamp(2, b"stamp")
    await ledger.add_timestamp(4, b"stamp")

    def size_of(note: str | None) -> int | None:
        return None if note is None else parse_checkpoint(note.split("\n\n")[0] + "\n").size

    assert size_of(await ledger.published(["w1", "w2"], 1)) == 5
    assert size_of(await ledger.published(["w1", "w2"], 2)) == 2
    assert size_of(await ledger.published(["w1"], 1)) == 4
    assert size_of(await ledger.published(["w3", "w4"], 1)) == 5  # only configured names count
    assert await ledger.published(["w4"], 1) is None
    assert size_of(await ledger.published(["w1", "w2"], 1, stamped=True)) == 4
    assert size_of(await ledger.published(stamped=True)) == 4
    published = await ledger.published(["w1", "w2"], 2)
    assert published is not None and published.endswith("\u2014 w1 c2l6ZQ2\n\u2014 w2 c2l6ZQ2\n")


async def test_inclusion_proofs_verify_at_several_sizes(ledger: Ledger) -> None:
    await append_records(ledger, N)
    leaves = await leaf_hashes(ledger, N)

    for size in (1, 2, 3, 4, 5, 7, 8, 12, N):
        _, root = signed_head(ledger, await ledger.checkpoint(size))
        for index in range(size):
            proof = await ledger.inclusion(index, size)
            assert (proof.index, proof.tree_size, proof.leaf_hash) == (index, size, leaves[index])
            verify_inclusion(leaves[index], index, size, proof.hashes, root)
            if size > 1:  # the same proof must not pass for a neighbouring leaf
                with pytest.raises(ProofError):
                    verify_inclusion(leaves[index - 1], index, size, proof.hashes, root)


async def test_consistency_proofs_verify_between_checkpoints(ledger: Ledger) -> None:
    await append_records(ledger, N)
    roots = {
        size: signed_head(ledger, await ledger.checkpoint(size))[1] for size in range(1, N + 1)
    }

    pairs = [(s, s + 1) for s in range(1, N)] + [(1, N), (3, 8), (4, 8), (5, N), (N, N)]
    for first, second in pairs:
        proof = await ledger.consistency(first, second)
        verify_consistency(first, second, proof, roots[first], roots[second])
        if first < second:
            with pytest.raises(ProofError):
                verify_consistency(first, second, proof, roots[second], roots[second])


async def test_proofs_beyond_the_tree_are_unavailable(ledger: Ledger) -> None:
    await append_records(ledger, 5)

    with pytest.raises(ProofUnavailable):
        await ledger.inclusion(0, 6)
    with pytest.raises(ProofUnavailable):
        await ledger.inclusion(5, 5)
    with pytest.raises(ProofUnavailable):
        await ledger.consistency(2, 6)
    with pytest.raises(ProofUnavailable):
        await ledger.consistency(0, 5)  # RFC 9162: no consistency proof from size 0
    with pytest.raises(ProofUnavailable):
        await ledger.consistency(4, 2)
    with pytest.raises(ProofUnavailable):
        await ledger.sealed(5)
    assert await ledger.checkpoint(6) is None
    assert await ledger.checkpoint(0) is None


# --- writer modes and group commit ----------------------------------------------------------


async def test_async_mode_persists_everything_by_aclose(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url, mode="async")
    for index in range(50):
        await ledger.append(completion(index), body(index))
    await ledger.aclose()

    assert await all_indexes(ledger) == list(range(50))
    for index in (0, 17, 49):
        opened = await ledger.read(index)
        assert opened is not None
        assert opened.body == body(index)
    assert ledger.stats.committed == 50
    report = await ledger_factory.verify(database_url)
    assert report.size == 50


async def test_concurrent_appends_share_commits(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url)
    count = 200
    await asyncio.gather(*(ledger.append(completion(i), body(i)) for i in range(count)))

    assert ledger.stats.committed == count
    assert 1 <= ledger.stats.batches < count
    assert await all_indexes(ledger) == list(range(count))
    request_ids = sorted(
        listed.header["request_id"] for listed in await ledger.find(Filter(), 1000)
    )
    assert request_ids == [f"req-{i:04d}" for i in range(count)]
    report = await ledger_factory.verify(database_url)
    assert (report.size, report.checkpoints) == (count, ledger.stats.batches)
    size, _ = signed_head(ledger, await ledger.checkpoint())
    assert size == count


# --- write-once at the database -------------------------------------------------------------


async def refused(
    engine: AsyncEngine, *statements: str, params: dict[str, Any] | None = None
) -> str:
    """Run ``statements`` in one transaction; one must fail. Returns the error message."""
    with pytest.raises(DBAPIError) as caught:
        await execute(engine, *statements, **(params or {}))
    return str(caught.value.orig)


async def table_dump(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    dump = {}
    async with engine.connect() as conn:
        for table, key in (("ledger_entries", "idx"), ("ledger_nodes", "level, idx"),
                           ("ledger_checkpoints", "size")):  # fmt: skip
            rows = await conn.execute(text(f"SELECT * FROM {table} ORDER BY {key}"))
            dump[table] = [tuple(row) for row in rows]
    return dump


ENTRY_COLUMNS = (
    "idx, writer, sequence, kind, tenant, key_id, request_id, model, status, created_at, "
    "header, ciphertext, leaf_hash"
)
ENTRY_VALUES = (
    ":idx, :writer, :sequence, :kind, :tenant, :key_id, :request_id, :model, :status, "
    ":created_at, :header, :ciphertext, :leaf_hash"
)


async def entry_row(engine: AsyncEngine, index: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (await conn.execute(select(entries).where(entries.c.idx == index))).one()
    return dict(row._mapping)


async def test_tables_refuse_update_and_delete(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url)
    await append_records(ledger, 4)
    engine = ledger_factory.engine(database_url)
    before = await table_dump(engine)

    statements = [
        "UPDATE ledger_entries SET tenant = 'evil' WHERE idx = 1",
        "UPDATE ledger_entries SET ciphertext = header",
        "DELETE FROM ledger_entries WHERE idx = 3",
        "DELETE FROM ledger_entries",
        "UPDATE ledger_nodes SET hash = hash WHERE level = 1 AND idx = 0",
        "DELETE FROM ledger_nodes WHERE level = 0 AND idx = 3",
        "UPDATE ledger_checkpoints SET note = 'forged' WHERE size = 2",
        "DELETE FROM ledger_checkpoints WHERE size = 4",
    ]
    for statement in statements:
        assert "write-once" in await refused(engine, statement), statement

    assert await table_dump(engine) == before
    assert (await ledger_factory.verify(database_url)).size == 4


async def test_upserts_and_duplicate_identities_are_refused(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url)
    await append_records(ledger, 4)
    engine = ledger_factory.engine(database_url)
    before = await table_dump(engine)
    first = await entry_row(engine, 0)
    insert = f"INSERT INTO ledger_entries ({ENTRY_COLUMNS}) VALUES ({ENTRY_VALUES})"

    # The same idx again, with other content, as an upsert (SQLite >= 3.24 and PostgreSQL).
    upsert = insert + " ON CONFLICT (idx) DO UPDATE SET tenant = excluded.tenant"
    evil = {**first, "writer": "w-evil", "sequence": 7, "tenant": "evil"}
    assert "write-once" in await refused(engine, upsert, params=evil)
    # A new idx that repeats an existing (writer, sequence): a replayed record landing twice.
    message = await refused(engine, insert, params={**first, "idx": 4})
    assert "write-once" in message or "ledger_entries_writer_sequence" in message
    # Nodes and checkpoints refuse an upsert too.
    node_upsert = (
        "INSERT INTO ledger_nodes (level, idx, hash) VALUES (0, 0, :hash) "
        "ON CONFLICT (level, idx) DO UPDATE SET hash = excluded.hash"
    )
    assert "write-once" in await refused(engine, node_upsert, params={"hash": b"\x00" * 32})
    checkpoint_upsert = (
        "INSERT INTO ledger_checkpoints (size, root, note, created_at) "
        "VALUES (1, :root, 'forged', 0) "
        "ON CONFLICT (size) DO UPDATE SET note = excluded.note"
    )
    assert "write-once" in await refused(engine, checkpoint_upsert, params={"root": b"\x00" * 32})

    assert await table_dump(engine) == before
    assert (await ledger_factory.verify(database_url)).size == 4


async def test_sqlite_refuses_insert_or_replace(
    sqlite_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(sqlite_url)
    await append_records(ledger, 4)
    engine = ledger_factory.engine(sqlite_url)
    before = await table_dump(engine)
    first = await entry_row(engine, 0)

    for verb in ("INSERT OR REPLACE", "REPLACE"):
        statement = f"{verb} INTO ledger_entries ({ENTRY_COLUMNS}) VALUES ({ENTRY_VALUES})"
        # Same idx, new identity and content.
        evil = {**first, "writer": "w-evil", "sequence": 7, "tenant": "evil"}
        assert "write-once" in await refused(engine, statement, params=evil), verb
        # New idx, same (writer, sequence): REPLACE would delete row 0 without a DELETE trigger.
        assert "write-once" in await refused(engine, statement, params={**first, "idx": 4}), verb
    assert "write-once" in await refused(
        engine, "INSERT OR REPLACE INTO ledger_nodes (level, idx, hash) VALUES (0, 1, :h)",
        params={"h": b"\x00" * 32},
    )  # fmt: skip
    assert "write-once" in await refused(
        engine,
        "INSERT OR REPLACE INTO ledger_checkpoints (size, root, note, created_at) "
        "VALUES (2, :r, 'forged', 0)",
        params={"r": b"\x00" * 32},
    )

    assert await table_dump(engine) == before
    assert (await ledger_factory.verify(sqlite_url)).size == 4


async def test_postgres_refuses_truncate_even_as_replica(
    postgres_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(postgres_url)
    await append_records(ledger, 4)
    engine = ledger_factory.engine(postgres_url)
    before = await table_dump(engine)

    for table in ("ledger_entries", "ledger_nodes", "ledger_checkpoints"):
        assert "write-once" in await refused(engine, f"TRUNCATE {table}"), table
    # ENABLE ALWAYS: logical-replication mode does not silence the triggers.
    as_replica = "SET LOCAL session_replication_role = replica"
    for statement in ("DELETE FROM ledger_entries WHERE idx = 3", "TRUNCATE ledger_nodes"):
        assert "write-once" in await refused(engine, as_replica, statement), statement

    assert await table_dump(engine) == before
    assert (await ledger_factory.verify(postgres_url)).size == 4


# --- crypto-shredding and key rotation ------------------------------------------------------


async def test_shred_destroys_one_tenant_and_keeps_proofs(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url)
    facts = await append_records(ledger, 9)  # tenants acme, globex, initech in turn
    before = await leaf_hashes(ledger, 9)

    assert await ledger.shred("globex") >= 1
    await ledger.append(completion(9, tenant="globex"), body(9))  # a new key after the shred

    for index, f in enumerate(facts):
        opened = await ledger.read(index)
        assert opened is not None
        assert opened.header["tenant"] == f.tenant
        if f.tenant == "globex":
            assert (opened.body, opened.destroyed) == (None, True), index
        else:
            assert (opened.body, opened.destroyed) == (body(index), False), index
    shreds = await ledger.find(Filter(kind="shred"), 10)
    assert [(s.index, s.header["tenant"]) for s in shreds] == [(9, "globex")]
    statement = NoteVerifier(ledger.verifier_key()).open(shreds[0].header["statement"])
    assert statement.startswith(f"thinkgate shred\n{ORIGIN}\nglobex\n")
    record = await ledger.read(9)
    assert record is not None
    assert (record.body, record.destroyed) == (None, False)  # a system record: nothing to shred
    after = await ledger.read(10)
    assert after is not None
    assert after.body == body(9)

    assert await leaf_hashes(ledger, 9) == before  # shredding touches no record
    report = await ledger_factory.verify(database_url)
    assert report.size == 11
    size, root = signed_head(ledger, await ledger.checkpoint())
    assert (size, root) == (11, root_of(await leaf_hashes(ledger, 11)))
    async with ledger_factory.engine(database_url).connect() as conn:
        query = select(func.count()).where(
            data_keys.c.tenant == "globex", data_keys.c.wrapped.is_not(None)
        )
        assert (await conn.execute(query)).scalar() == 1  # only the key made after the shred


async def test_key_rotation_rewraps_and_old_records_still_open(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    first = await ledger_factory.open(database_url)
    await append_records(first, 6)
    await first.aclose()
    engine = ledger_factory.engine(database_url)
    async with engine.connect() as conn:
        keys_before = (await conn.execute(select(func.count()).select_from(data_keys))).scalar()
    assert keys_before is not None and keys_before >= 3  # one per tenant at least

    new_kek = FileKeyProvider.rotate(ledger_factory.key_file)
    provider = FileKeyProvider.load(ledger_factory.key_file)
    assert provider.primary_id == new_kek
    second = await ledger_factory.open(database_url, provider=provider)
    assert await second.rotate_keys() == keys_before
    assert await second.rotate_keys() == 0  # nothing left under the old KEK
    async with engine.connect() as conn:
        kek_ids = {r.kek_id for r in await conn.execute(select(data_keys.c.kek_id))}
    assert kek_ids == {new_kek}

    # A provider that holds only the new KEK opens the old records: they really were rewrapped.
    document = json.loads(ledger_factory.key_file.read_text())
    only_new = FileKeyProvider(new_kek, {new_kek: base64.b64decode(document["keys"][new_kek])})
    third = await ledger_factory.open(database_url, provider=only_new)
    for index in range(6):
        opened = await third.read(index)
        assert opened is not None
        assert opened.body == body(index)
    await third.append(completion(6), body(6))
    assert (await ledger_factory.verify(database_url)).size == 7


# --- export ---------------------------------------------------------------------------------


async def collect(ledger: Ledger, where: Filter) -> list[bytes]:
    return [line async for line in export_lines(ledger, where)]


async def test_export_checks_offline_and_detects_a_changed_record(ledger: Ledger) -> None:
    await append_records(ledger, N)
    verifier = NoteVerifier(ledger.verifier_key())

    lines = await collect(ledger, Filter())
    assert len(lines) == N + 1
    report = check_export(lines, verifier)
    assert (report.tree_size, report.records) == (N, N)
    acme = await collect(ledger, Filter(tenant="acme"))
    assert check_export(acme, verifier).records == len(await ledger.find(Filter(tenant="acme"), N))

    record: dict[str, Any] = orjson.loads(lines[5])
    ciphertext = bytearray(base64.b64decode(record["ciphertext"]))
    ciphertext[-1] ^= 1
    record["ciphertext"] = base64.b64encode(bytes(ciphertext)).decode()
    tampered = [*lines[:5], orjson.dumps(record), *lines[6:]]
    with pytest.raises(ExportInvalid, match=r"^line 6: record 4 is not included"):
        check_export(tampered, verifier)
    stranger = NoteVerifier(NoteSigner(ORIGIN, Ed25519PrivateKey.generate()).verifier_key())
    with pytest.raises(ExportInvalid, match=r"^line 1:"):
        check_export(lines, stranger)


async def test_an_empty_ledger_has_no_checkpoint_and_verifies(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(database_url)

    assert await ledger.checkpoint() is None
    assert await ledger.find(Filter(), 10) == []
    assert await collect(ledger, Filter()) == []
    report = await ledger_factory.verify(database_url)
    assert (report.size, report.checkpoints) == (0, 0)


async def test_reopening_continues_the_same_tree(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    first = await ledger_factory.open(database_url)
    await append_records(first, 5)
    await first.aclose()
    second = await ledger_factory.open(database_url)  # migrations run again: a no-op
    await append_records(second, 4, start=5)

    assert second.writer_id != first.writer_id
    assert await all_indexes(second) == list(range(9))
    _, root5 = signed_head(second, await second.checkpoint(5))
    _, root9 = signed_head(second, await second.checkpoint(9))
    verify_consistency(5, 9, await second.consistency(5, 9), root5, root9)
    assert (await ledger_factory.verify(database_url)).size == 9
    opened = await second.read(2)
    assert opened is not None
    assert opened.body == body(2)
