"""The typed completion record, the sink port and the audit ledger behind it."""
