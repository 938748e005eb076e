"""The ``thinkgate ledger`` commands: init, verify (online and offline), export (and its
evidence bundle), shred, rotate-kek.

``verify`` and ``export`` need only the database and the public half of the signing key: no
decryption key is loaded. Offline ``verify --export FILE --public-key FILE`` needs neither
database nor any secret. A progress bar (rich) is drawn on stderr when it is a terminal.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, TextIO

import orjson

from audit import evidence, timestamps
from audit.crypto import FileKeyProvider
from audit.export import check_export, export_lines
from audit.ledger import Ledger, LedgerReader
from audit.migrate import upgrade
from audit.note import NoteError, NoteSigner, NoteVerifier, load_signing_key
from audit.store import DB_ERRORS, Filter
from audit.verify import Report, verify
from audit.witness import CosignerKey, WitnessError, WitnessPolicy
from gateway.db import create_engine, upgrade_schema
from gateway.ledger.sink import ensure_keys, log_origin, open_ledger
from gateway.settings import Settings

Progress = Callable[[int, int], None]


async def init(settings: Settings) -> list[str]:
    """Create the key files that are missing (never overwriting one) and bring the ledger's
    and the key store's schemas to their current migration. Run it once with a database role
    that may create tables; the gateway itself then needs only SELECT and INSERT on the ledger
    (docs/ledger.md)."""
    made = ensure_keys(settings.ledger, create=True)
    engine = create_engine(settings.database_url)
    try:
        await upgrade(engine)
        await upgrade_schema(engine)
    finally:
        await engine.dispose()
    return made


async def with_origin(settings: Settings) -> Settings:
    """``settings`` naming the log as it names itself (``gateway.ledger.sink.log_origin``)."""
    engine = create_engine(settings.database_url)
    try:
        origin = await log_origin(settings.ledger, engine)
        return settings.model_copy(update={"audit_origin": origin})
    finally:
        await engine.dispose()


def verifier_key(settings: Settings) -> str:
    """The public ``<name>+<id>+<key>`` string auditors pin; the private key stays here.
    ``settings.audit_origin`` must be resolved (``with_origin``)."""
    signer = NoteSigner(settings.audit_origin, load_signing_key(settings.signing_key_file))
    return signer.verifier_key()


def load_verifier(settings: Settings, public_key: Path | None) -> NoteVerifier:
    """The checkpoint verifier: from ``public_key`` (a ``<name>+<id>+<key>`` file, all an
    auditor holds) when given, else derived from ``SIGNING_KEY_FILE``."""
    if public_key is not None:
        return verifier_file(public_key)
    try:
        return NoteVerifier(verifier_key(settings))
    except (OSError, ValueError) as exc:
        raise KeyUnavailable(f"cannot derive the verifier key from {settings.signing_key_file} "
                             f"(pass --public-key, or {settings.file_hint('signing_key_file')})"
                             f": {exc}") from None  # fmt: skip


class KeyUnavailable(Exception):
    pass


async def verify_database(settings: Settings, verifier: NoteVerifier, progress: Progress) -> Report:
    """Needs the database and the public key only: nothing is decrypted."""
    engine = create_engine(settings.database_url)
    try:
        return await verify(engine, verifier, settings.audit_origin, progress,
                            pending_ok=settings.checkpoint_interval_ms > 0)  # fmt: skip
    finally:
        await engine.dispose()


def export_origin(export: Path) -> str:
    """The origin line of an export's checkpoint (``""`` if it cannot be read: the export's
    own check then says what is wrong)."""
    try:
        return export_checkpoint(export).split("\n", 1)[0]
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def verify_export(export: Path, verifier: NoteVerifier) -> tuple[int, int]:
    """``(tree size, records)`` of a verified export file; raises ``ExportInvalid`` (the export
    fails its checks) or ``KeyUnavailable`` (the file cannot be read), each naming the file and
    what is wrong with it."""
    try:
        lines = export.open("rb")
    except OSError as exc:
        raise KeyUnavailable(f"cannot read the export file {export}: {exc.strerror}") from None
    with lines:
        report = check_export(lines, verifier)
    return report.tree_size, report.records


def verifier_file(public_key: Path) -> NoteVerifier:
    """The verifier key in ``public_key`` (all an auditor holds); ``KeyUnavailable`` naming
    the file and the problem."""
    text = str(public_key)
    if not public_key.exists() and text.count("+") >= 2:
        raise KeyUnavailable(f"--public-key takes a file, and {text[:40]}… looks like the key "
                             "itself: save it to a file and pass that")  # fmt: skip
    try:
        vkey = public_key.read_text().strip()
    except OSError as exc:
        raise KeyUnavailable(f"cannot read the verifier key file {public_key}: "
                             f"{exc.strerror}") from None  # fmt: skip
    try:
        return NoteVerifier(vkey)
    except NoteError as exc:
        raise KeyUnavailable(f"{public_key} is not a note verifier key "
                             f"(<name>+<hash>+<key>): {exc}") from None  # fmt: skip


@asynccontextmanager
async def opened(settings: Settings) -> AsyncIterator[Ledger]:
    engine = create_engine(settings.database_url)
    try:
        ledger = await open_ledger(settings.ledger, engine)
        try:
            yield ledger
        finally:
            await ledger.aclose()
    finally:
        await engine.dispose()


async def export_to(settings: Settings, where: Filter, out: BinaryIO) -> int:
    """Reads the database only: no key is loaded, no writer started."""
    count = -1  # the first line is the checkpoint
    engine = create_engine(settings.database_url)
    try:
        async for line in export_lines(LedgerReader(engine), where):
            out.write(line)
            count += 1
    finally:
        await engine.dispose()
    out.flush()
    return max(count, 0)


async def export_evidence(settings: Settings, where: Filter, out: Path) -> tuple[int, str]:
    """Write the evidence bundle (``audit.evidence``, docs/evidence.md) of the records
    ``where`` selects to ``out``; the exit code and the line to print. Reads the database, the
    public half of the signing key, the witnesses' keys and ``TSA_ROOTS_FILE``; the tar is
    written beside ``out`` and renamed into place, so a failed export leaves none behind."""
    try:
        with tempfile.TemporaryFile() as records:
            made = await _gather_evidence(settings, where, records)
            files = evidence.members(made, evidence.verifier_source())
            _write_atomically(out, files, records)
    except evidence.EvidenceError as exc:
        return 1, f"no evidence bundle: {exc}"
    except KeyUnavailable as exc:
        return 2, str(exc)
    except DB_ERRORS as exc:
        return 2, f"cannot read the ledger database ({type(exc).__name__})"
    head = made.checkpoint
    when = made.stamped_at()
    stamp = (f"stamped {when.isoformat()}" if when is not None else
             "not stamped: no RFC 3161 timestamp covers its newest record yet")  # fmt: skip
    return 0, (f"wrote {out}: {made.records} records proven against the checkpoint of size "
               f"{head.size} ({stamp}; cosigned by {len(made.cosigned())} of "
               f"{len(made.witness_keys)} witnesses)")  # fmt: skip


async def _gather_evidence(
    settings: Settings, where: Filter, records: BinaryIO
) -> evidence.Evidence:
    """The bundle's parts, the export lines written to ``records``."""
    settings = await with_origin(settings)
    try:
        log_key = verifier_key(settings)
    except (OSError, ValueError) as exc:
        raise KeyUnavailable(f"cannot derive the verifier key from "
                             f"{settings.signing_key_file}: {exc}") from None  # fmt: skip
    roots = None
    if settings.tsa_roots_file is not None:
        try:
            roots = await asyncio.to_thread(settings.tsa_roots_file.read_bytes)
        except OSError as exc:
            raise KeyUnavailable(f"cannot read the TSA roots file {settings.tsa_roots_file}: "
                                 f"{exc.strerror}") from None  # fmt: skip
    engine = create_engine(settings.database_url)
    try:
        reader = LedgerReader(engine)
        note = await _evidence_checkpoint(reader, settings, where)
        size = evidence.tree_size(note)
        stamp = (await reader.timestamps([size])).get(size)
        lines = -1  # the first line is the checkpoint
        async for line in export_lines(reader, where, note):
            records.write(line)
            lines += 1
    finally:
        await engine.dispose()
    return evidence.Evidence(
        note, log_key, max(lines, 0), evidence.Selection(where.tenant, where.since, where.until),
        stamp, roots, tuple(w.key for w in settings.witnesses),
    )  # fmt: skip


async def _evidence_checkpoint(reader: LedgerReader, settings: Settings, where: Filter) -> str:
    """The checkpoint the bundle proves its records against (``evidence.choose``): stamped
    and cosigned by the publishing quorum, else stamped, else cosigned, else the latest."""
    latest = await reader.checkpoint()
    if latest is None:
        return evidence.choose([], None)  # raises EvidenceError: nothing to prove against
    names, quorum, _ = settings.publish_policy
    candidates = [
        await reader.published(names, quorum, stamped=True) if quorum else None,
        await reader.published(stamped=True),
        await reader.published(names, quorum) if quorum else None,
        latest,
    ]
    last = await reader.last_index(replace(where, up_to=evidence.tree_size(latest)))
    return evidence.choose(candidates, last)


def _write_atomically(out: Path, files: list[tuple[str, bytes]], records: BinaryIO) -> None:
    size = records.tell()
    partial = out.with_name(f"{out.name}.partial")
    try:
        with partial.open("wb") as tar:
            evidence.write_bundle(tar, files, records, size, time.time())
        partial.replace(out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise KeyUnavailable(f"cannot write {out}: {exc.strerror}") from None


async def shred(settings: Settings, tenant: str) -> int:
    async with opened(settings) as ledger:
        return await ledger.shred(tenant)


async def rotate_kek(settings: Settings) -> tuple[str, int]:
    """Add a new primary KEK to the key file, then re-wrap every live tenant key under it."""
    new_id = FileKeyProvider.rotate(settings.ledger_key_file)
    async with opened(settings) as ledger:
        return new_id, await ledger.rotate_keys()


@contextmanager
def progress_bar(enabled: bool, out: TextIO | None = None) -> Iterator[Progress]:
    """``ledger verify``'s progress on a terminal: one line on stderr, rewritten at most ten
    times a second and erased at the end (no library: a progress library's import alone made
    httpx load its own command-line client into every gateway process)."""
    if not enabled:
        yield lambda done, total: None
        return
    stream = sys.stderr if out is None else out
    shown = -1.0

    def show(done: int, total: int) -> None:
        nonlocal shown
        now = time.monotonic()
        if now - shown < 0.1 and done < total:
            return
        shown = now
        share = f" ({done * 100 // total} %)" if total else ""
        stream.write(f"\rverifying {done:,} of {total:,} records{share}\x1b[K")
        stream.flush()

    try:
        yield show
    finally:
        stream.write("\r\x1b[K")
        stream.flush()


def load_policy(paths: list[Path], quorum: int | None) -> WitnessPolicy | None:
    """The witness policy of ``--witness-key`` files and ``--quorum`` (default: all of them);
    ``None`` without keys. ``KeyUnavailable`` naming a file that is not a cosigner key."""
    if not paths:
        if quorum:
            raise KeyUnavailable("--quorum needs --witness-key files")
        return None
    keys = []
    for path in paths:
        try:
            keys.append(CosignerKey.parse(path.read_text()))
        except OSError as exc:
            raise KeyUnavailable(f"cannot read the witness key file {path}: "
                                 f"{exc.strerror}") from None  # fmt: skip
        except WitnessError as exc:
            raise KeyUnavailable(f"{path}: {exc}") from None
    wanted = len(keys) if quorum is None else quorum
    if not 1 <= wanted <= len(keys):
        raise KeyUnavailable(f"--quorum must be 1 to {len(keys)} (the witness keys given)")
    return WitnessPolicy(tuple(keys), wanted)


def export_checkpoint(export: Path) -> str:
    """The checkpoint (with its cosignatures) an export was proven against: its first line."""
    with export.open("rb") as lines:
        note: str = orjson.loads(lines.readline())["checkpoint"]
    return note


async def witnessed_checkpoint(settings: Settings, policy: WitnessPolicy) -> str:
    """The newest checkpoint stored with cosignatures by ``policy.quorum`` of its witnesses
    (by name; ``policy.check`` then verifies them). ``WitnessError`` if none has them yet:
    witnesses cosign a moment after a commit, so the latest may not be the one."""
    names = [key.name for key in policy.keys]
    engine = create_engine(settings.database_url)
    try:
        note = await LedgerReader(engine).published(names, policy.quorum)
    finally:
        await engine.dispose()
    if note is None:
        raise WitnessError(f"no checkpoint carries cosignatures by {policy.quorum} of "
                           f"{', '.join(names)}")  # fmt: skip
    return note


async def verify_timestamps(
    settings: Settings, roots_file: Path
) -> tuple[int, tuple[int, str] | None]:
    """Every stored RFC 3161 timestamp checked against its checkpoint and ``roots_file``:
    ``(count, (size, time) of the latest)``; ``TimestampError`` naming the first bad one."""
    try:
        roots = timestamps.load_roots(await asyncio.to_thread(roots_file.read_bytes))
    except OSError as exc:
        raise KeyUnavailable(f"cannot read the TSA roots file {roots_file}: "
                             f"{exc.strerror}") from None  # fmt: skip
    engine = create_engine(settings.database_url)
    try:
        stored = await LedgerReader(engine).all_timestamps()
    finally:
        await engine.dispose()
    last = None
    for size, reply, note in stored:
        try:
            when = timestamps.verify(reply, note.split("\n\n", 1)[0] + "\n", roots)
        except timestamps.TimestampError as exc:
            raise timestamps.TimestampError(f"checkpoint {size}: {exc}") from None
        last = (size, when.isoformat())
    return len(stored), last
