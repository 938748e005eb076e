"""The one root of every error the ``audit`` package raises.

``AuditError`` lets the gateway translate them at one boundary (``gateway.ledger.translate``),
with a test that every subclass has its translation. The classes live next to the code that
raises them; ``ValueError`` stays a second base where callers relied on it.
"""

from __future__ import annotations


class AuditError(Exception):
    """Base of the audit package's errors."""
