"""The key store: one row per key (its SHA-256, never the secret), tenant, role, policy.

Revision ID: 0001
Revises:

A deployment that predates migrations has the table already (``create_all`` made it at start):
``checkfirst`` leaves it as it is, and the revision is stamped.
"""

from __future__ import annotations

from alembic import op

from gateway.auth.keystore import api_keys

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    api_keys.create(op.get_bind(), checkfirst=True)
    for index in api_keys.indexes:
        index.create(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    raise NotImplementedError("keys are revoked, never dropped by code")
