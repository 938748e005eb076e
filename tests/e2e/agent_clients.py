"""Driving the real agent clients (node SDKs, Claude Code, Codex CLI, LangChain, pydantic-ai)
against a gateway in front of the simulator, with the models ``make run`` serves
(``gateway.app.DEMO_MODELS``).

- ``Tap`` sits in front of the gateway's ASGI app and keeps every exchange: the request body,
  the status and the first bytes of the answer. A client that fails shows, in the assertion
  message, exactly what it sent that the gateway refused and what the gateway said.
- ``run_client`` runs a client process with a clean environment (nothing of the machine's keys,
  proxies or home directory) and a deadline: past it the process group is killed, so no CLI can
  hang the suite.
- ``Outcome.explain`` is the failure message: exit status, the client's stderr and output and
  the gateway's refusals, with every secret key redacted.

The node clients are pinned in ``tests/clients/package-lock.json`` and installed by ``.ci/run``
(``npm ci --prefix tests/clients``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CLIENTS = Path(__file__).resolve().parents[1] / "clients"
NODE_BIN = CLIENTS / "node_modules" / ".bin"
# Bytes of each answer kept: enough for an error body or a short event stream.
ANSWER_BYTES = 1 << 16
CREDENTIALS = frozenset({b"authorization", b"x-api-key", b"cookie"})
# Strings longer than this are cut in reports (system prompts, tool descriptions).
REPORT_STRING = 160


@dataclass
class Exchange:
    """One HTTP request the gateway served, as the tap saw it."""

    method: str
    path: str  # with the query string, if any
    headers: dict[str, str]  # what the client sent, its credentials left out
    request: bytearray = field(default_factory=bytearray)
    status: int = 0
    answer: bytearray = field(default_factory=bytearray)

    @property
    def refused(self) -> bool:
        """A 4xx/5xx, or a stream that ended in an ``error`` event."""
        if self.status >= 400:
            return True
        return b"event: error" in self.answer or b'"type":"error"' in self.answer

    def body(self) -> Any:
        try:
            return json.loads(self.request) if self.request else None
        except ValueError:
            return bytes(self.request[:REPORT_STRING]).decode(errors="replace")


class Tap:
    """ASGI middleware that records every HTTP exchange with the app it wraps."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode(): value.decode(errors="replace")
            for name, value in scope["headers"]
            if name.lower() not in CREDENTIALS
        }
        path = scope["path"] + (
            f"?{scope['query_string'].decode()}" if scope["query_string"] else ""
        )
        exchange = Exchange(scope["method"], path, headers)
        self.exchanges.append(exchange)

        async def tapped_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                exchange.request += message.get("body", b"")
            return message

        async def tapped_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body":
                room = ANSWER_BYTES - len(exchange.answer)
                exchange.answer += message.get("body", b"")[: max(room, 0)]
            await send(message)

        await self.app(scope, tapped_receive, tapped_send)

    def requests(self, path: str) -> list[Any]:
        """The JSON bodies of the POST requests to ``path`` (any query string), in order."""
        return [
            e.body() for e in self.exchanges
            if e.path.partition("?")[0] == path and e.method == "POST"
        ]  # fmt: skip

    def report(self, last: bool = False) -> str:
        """Every exchange in one line each, then each refused one whole: what the client
        sent (long strings cut) and what the gateway answered; ``last``: the last one too."""
        lines = [f"gateway saw {len(self.exchanges)} requests:"]
        lines += [f"  {e.method} {e.path} -> {e.status}" for e in self.exchanges]
        shown = [e for e in self.exchanges if e.refused]
        if last and self.exchanges and not self.exchanges[-1].refused:
            shown.append(self.exchanges[-1])
        for e in shown:
            answer = bytes(e.answer[:4000]).decode(errors="replace")
            sent = json.dumps(shorten(e.body()), indent=1)[:12000]
            kind = "REFUSED" if e.refused else "LAST"
            lines += [f"{kind} {e.method} {e.path} {e.status}: {answer}",
                      f"headers: {json.dumps(e.headers)}", f"request: {sent}"]  # fmt: skip
        return "\n".join(lines)


def shorten(value: Any) -> Any:
    """``value`` with long strings cut and JSON schemas elided, for a readable report."""
    if isinstance(value, str) and len(value) > REPORT_STRING:
        return f"{value[:REPORT_STRING]}…({len(value)} chars)"
    if isinstance(value, list):
        return [shorten(v) for v in value]
    if isinstance(value, dict):
        elided = {"input_schema", "parameters", "schema"}
        return {k: "{…}" if k in elided and v else shorten(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Outcome:
    """How a client process ended."""

    argv: Sequence[str]
    returncode: int | None  # None: killed at the deadline
    stdout: str
    stderr: str

    def result(self) -> Any:
        """The JSON object on the last line of stdout (what the node scripts print)."""
        lines = self.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else None

    def explain(self, tap: Tap, secrets: Iterable[str]) -> str:
        status = "killed at its deadline" if self.returncode is None else self.returncode
        text = "\n".join([
            f"{' '.join(self.argv[:2])} exited {status}",
            f"stderr:\n{self.stderr[-6000:]}",
            f"stdout:\n{self.stdout[-6000:]}",
            tap.report(),
        ])  # fmt: skip
        return redact(text, secrets)


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    return text


def clean_env(home: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """An environment with only ``PATH``, a home of the test's own and ``extra``: no key,
    proxy or configuration of the machine's reaches a client."""
    home.mkdir(parents=True, exist_ok=True)
    base = {
        "PATH": f"{NODE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    return {**base, **extra}


async def run_client(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout_s: float
) -> Outcome:
    """Runs ``argv`` to its end, or kills its whole process group at ``timeout_s``. Its output
    goes to files, not pipes: a child it leaves behind (a CLI's background helper) can hold
    no pipe open and so keep the wait from ending."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=dict(env), cwd=cwd, start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err,
        )  # fmt: skip
        returncode: int | None = None
        try:
            async with asyncio.timeout(timeout_s):
                returncode = await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        texts = []
        for file in (out, err):
            file.seek(0)
            texts.append(file.read().decode(errors="replace"))
    return Outcome(argv, returncode, *texts)


def require_clients() -> None:
    """Fails, saying how to get them, when the pinned node clients are not installed (never a
    skip: ``make test`` installs them, from tests/clients/package-lock.json)."""
    if not ((NODE_BIN / "claude").exists() and (NODE_BIN / "codex").exists()):
        pytest.fail(f"the agent clients are not installed: npm ci --prefix {CLIENTS} "
                    "(make test does it)")  # fmt: skip
