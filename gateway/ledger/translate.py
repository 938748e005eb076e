"""The one boundary where the audit package's errors become the gateway's (``AuditError`` in,
``GatewayError`` out), as ``gateway.upstream.pool.translate`` is for the engines' transports.

``translate(exc, param=...)`` knows every subclass of ``audit.errors.AuditError`` (a test walks
the package and checks it). What the audit error says is kept only where it is safe to show: a
proof that is not there says which sizes it lacks; a record that fails to decrypt says nothing
more than that (one opaque error, no oracle); corruption found by a verifier is the operator's
business, not the client's.
"""

from __future__ import annotations

from collections.abc import Callable

from audit.crypto import DecryptionError, KeyFileError
from audit.datakeys import KeysUnavailable
from audit.drivers import DatabaseError
from audit.errors import AuditError
from audit.evidence import EvidenceError
from audit.export import ExportInvalid
from audit.ledger import ProofUnavailable
from audit.merkle import ProofError
from audit.note import NoteError
from audit.record import RecordFormatError
from audit.retention import HoldNotFound, RecordsNotInForce, ShredBlocked
from audit.spool import SpoolBusy, SpoolCorrupt
from audit.tiles import EntryTooLarge, TileError
from audit.timestamps import TimestampError
from audit.verify import LedgerCorrupt
from audit.witness import WitnessError
from audit.writer import WriterUnavailable
from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    LedgerIntegrityError,
    LedgerUnavailable,
    NotFound,
)

_Make = Callable[[AuditError, str | None], GatewayError]
_INTEGRITY = "The ledger's stored data failed its integrity check."
TRANSLATIONS: dict[type[AuditError], _Make] = {
    WriterUnavailable: lambda _e, _p: LedgerUnavailable("The audit ledger cannot store records."),
    DatabaseError: lambda _e, _p: LedgerUnavailable("The audit ledger's database is unavailable."),
    SpoolCorrupt: lambda _e, _p: LedgerUnavailable("The audit ledger cannot store records."),
    SpoolBusy: lambda _e, _p: LedgerUnavailable("The audit ledger cannot store records."),
    KeyFileError: lambda _e, _p: LedgerUnavailable("The audit ledger's keys are unavailable."),
    KeysUnavailable: lambda _e, _p: LedgerUnavailable("The audit ledger's keys are unavailable."),
    DecryptionError: lambda _e, _p: LedgerIntegrityError("The record could not be decrypted."),
    RecordFormatError: lambda _e, _p: LedgerIntegrityError(_INTEGRITY),
    LedgerCorrupt: lambda _e, _p: LedgerIntegrityError(_INTEGRITY),
    ProofError: lambda _e, _p: LedgerIntegrityError(_INTEGRITY),
    NoteError: lambda _e, _p: LedgerIntegrityError(_INTEGRITY),
    ExportInvalid: lambda _e, _p: LedgerIntegrityError(_INTEGRITY),
    ProofUnavailable: lambda e, p: InvalidRequest(f"No proof: {e}.", param=p),
    TileError: lambda e, _p: NotFound(f"No such tile: {e}.", code="tile_not_found"),
    EntryTooLarge: lambda e, _p: Conflict(str(e), code="entry_too_large"),
    WitnessError: lambda e, p: InvalidRequest(f"{e}.", param=p),
    TimestampError: lambda _e, _p: LedgerIntegrityError(_INTEGRITY),
    HoldNotFound: lambda e, p: NotFound(f"{e}.", param=p, code="hold_not_found"),
    ShredBlocked: lambda e, _p: Conflict(f"{e}.", code="legal_hold"),
    RecordsNotInForce: lambda e, _p: LedgerUnavailable(f"{e}."),
    EvidenceError: lambda e, _p: Conflict(f"{e}.", code="no_evidence"),
}


def translate(exc: AuditError, *, param: str | None = None) -> GatewayError:
    """The gateway's error for ``exc`` (``param``: the request parameter it concerns)."""
    for kind in type(exc).__mro__:
        make = TRANSLATIONS.get(kind)
        if make is not None:
            return make(exc, param)
    return LedgerIntegrityError(_INTEGRITY)  # a subclass added without a translation (tested)
