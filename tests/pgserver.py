"""A PostgreSQL server of a test session's own, which a test may kill and start again.

The shared PostgreSQL (``TEST_DATABASE_URL``) serves every worker at once, so no test may take
it away; tests about a database that dies mid-run use this one instead:

- ``PgServer.create(base)``: ``initdb`` (as the ``postgres`` OS user when run as root, since
  initdb refuses root) into a fresh directory that user owns, then the postmaster, started on a
  port of its own, TCP on 127.0.0.1 only, trust auth, ``fsync`` off and small buffers: a test
  server, durable against its own process dying (which is all ``kill`` does), not against the
  machine's.
- ``kill()`` SIGKILLs the postmaster and every backend at once (they share a process group),
  as a crash of the server would: clients see their connections die, nothing is
  flushed or checkpointed. ``start()`` starts it again on the same port and data directory;
  it runs crash recovery and is ready when the postmaster says so (``postmaster.pid``).
- ``close()`` stops it and removes the directory.

The postmaster is this process's own child (``Popen(user=...)`` execs it directly, no ``su``
in between), so a killed one is reaped here at once and its pid is never seen alive by the
next start's lock-file check.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

PG_ROOT = Path("/usr/lib/postgresql")
START_TIMEOUT_S = 30.0
# Settings of a throwaway server: what it acknowledged must survive its own process (what
# ``kill`` does), not the machine. ``fsync`` and full-page writes guard against the machine
# failing only: a written page is the kernel's once ``write`` returns. ``synchronous_commit``
# stays on: off, a commit is acknowledged before its WAL is even written, and a killed server
# loses the last few hundred milliseconds of acknowledged transactions.
SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "16MB",
    "max_connections": "120",
    "max_wal_size": "64MB",
    "logging_collector": "off",
}


class PgServerError(RuntimeError):
    """The server could not be created or started (the message says why)."""


def find_bindir() -> Path:
    """The newest PostgreSQL's binaries: ``$PG_BINDIR``, the Debian layout, or the ``PATH``."""
    given = os.environ.get("PG_BINDIR")
    candidates = [Path(given)] if given else []
    if PG_ROOT.is_dir():
        versions = sorted((p for p in PG_ROOT.iterdir() if p.name.isdigit()),
                          key=lambda p: int(p.name), reverse=True)  # fmt: skip
        candidates += [v / "bin" for v in versions]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    raise PgServerError("no PostgreSQL server binaries (initdb, postgres) were found")


def stable_port() -> int:
    """A free port below the kernel's ephemeral range, so that while the server is down no
    outgoing connection of the machine is handed its port and the restart finds it free."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(50):
        port = rng.randrange(10_000, max(low, 10_001))
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as probe:  # a crowded range: any free port will do
        probe.bind(("127.0.0.1", 0))
        found: int = probe.getsockname()[1]
        return found


class PgServer:
    """One postmaster on ``port`` over ``datadir``; see the module docstring."""

    def __init__(self, bindir: Path, root: Path, port: int, user: str | None) -> None:
        self.bindir = bindir
        self.root = root  # owns datadir and the log; removed by close()
        self.datadir = root / "data"
        self.log_file = root / "postgres.log"
        self.port = port
        self._user = user
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @classmethod
    def create(cls, base: Path | None = None, attempts: int = 3) -> PgServer:
        """initdb into a new directory under ``base`` (the system's temp dir by default) and
        start; ``PgServerError`` if that fails (a port taken meanwhile is tried again)."""
        bindir = find_bindir()
        user = "postgres" if os.geteuid() == 0 else None
        if user is not None:
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise PgServerError("initdb refuses root, and there is no 'postgres' OS user "
                                    "to run it as") from None  # fmt: skip
        root = Path(tempfile.mkdtemp(prefix="tg-pg-", dir=base))
        server = cls(bindir, root, stable_port(), user)
        try:
            server._initdb()
            for attempt in range(attempts):
                try:
                    server.start()
                    return server
                except PgServerError:
                    if attempt == attempts - 1 or "could not bind" not in server.log_tail():
                        raise
                    server.port = stable_port()
        except BaseException:
            server.close()
            raise
        raise AssertionError("unreachable")

    # -- URLs ---------------------------------------------------------------------------------

    def dsn(self, database: str = "postgres") -> str:
        """A libpq/asyncpg DSN."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy async URL (the gateway's ``DATABASE_URL``)."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    # -- life ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the postmaster (again) on the same port and data directory; return once it
        accepts connections. Blocks: from async code run it in a thread."""
        if self.running:
            return
        argv = [str(self.bindir / "postgres"), "-D", str(self.datadir), "-p", str(self.port)]
        for name, value in SERVER_SETTINGS.items():
            argv += ["-c", f"{name}={value}"]
        self._log = self.log_file.open("ab")
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill() takes the backends too
            user=self._user, group=self._user,
        )  # fmt: skip
        self._wait_ready()

    def kill(self) -> None:
        """SIGKILL the postmaster and all its backends at once, and reap the postmaster."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self._close_log()

    def stop(self) -> None:
        """A clean shutdown (``fast``: sessions are ended, a checkpoint is written)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()
        self._close_log()

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- internals ----------------------------------------------------------------------------

    def _initdb(self) -> None:
        if self._user is not None:
            shutil.chown(self.root, self._user, self._user)
        argv = [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync",
                "--no-instructions"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              user=self._user, group=self._user)  # fmt: skip
        if done.returncode != 0:
            raise PgServerError(f"initdb failed ({done.returncode}): {done.stderr.strip()}")
        self.log_file.touch()
        if self._user is not None:
            shutil.chown(self.log_file, self._user, self._user)

    def _wait_ready(self) -> None:
        """Until ``postmaster.pid`` says ``ready`` (what ``pg_ctl start -w`` waits for), with a
        deadline; the postmaster exiting meanwhile is an error with its log's last lines."""
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self._proc.poll() is not None:
                self._close_log()
                raise PgServerError(f"postgres exited ({self._proc.returncode}):\n"
                                    f"{self.log_tail()}")  # fmt: skip
            if time.monotonic() > deadline:
                self.kill()
                raise PgServerError(f"postgres did not start in {START_TIMEOUT_S} s:\n"
                                    f"{self.log_tail()}")  # fmt: skip
            time.sleep(0.01)  # polling a starting process's lock file: there is no event

    def _ready(self) -> bool:
        """The postmaster's own status line (the 8th of ``postmaster.pid``) says ``ready``,
        and the pid in the file is this process's child (not a predecessor's stale file)."""
        assert self._proc is not None
        try:
            lines = (self.datadir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0] == str(self._proc.pid) and lines[7].strip() == "ready"

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
