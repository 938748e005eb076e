"""Witness cosignatures and RFC 3161 timestamps of checkpoints.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

from audit.schema import cosignatures, timestamps

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    cosignatures.create(op.get_bind(), checkfirst=True)
    timestamps.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    raise NotImplementedError("the ledger is write-once: its tables are never dropped by code")
