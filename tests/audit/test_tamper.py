"""Tampering that gets past the database (a DBA drops the write-once triggers first) is found by
``verify``, which names the first bad index or checkpoint; and no plaintext reaches the disk.

Every tamper case starts from the same ledger: ``SIZE`` records appended one at a time, so there
is a signed checkpoint at every size 1 .. ``SIZE``; ``verify`` passes on it before the change.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from audit.ledger import Ledger
from audit.merkle import CompactRange, leaf_hash
from audit.note import Checkpoint, NoteSigner
from audit.record import Body, Sealed
from audit.schema import checkpoints, drop_triggers, entries, nodes
from audit.store import Filter
from audit.verify import LedgerCorrupt
from tests.audit.conftest import ORIGIN, LedgerFactory, append_records, completion, execute

SIZE = 8
VICTIM = 3  # a middle record; the first checkpoint that covers it is at size 4


@dataclass
class Scene:
    engine: AsyncEngine
    ledger: Ledger
    signer: NoteSigner  # the ledger's own signing key


Tamper = Callable[[Scene], Awaitable[None]]


async def entry(engine: AsyncEngine, index: int) -> tuple[bytes, bytes]:
    async with engine.connect() as conn:
        query = select(entries.c.header, entries.c.ciphertext).where(entries.c.idx == index)
        row = (await conn.execute(query)).one()
    return bytes(row.header), bytes(row.ciphertext)


async def change(engine: AsyncEngine, *statements: object) -> None:
    async with engine.begin() as conn:
        for statement in statements:
            await conn.execute(statement)  # type: ignore[call-overload]


def set_entry(index: int, **values: object) -> object:
    return update(entries).where(entries.c.idx == index).values(**values)


def evil_header(header: bytes) -> bytes:
    """The same header with another tenant: still canonical JSON, still parses."""
    fields = orjson.loads(header)
    fields["tenant"] = "evil-corp"
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)


# --- the tampers ----------------------------------------------------------------------------


async def flip_ciphertext_byte(scene: Scene) -> None:
    _, ciphertext = await entry(scene.engine, VICTIM)
    flipped = bytearray(ciphertext)
    flipped[len(flipped) // 2] ^= 0x01
    await change(scene.engine, set_entry(VICTIM, ciphertext=bytes(flipped)))


async def change_header_field(scene: Scene) -> None:
    header, _ = await entry(scene.engine, VICTIM)
    await change(scene.engine, set_entry(VICTIM, header=evil_header(header)))


async def change_header_and_leaf_hash(scene: Scene) -> None:
    header, ciphertext = await entry(scene.engine, VICTIM)
    new = Sealed(evil_header(header), ciphertext)
    await change(
        scene.engine,
        set_entry(
            VICTIM, header=new.header, tenant="evil-corp", leaf_hash=leaf_hash(new.leaf_data())
        ),
    )


async def rewrite_header_and_whole_tree(scene: Scene) -> None:
    """A consistent rewrite of everything but the signatures: leaf, columns and every node."""
    await change_header_and_leaf_hash(scene)
    async with scene.engine.connect() as conn:
        query = select(entries.c.leaf_hash).order_by(entries.c.idx)
        leaves = [bytes(r.leaf_hash) for r in await conn.execute(query)]
    tree = CompactRange()
    new_nodes = [node for leaf in leaves for node in tree.append(leaf)]
    await change(
        scene.engine,
        delete(nodes),
        insert(nodes).values([{"level": n.level, "idx": n.index, "hash": h} for n, h in new_nodes]),
    )


async def change_tenant_column(scene: Scene) -> None:
    await change(scene.engine, set_entry(VICTIM, tenant="evil-corp"))


async def change_created_at_column(scene: Scene) -> None:
    """Moves the record out of every time-window search (``Filter.since``/``until``)."""
    async with scene.engine.connect() as conn:
        query = select(entries.c.created_at).where(entries.c.idx == VICTIM)
        created_at = (await conn.execute(query)).scalar_one()
    await change(scene.engine, set_entry(VICTIM, created_at=created_at - 86_400 * 365))


async def change_stored_node(scene: Scene) -> None:
    node = update(nodes).where(nodes.c.level == 1, nodes.c.idx == 1).values(hash=b"\x07" * 32)
    await change(scene.engine, node)


async def delete_middle_row(scene: Scene) -> None:
    await change(scene.engine, delete(entries).where(entries.c.idx == VICTIM))


async def delete_first_row(scene: Scene) -> None:
    await change(scene.engine, delete(entries).where(entries.c.idx == 0))


async def delete_last_row(scene: Scene) -> None:
    await change(scene.engine, delete(entries).where(entries.c.idx == SIZE - 1))


async def swap_two_rows(scene: Scene) -> None:
    await change(
        scene.engine,
        set_entry(VICTIM, idx=-1),
        set_entry(VICTIM + 2, idx=VICTIM),
        set_entry(-1, idx=VICTIM + 2),
    )


async def append_forged_row(scene: Scene) -> None:
    """A record sealed by the ledger's own code, but inserted behind its back (no checkpoint)."""
    sealed = await scene.ledger.seal(completion(99), Body(content=("forged",)))
    header = orjson.loads(sealed.header)
    await change(
        scene.engine,
        insert(entries).values(
            idx=SIZE, writer=header["writer"], sequence=header["sequence"], kind="completion",
            tenant=header["tenant"], key_id=header["key_id"], request_id=header["request_id"],
            model=header["model"], status=header["status"], created_at=header["created_at"],
            header=sealed.header, ciphertext=sealed.ciphertext,
            leaf_hash=leaf_hash(sealed.leaf_data()),
        ),
    )  # fmt: skip


async def checkpoint_row(engine: AsyncEngine, size: int) -> tuple[bytes, str]:
    async with engine.connect() as conn:
        query = select(checkpoints.c.root, checkpoints.c.note).where(checkpoints.c.size == size)
        row = (await conn.execute(query)).one()
    return bytes(row.root), row.note


def set_checkpoint(size: int, **values: object) -> object:
    return update(checkpoints).where(checkpoints.c.size == size).values(**values)


async def note_signed_by_another_key(scene: Scene) -> None:
    root, _ = await checkpoint_row(scene.engine, VICTIM + 1)
    stranger = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())  # same name, other key
    note = stranger.sign(Checkpoint(ORIGIN, VICTIM + 1, root).body())
    await change(scene.engine, set_checkpoint(VICTIM + 1, note=note))


async def note_for_another_root(scene: Scene) -> None:
    note = scene.signer.sign(Checkpoint(ORIGIN, VICTIM + 1, b"\x42" * 32).body())
    await change(scene.engine, set_checkpoint(VICTIM + 1, note=note))


async def note_and_root_for_another_root(scene: Scene) -> None:
    note = scene.signer.sign(Checkpoint(ORIGIN, VICTIM + 1, b"\x42" * 32).body())
    await change(scene.engine, set_checkpoint(VICTIM + 1, note=note, root=b"\x42" * 32))


async def delete_last_checkpoint(scene: Scene) -> None:
    await change(scene.engine, delete(checkpoints).where(checkpoints.c.size == SIZE))


TAMPERS = [
    pytest.param(
        flip_ciphertext_byte, rf"index {VICTIM}: the record does not match its leaf hash",
        id="ciphertext-byte",
    ),
    pytest.param(
        change_header_field, rf"index {VICTIM}: the record does not match its leaf hash",
        id="header-field",
    ),
    pytest.param(
        change_header_and_leaf_hash,
        rf"index {VICTIM}: stored tree node NodeID\(level=0, index={VICTIM}\) is wrong",
        id="header-and-leaf-hash",
    ),
    pytest.param(
        rewrite_header_and_whole_tree,
        rf"checkpoint at size {VICTIM + 1}: the records do not produce its root "
        rf"\(a record between index {VICTIM} and {VICTIM} was changed\)",
        id="header-leaf-and-all-nodes",
    ),
    pytest.param(
        change_tenant_column, rf"index {VICTIM}: column tenant disagrees with the header",
        id="tenant-column",
    ),
    pytest.param(change_created_at_column, rf"index {VICTIM}: ", id="created-at-column"),
    pytest.param(
        change_stored_node, r"index 3: stored tree node NodeID\(level=1, index=1\) is wrong",
        id="stored-node",
    ),
    pytest.param(delete_middle_row, rf"index {VICTIM}: the record is missing", id="delete-middle"),
    pytest.param(delete_first_row, r"index 0: the record is missing", id="delete-first"),
    pytest.param(
        delete_last_row,
        rf"checkpoint at size {SIZE}: the ledger holds only {SIZE - 1} records "
        rf"\(index {SIZE - 1} and later were removed\)",
        id="delete-last",
    ),
    pytest.param(
        swap_two_rows,
        rf"index {VICTIM}: stored tree node NodeID\(level=0, index={VICTIM}\) is wrong",
        id="swap-rows",
    ),
    pytest.param(append_forged_row, rf"index {SIZE}: ", id="forged-row-at-end"),
    pytest.param(
        note_signed_by_another_key, rf"checkpoint at size {VICTIM + 1}: bad signature",
        id="note-other-key",
    ),
    pytest.param(
        note_for_another_root,
        rf"checkpoint at size {VICTIM + 1}: its columns disagree with its note",
        id="note-other-root",
    ),
    pytest.param(
        note_and_root_for_another_root,
        rf"checkpoint at size {VICTIM + 1}: the records do not produce its root",
        id="note-and-root-other-root",
    ),
    pytest.param(
        delete_last_checkpoint,
        rf"index {SIZE - 1}: records from here on are not covered by a checkpoint",
        id="delete-last-checkpoint",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("tamper", "message"), TAMPERS)
async def test_verify_names_the_first_bad_index_or_checkpoint(
    database_url: str, ledger_factory: LedgerFactory, tamper: Tamper, message: str
) -> None:
    ledger = await ledger_factory.open(database_url)
    await append_records(ledger, SIZE)
    engine = ledger_factory.engine(database_url)
    report = await ledger_factory.verify(database_url)
    assert (report.size, report.checkpoints) == (SIZE, SIZE)

    await execute(engine, *drop_triggers(engine.dialect.name))
    await tamper(Scene(engine, ledger, ledger_factory.signer()))

    with pytest.raises(LedgerCorrupt) as caught:
        await ledger_factory.verify(database_url)
    assert re.match(message, str(caught.value)), str(caught.value)


async def test_dropping_the_triggers_alone_changes_nothing(
    database_url: str, ledger_factory: LedgerFactory
) -> None:
    """The control for the cases above: only the tamper makes ``verify`` fail."""
    ledger = await ledger_factory.open(database_url)
    await append_records(ledger, SIZE)
    engine = ledger_factory.engine(database_url)

    await execute(engine, *drop_triggers(engine.dialect.name))

    assert (await ledger_factory.verify(database_url)).size == SIZE
    await change(engine, delete(entries).where(entries.c.idx == SIZE - 1))  # now it can be done
    with pytest.raises(LedgerCorrupt):
        await ledger_factory.verify(database_url)


# --- no plaintext at rest -------------------------------------------------------------------

TENANT = "tenant-findme-3b1c"
MARKERS = {
    "messages": "zqx-message-marker-81f2",
    "params": "zqx-params-marker-09aa",
    "reasoning": "zqx-reasoning-marker-c4d7",
    "content": "zqx-answer-marker-5e30",
}


def secret_body(index: int) -> Body:
    return Body(
        messages=[{"role": "user", "content": f"{MARKERS['messages']} {index}"}],
        params={"user": MARKERS["params"], "temperature": 0.2},
        reasoning=(f"{MARKERS['reasoning']} {index}",),
        content=(f"{MARKERS['content']} {index}",),
    )


async def append_secrets(ledger: Ledger, count: int) -> None:
    for index in range(count):
        await ledger.append(completion(index, tenant=TENANT), secret_body(index))
    opened = await ledger.read(count - 1)  # the markers really went in
    assert opened is not None
    assert opened.body == secret_body(count - 1)


def on_disk(database: Path) -> bytes:
    files = [database, database.with_name(database.name + "-wal")]
    return b"".join(path.read_bytes() for path in files if path.exists())


async def test_sqlite_file_holds_no_plaintext(
    sqlite_url: str, ledger_factory: LedgerFactory
) -> None:
    ledger = await ledger_factory.open(sqlite_url)
    await append_secrets(ledger, 20)
    database = Path(make_url(sqlite_url).database or "")

    raw = on_disk(database)
    assert TENANT.encode() in raw  # the search works: headers are readable on disk
    for field, marker in MARKERS.items():
        assert marker.encode() not in raw, field
    await ledger.aclose()
    await ledger_factory.engine(sqlite_url).dispose()  # checkpoints the WAL into the file
    raw = on_disk(database)
    assert TENANT.encode() in raw
    for field, marker in MARKERS.items():
        assert marker.encode() not in raw, field
    for spool in ledger_factory.directory.glob("spool-*"):
        assert not any(marker.encode() in spool.read_bytes() for marker in MARKERS.values())


async def test_no_column_holds_plaintext(database_url: str, ledger_factory: LedgerFactory) -> None:
    ledger = await ledger_factory.open(database_url)
    await append_secrets(ledger, 10)

    values: list[bytes] = []
    async with ledger_factory.engine(database_url).connect() as conn:
        for table in (entries, nodes, checkpoints):
            for row in await conn.execute(select(table)):
                values += [v if isinstance(v, bytes) else str(v).encode() for v in row]
    everything = b"\n".join(values)
    assert TENANT.encode() in everything
    for field, marker in MARKERS.items():
        assert marker.encode() not in everything, field
    assert len(await ledger.find(Filter(tenant=TENANT), 100)) == 10
