"""The SIEM export: every ledger record's metadata as an OCSF API Activity event (docs/siem.md).

``ocsf`` maps a record header to an event and ``syslog`` frames it (both sans-I/O); ``sinks``
delivers batches (syslog over TCP/TLS, a JSON-lines file, Splunk HEC); ``cursor`` keeps where
the export stands and which replica runs it; ``exporter`` runs the rounds.
"""
