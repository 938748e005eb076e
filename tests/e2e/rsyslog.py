"""A real syslog daemon for tests: Debian's rsyslogd, in the foreground, with a configuration
of the test's own (in its directory: no root paths, no system log touched).

It listens with ``imtcp`` on 127.0.0.1 (octet-counted framing is imtcp's default) and writes
each message from app-name ``thinkgate`` to ``received.log`` as one line: the fields rsyslog
parsed out of the RFC 5424 header, then the MSG. So a test sees what rsyslog understood, not
what was sent. ``stop`` and ``start`` again on the same port play a receiver's restart.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tests.waiting import eventually

RSYSLOGD = "/usr/sbin/rsyslogd"
FIELDS = ("%app-name% %msgid% %syslogfacility% %syslogseverity% "
          "%timereported:::date-rfc3339% %msg%\\n")  # fmt: skip
CONFIG = """\
global(workDirectory="{work}" maxMessageSize="64k")
module(load="imtcp")
template(name="fields" type="string" string="{fields}")
input(type="imtcp" address="127.0.0.1" port="{port}")
if $app-name == "thinkgate" then {{
    action(type="omfile" file="{out}" template="fields")
}}
"""


@dataclass(frozen=True)
class Received:
    """One message as rsyslog parsed it."""

    app_name: str
    msgid: str
    facility: int
    severity: int
    timestamp: str
    event: dict[str, Any]


class Rsyslog:
    def __init__(self, directory: Path) -> None:
        binary = shutil.which("rsyslogd") or RSYSLOGD
        assert Path(binary).exists(), "rsyslogd is not installed (apt-get install rsyslog)"
        self._binary = binary
        self._dir = directory
        (directory / "work").mkdir(parents=True, exist_ok=True)
        self.output = directory / "received.log"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._config = directory / "rsyslog.conf"
        self._config.write_text(CONFIG.format(work=directory / "work", port=self.port,
                                              out=self.output, fields=FIELDS))  # fmt: skip
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Check the configuration (``-N1``), start the daemon, wait until it listens."""
        self._spawn()
        await eventually(self._listening, within_s=20, every=0.05)

    def _spawn(self) -> None:
        check = subprocess.run([self._binary, "-N1", "-f", str(self._config)],
                               capture_output=True, timeout=30, check=False)  # fmt: skip
        assert check.returncode == 0, check.stderr.decode() + check.stdout.decode()
        with open(self._dir / "rsyslogd.out", "ab") as log:  # the daemon keeps its own copy
            self._process = subprocess.Popen(
                [self._binary, "-n", "-f", str(self._config), "-i",
                 str(self._dir / "rsyslogd.pid")],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def _listening(self) -> bool:
        assert self._process is not None and self._process.poll() is None, self.diagnostics()
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """SIGTERM, and wait: rsyslog writes out what it received before it exits."""
        if self._process is None:
            return
        self._process.terminate()
        self._process.wait(timeout=30)
        self._process = None

    def received(self) -> list[Received]:
        if not self.output.exists():
            return []
        out = []
        for line in self.output.read_bytes().splitlines():
            app, msgid, facility, severity, stamp, msg = line.split(b" ", 5)
            out.append(Received(app.decode(), msgid.decode(), int(facility), int(severity),
                                stamp.decode(), orjson.loads(msg)))  # fmt: skip
        return out

    def diagnostics(self) -> str:
        path = self._dir / "rsyslogd.out"
        return path.read_text(errors="replace") if path.exists() else ""
