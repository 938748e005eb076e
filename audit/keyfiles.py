"""Writing secret files: created with mode 0600 from the first byte, durably, never replaced
by accident. Shared by the key-encryption key file and the signing key."""

from __future__ import annotations

import os
from pathlib import Path


def write_exclusive(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the start (never briefly world-readable), durably;
    ``FileExistsError`` if it exists. Parent directories are created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX: the entry lives in the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
