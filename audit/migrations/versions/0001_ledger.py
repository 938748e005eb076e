"""The ledger: entries, complete-subtree nodes, checkpoints, data keys, write-once triggers.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op

from audit.schema import ledger_metadata, postgres_triggers, sqlite_triggers

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    # The tables are declared once, in audit/schema.py; this first revision creates them as
    # declared there. Later revisions spell out their changes.
    ledger_metadata.create_all(bind)
    triggers = sqlite_triggers() if bind.dialect.name == "sqlite" else postgres_triggers()
    for statement in triggers:
        op.execute(statement)


def downgrade() -> None:
    raise NotImplementedError("the ledger is write-once: its tables are never dropped by code")
