"""Alembic environment for the gateway's own tables (the key store).

As the ledger's (``audit/migrations/env.py``): migrations run inside the connection the caller
opened (``gateway.db.upgrade_schema``), and the version table is the gateway's own,
``gateway_alembic_version``, apart from the ledger's.
"""

from __future__ import annotations

from alembic import context

from gateway.db import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table="gateway_alembic_version",
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
