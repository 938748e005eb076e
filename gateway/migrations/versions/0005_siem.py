"""The SIEM export's cursor and lease (``gateway.side.siem.cursor``).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

from gateway.side.siem.cursor import siem_export

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    siem_export.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    op.drop_table("gateway_siem_export")
