"""Data keys per tenant and UTC day (retention shreds a day at a time), and an index of the
ledger's records by kind (legal holds and retention settings are records, found by kind).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    # a new ledger's 0001 already made the current tables: add only what is missing
    if "period" not in {c["name"] for c in inspector.get_columns("ledger_data_keys")}:
        op.add_column("ledger_data_keys", sa.Column("period", sa.String(10), nullable=True))
    keys = {i["name"] for i in inspector.get_indexes("ledger_data_keys")}
    if "ledger_data_keys_tenant_period" not in keys:
        op.create_index("ledger_data_keys_tenant_period", "ledger_data_keys",
                        ["tenant", "period"])  # fmt: skip
    if "ledger_entries_kind" not in {i["name"] for i in inspector.get_indexes("ledger_entries")}:
        op.create_index("ledger_entries_kind", "ledger_entries", ["kind", "idx"])


def downgrade() -> None:
    raise NotImplementedError("the ledger is write-once: its tables are never dropped by code")
