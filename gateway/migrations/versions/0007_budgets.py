"""Budgets in money (``gateway.admission.spending``).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

from gateway.admission.spending import budgets_table

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    budgets_table.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    op.drop_table("gateway_budgets")
