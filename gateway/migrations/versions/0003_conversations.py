"""Conversations of the Conversations API and their items (``gateway.conversation.conversations``).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

from gateway.conversation.conversations import conversation_items, conversations

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in (conversations, conversation_items):
        table.create(op.get_bind(), checkfirst=True)
        for index in table.indexes:
            index.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    op.drop_table("gateway_conversation_items")
    op.drop_table("gateway_conversations")
