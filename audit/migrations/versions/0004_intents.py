"""Write-ahead intents and the replicas' heartbeats (``audit.intents``).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

from audit.schema import intents, replicas

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replicas.create(op.get_bind(), checkfirst=True)
    intents.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    raise NotImplementedError("the ledger is write-once: its tables are never dropped by code")
