"""Background responses and their stream events (``gateway.conversation.background``).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

from gateway.conversation.background import background, events

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in (background, events):
        table.create(op.get_bind(), checkfirst=True)
        for index in table.indexes:
            index.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    op.drop_table("gateway_background_events")
    op.drop_table("gateway_background")
