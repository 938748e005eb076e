"""Alembic environment for the ledger tables.

Migrations run inside a connection the caller opened (``audit.migrate.upgrade`` passes it in
``config.attributes["connection"]``), so the async engine of the app, of the CLI or of a test
runs them, with no second URL to configure. The version table is ``ledger_alembic_version``: the
ledger's schema is versioned on its own, apart from the gateway's key table.
"""

from __future__ import annotations

from alembic import context

from audit.schema import ledger_metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=ledger_metadata,
    version_table="ledger_alembic_version",
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
