"""Files, batches and their lines (``gateway.batch``).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

from gateway.batch.files import files
from gateway.batch.rows import batches, lines

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in (files, batches, lines):
        table.create(op.get_bind(), checkfirst=True)
        for index in table.indexes:
            index.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    for name in ("gateway_batch_lines", "gateway_batches", "gateway_files"):
        op.drop_table(name)
