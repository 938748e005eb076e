"""The spool: a local append-only file that holds sealed records while the database is away.

Rules:

- One record per line: ``<checksum> <base64(leaf data)>\\n``, where the checksum is the first
  16 bytes of SHA-256 over the decoded bytes, in hex. Records are already sealed (encrypted):
  the spool never holds a readable trace.
- ``append`` writes a batch with one ``write``, then ``fsync``: when it returns, the batch
  survives a crash of the process (``kill -9``) or of the machine. Only then does the writer
  acknowledge the records.
- A crash mid-``append`` can leave a torn last line (no newline, or a checksum that does not
  match). Those records were never acknowledged, so the torn tail is cut off when the spool is
  opened, before anything is appended after it. A bad line *before* the last one is not a torn
  write but damage: opening (and ``read``) raises ``SpoolCorrupt`` naming the line, and nothing
  is dropped. An ``append`` that fails (disk full, fsync error) truncates what it wrote.
- ``clear`` empties the file after its records reached the database. A crash between the
  database commit and ``clear`` replays the same records again; the store skips those it
  already holds (by ``(writer, sequence)``), so replay is idempotent.

The file is created with mode 0600. This module does blocking file I/O; the async writer calls
it in a worker thread.

Several processes on one spool path (``serve --workers N``, replicas sharing a volume) must not
share the file: one's ``clear`` would drop the other's unacknowledged records. ``claim`` gives
each process a file of its own: the path itself, or ``<stem>.N<suffix>``, the first it can
hold an exclusive ``flock`` on, held for the process's life (the kernel lets go when it dies).
At claim, a process also adopts every other slot no live process holds: their records (a dead
worker's) are appended to its own spool, fsync'd, then the slot is emptied. A crash between the
two replays some records twice, which the store skips, as for ``clear``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from audit.errors import AuditError


class SpoolCorrupt(AuditError):
    """A complete spool line before the end does not check out: damage, not a torn write."""


def _checksum(data: bytes) -> bytes:
    return hashlib.sha256(data).hexdigest()[:32].encode("ascii")


def encode_line(payload: bytes) -> bytes:
    return _checksum(payload) + b" " + base64.b64encode(payload) + b"\n"


def decode_line(line: bytes) -> bytes | None:
    """The payload of one line (without its newline), or ``None`` when it does not check out."""
    checksum, sep, encoded = line.partition(b" ")
    if not sep:
        return None
    try:
        payload = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        return None
    return payload if _checksum(payload) == checksum else None


SLOTS = 256  # spool files per path: more processes than that on one volume is a mistake


class SpoolBusy(AuditError):
    """Every slot of the spool path is held by a live process."""


class Spool:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending = self._recover()
        self._held: int | None = None  # the flock'd descriptor of a claimed slot

    def release(self) -> None:
        """Let go of a claimed slot (the process is stopping); its records stay in the file."""
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def __len__(self) -> int:
        """Records waiting for the database."""
        return self._pending

    def append(self, payloads: Sequence[bytes]) -> None:
        if not payloads:
            return
        data = b"".join(encode_line(p) for p in payloads)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            start = os.fstat(fd).st_size
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError:
                # Refused records must leave no trace: a half line would glue itself to the
                # next, acknowledged batch, and unacknowledged lines would be replayed.
                os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)
        self._pending += len(payloads)

    def read(self) -> list[bytes]:
        """Every spooled record, oldest first."""
        if not self.path.exists():
            return []
        lines = self.path.read_bytes().split(b"\n")
        records = []
        for number, line in enumerate(lines[:-1], start=1):
            payload = decode_line(line)
            if payload is None:
                raise SpoolCorrupt(f"spool line {number} does not match its checksum")
            records.append(payload)
        return records

    def clear(self) -> None:
        if self.path.exists():
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        self._pending = 0

    def _recover(self) -> int:
        """Cut a torn last line; count the good ones; refuse (``SpoolCorrupt``) a spool
        damaged before its last line, so the operator learns it at start, not at replay.
        Creates the parent directory."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            return 0
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1  # 0 when there is no complete line
        last_start = data.rfind(b"\n", 0, keep - 1) + 1 if keep else 0
        if keep and decode_line(data[last_start : keep - 1]) is None:
            keep = last_start  # a complete-looking last line that fails its checksum: torn
        if keep != len(data):
            with self.path.open("r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
        return len(self.read())


def claim(path: Path) -> Spool:
    """This process's spool under ``path`` (above), with any dead process's records adopted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for slot in range(SLOTS):
        candidate = slot_path(path, slot)
        held = _hold(candidate)
        if held is None:
            continue
        try:
            spool = Spool(candidate)
            _adopt(spool, path)
        except BaseException:  # a damaged spool: the process refuses to start, holding nothing
            os.close(held)
            raise
        spool._held = held
        return spool
    raise SpoolBusy(f"all {SLOTS} spool files of {path.name} are held by live processes")


def slot_path(path: Path, slot: int) -> Path:
    return path if slot == 0 else path.with_name(f"{path.stem}.{slot}{path.suffix}")


def _adopt(mine: Spool, path: Path) -> None:
    for slot in range(SLOTS):
        other = slot_path(path, slot)
        if other == mine.path or not other.exists():
            continue
        held = _hold(other)
        if held is None:  # a live process's
            continue
        try:
            orphan = Spool(other)
            records = orphan.read()
            if records:
                mine.append(records)
                orphan.clear()
        finally:
            os.close(held)


def _hold(path: Path) -> int | None:
    """An open descriptor of ``path`` holding its exclusive flock, or None if another has it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
