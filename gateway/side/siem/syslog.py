"""Syslog messages for the SIEM export: RFC 5424 messages, RFC 6587 octet-counted (sans-I/O).

Rules:

- One event is one message: ``<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID - MSG``
  (RFC 5424 §6), the OCSF JSON as the MSG. No structured data (``-``): everything is in the
  JSON. The MSG is sent as MSG-ANY, without the UTF-8 BOM RFC 5424 §6.4 allows, because JSON
  parsers downstream would take a BOM for garbage; orjson's output is UTF-8 either way.
- PRI = facility × 8 + severity (§6.2.1). Facility 13, *log audit*: these are audit records.
  The severity follows the event's OCSF ``severity_id`` (``SEVERITY``).
- TIMESTAMP is the record's own time (when it was originated, §6.2.3), UTC, milliseconds,
  so a message sent twice (at-least-once) is the same message twice.
- HOSTNAME, APP-NAME, PROCID and MSGID are PRINTUSASCII (33..126) of at most 255, 48, 128
  and 32 octets; anything else is dropped, and an empty field is the NILVALUE ``-``. MSGID
  is the record's kind (``completion``, ``access``, ``shred``...), for routing rules.
- Framing over TCP is octet counting (RFC 6587 §3.4.1: ``MSG-LEN SP SYSLOG-MSG``), which
  rsyslog, syslog-ng and the SIEM collectors read, and which needs no escaping of newlines.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

from gateway.side.siem.ocsf import OcsfEvent

FACILITY: Final = 13  # log audit (RFC 5424, table 1)
APP_NAME: Final = "thinkgate"
# OCSF severity_id -> syslog severity (RFC 5424, table 2): Informational and Unknown ->
# informational (6), Low -> notice (5), Medium -> warning (4), High -> error (3),
# Critical -> critical (2), Fatal -> alert (1), Other -> notice (5).
SEVERITY: Final = {0: 6, 1: 6, 2: 5, 3: 4, 4: 3, 5: 2, 6: 1, 99: 5}
NIL: Final = "-"


def message(event: OcsfEvent, hostname: str, procid: str) -> bytes:
    """The RFC 5424 message of ``event``."""
    pri = FACILITY * 8 + SEVERITY.get(event.severity_id, 5)
    fields = (timestamp(event.time_ms), field(hostname, 255), field(APP_NAME, 48),
              field(procid, 128), field(event.kind, 32), NIL)  # fmt: skip
    return f"<{pri}>1 {' '.join(fields)} ".encode("ascii") + event.json


def frame(message: bytes) -> bytes:
    """``message`` octet-counted for a TCP stream (RFC 6587 §3.4.1)."""
    return b"%d %s" % (len(message), message)


def frames(events: Iterable[OcsfEvent], hostname: str, procid: str) -> bytes:
    """The framed messages of ``events``, one after the other, ready for one write."""
    return b"".join(frame(message(event, hostname, procid)) for event in events)


def timestamp(time_ms: int) -> str:
    """RFC 5424 §6.2.3 TIMESTAMP in UTC with milliseconds: ``2024-05-01T12:00:00.123Z``."""
    seconds, millis = divmod(time_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def field(value: str, limit: int) -> str:
    """A header field: PRINTUSASCII only, at most ``limit`` octets, ``-`` when empty."""
    kept = "".join(c for c in value if 33 <= ord(c) <= 126)[:limit]
    return kept or NIL
