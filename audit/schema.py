"""The ledger's tables and the database rules that make them write-once.

Tables (same schema on SQLite and PostgreSQL; created by the Alembic migrations in
``audit/migrations``, never by ``create_all``):

- ``ledger_entries``: one row per record, ``idx`` is the Merkle leaf index (0, 1, 2, ... with no
  gaps). ``header`` and ``ciphertext`` are the record; ``leaf_hash`` and the searchable columns
  are derived from them (``ledger verify`` checks that they agree). ``(writer, sequence)`` is
  unique: a replayed record cannot land twice.
- ``ledger_nodes``: the hash of every *complete* subtree, ``(level, idx)`` as in
  ``audit.merkle.NodeID``. Complete subtrees never change, so this table is insert-only too;
  any proof needs O(log n) of them.
- ``ledger_checkpoints``: every signed tree head (C2SP tlog-checkpoint note), by tree size.
- ``ledger_data_keys``: tenant data keys, one per tenant and UTC day (``period``), wrapped
  (AES-KW) under a key-encryption key. The only mutable table: key rotation re-wraps a row,
  crypto-shredding (a tenant's, or retention's of a day) erases ``wrapped``.

Write-once is enforced by the database, not only by this code: on SQLite, ``BEFORE UPDATE`` and
``BEFORE DELETE`` triggers abort, and a ``BEFORE INSERT`` trigger refuses a row whose key exists
(``INSERT OR REPLACE`` would otherwise delete and re-insert it without firing the delete
trigger). On PostgreSQL, row triggers refuse UPDATE and DELETE (``INSERT ... ON CONFLICT DO
UPDATE`` fires them too), a statement trigger refuses TRUNCATE, and all are ``ENABLE ALWAYS``
so ``session_replication_role = replica`` does not silence them. A superuser can still drop a
trigger; that is what signed checkpoints held outside the database are for.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)

ledger_metadata = MetaData()

entries = Table(
    "ledger_entries",
    ledger_metadata,
    Column("idx", BigInteger, primary_key=True, autoincrement=False),
    Column("writer", String(64), nullable=False),
    Column("sequence", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("tenant", String(64), nullable=False),
    Column("key_id", String(64), nullable=False),
    Column("request_id", String(128), nullable=False),
    Column("model", String(256), nullable=False),
    Column("status", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("header", LargeBinary, nullable=False),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("leaf_hash", LargeBinary(32), nullable=False),
    UniqueConstraint("writer", "sequence", name="ledger_entries_writer_sequence"),
    Index("ledger_entries_tenant_idx", "tenant", "idx"),
    Index("ledger_entries_request_id", "request_id"),
    Index("ledger_entries_key_id", "key_id", "idx"),
    Index("ledger_entries_created_at", "created_at"),
)

nodes = Table(
    "ledger_nodes",
    ledger_metadata,
    Column("level", SmallInteger, primary_key=True, autoincrement=False),
    Column("idx", BigInteger, primary_key=True, autoincrement=False),
    Column("hash", LargeBinary(32), nullable=False),
)

checkpoints = Table(
    "ledger_checkpoints",
    ledger_metadata,
    Column("size", BigInteger, primary_key=True, autoincrement=False),
    Column("root", LargeBinary(32), nullable=False),
    Column("note", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

# Witness cosignatures of checkpoints (C2SP tlog-cosignature lines), one per witness and size;
# added by migration 0002 (not part of 0001's create_all).
cosignature_metadata = MetaData()
cosignatures = Table(
    "ledger_cosignatures",
    cosignature_metadata,
    Column("size", BigInteger, primary_key=True, autoincrement=False),
    Column("witness", String(256), primary_key=True),
    Column("line", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)

# RFC 3161 timestamps of checkpoints (the TSA's whole TimeStampResp, DER); migration 0002.
timestamps = Table(
    "ledger_timestamps",
    cosignature_metadata,
    Column("size", BigInteger, primary_key=True, autoincrement=False),
    Column("reply", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
)

# Write-ahead intents (migration 0004; ``audit.intents``): one row per exchange whose answer
# has begun and whose record is not yet in the ledger, with its writer's replica (``owner``);
# the record's commit deletes it, a sweep turns one whose owner stopped beating into a
# ``replica_lost`` record. Mutable by design (rows come and go): not part of the Merkle tree.
intent_metadata = MetaData()
intents = Table(
    "ledger_intents",
    intent_metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(64), nullable=False, index=True),
    Column("tenant", String(64), nullable=False),
    Column("request_id", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("header", LargeBinary, nullable=False),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("progress", Text, nullable=True),  # JSON: first token, tokens so far (the beat's)
)
# Each replica's heartbeat (its ledger writer id), beaten in the transaction that inserts its
# intents too, so an intent is never in the database without a beat at least as new.
replicas = Table(
    "ledger_replicas",
    intent_metadata,
    Column("id", String(64), primary_key=True),
    Column("heartbeat_at", Float, nullable=False, index=True),
    Column("started_at", Float, nullable=False),
)

data_keys = Table(
    "ledger_data_keys",
    ledger_metadata,
    Column("dek_id", String(64), primary_key=True),
    Column("tenant", String(64), nullable=False, index=True),
    Column("kek_id", String(64), nullable=False),
    Column("wrapped", LargeBinary, nullable=True),  # NULL once shredded
    Column("created_at", Float, nullable=False),
    Column("destroyed_at", Float, nullable=True),
    # the UTC day ("2026-12-02") whose records the key seals (migration 0003): retention
    # shreds a tenant's records a day at a time; NULL for the keys made before it (any day)
    Column("period", String(10), nullable=True),
)

WRITE_ONCE = {
    "ledger_entries": ("idx",),
    "ledger_nodes": ("level", "idx"),
    "ledger_checkpoints": ("size",),
}


def sqlite_triggers() -> list[str]:
    statements = []
    for table, key in WRITE_ONCE.items():
        same_key = " AND ".join(f"{c} = NEW.{c}" for c in key)
        if table == "ledger_entries":
            same_key = f"({same_key}) OR (writer = NEW.writer AND sequence = NEW.sequence)"
        abort = f"SELECT RAISE(ABORT, '{table} is write-once');"
        statements += [
            f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} BEGIN {abort} END",
            f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} BEGIN {abort} END",
            f"CREATE TRIGGER {table}_no_replace BEFORE INSERT ON {table} "
            f"WHEN EXISTS (SELECT 1 FROM {table} WHERE {same_key}) BEGIN {abort} END",
        ]
    return statements


POSTGRES_FUNCTION = """
CREATE FUNCTION ledger_write_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is write-once: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def postgres_triggers() -> list[str]:
    statements = [POSTGRES_FUNCTION]
    for table in WRITE_ONCE:
        statements += [
            f"CREATE TRIGGER {table}_write_once BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION ledger_write_once()",
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION ledger_write_once()",
            f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_write_once",
            f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_no_truncate",
        ]
    return statements


def drop_triggers(dialect: str) -> list[str]:
    """What a DBA would run to bypass the rules (tests that tamper use it)."""
    if dialect == "sqlite":
        return [
            f"DROP TRIGGER IF EXISTS {table}_{suffix}"
            for table in WRITE_ONCE
            for suffix in ("no_update", "no_delete", "no_replace")
        ]
    return [
        f"DROP TRIGGER IF EXISTS {table}_{suffix} ON {table}"
        for table in WRITE_ONCE
        for suffix in ("write_once", "no_truncate")
    ]
