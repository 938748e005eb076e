"""Stored responses of the Responses API (``gateway.conversation.store``).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

from gateway.conversation.store import responses

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    responses.create(op.get_bind(), checkfirst=True)
    for index in responses.indexes:
        index.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    op.drop_table("gateway_responses")
