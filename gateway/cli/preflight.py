"""What ``thinkgate serve`` checks before it starts, so a mistake a user can make is one clear
line and a documented exit code, never a traceback (docs/commands.md):

===== =======================================================================================
code  meaning
===== =======================================================================================
2     the configuration is invalid (settings, ``THINKGATE_CONFIG`` not YAML, no upstream, a
      ``GUARDRAILS_FILE`` that cannot be used: its line and field named)
3     the ledger's key files are missing (``thinkgate ledger init`` makes them)
4     the address to listen on is taken or not allowed
5     the database cannot be reached
===== =======================================================================================
"""

from __future__ import annotations

import asyncio
import errno
import socket

from sqlalchemy import text
from sqlalchemy.engine import make_url

from gateway.db import create_engine
from gateway.guard.policy import PolicyFileError
from gateway.guard.policy import load as load_guardrails
from gateway.ledger.sink import KEY_FILES, LedgerKeysMissing, ensure_keys
from gateway.settings import Settings
from gateway.spend.prices import load_prices

CONFIG, KEYS, ADDRESS, DATABASE = 2, 3, 4, 5


class Refused(Exception):
    """A start-up check failed: ``code`` is the exit code, the message the one line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_address(host: str, port: int) -> None:
    """The gateway can listen on ``host:port`` (checked first: nothing else is done, no demo
    key is printed, for a gateway that cannot start)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        why = "it is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise Refused(ADDRESS, f"cannot listen on {host}:{port}: {why} (choose another with "
                      "--port, or make run PORT=...)") from None  # fmt: skip


def check_keys(settings: Settings, names: tuple[str, ...] = tuple(KEY_FILES)) -> None:
    """The key files exist; ``--demo`` makes missing ones at start-up instead (and warns that
    it did, which it could not if they were made here)."""
    if settings.demo:
        return
    try:
        ensure_keys(settings.ledger, create=False, names=names)
    except LedgerKeysMissing as exc:
        raise Refused(KEYS, str(exc)) from None


def check_guardrails(settings: Settings) -> None:
    """The guardrail policy file, when one is named, parses and every pattern compiles."""
    if settings.guardrails_file is None:
        return
    try:
        load_guardrails(settings.guardrails_file)
    except PolicyFileError as exc:
        raise Refused(CONFIG, f"guardrails: {exc}") from None


def check_prices(settings: Settings) -> None:
    """The prices file, when one is named, reads as prices."""
    if settings.prices_file is None:
        return
    try:
        load_prices(settings.prices_file)
    except (OSError, ValueError) as exc:
        raise Refused(CONFIG, f"prices: {exc}") from None


def check_database(settings: Settings, timeout_s: float = 5.0) -> None:
    """One connection to the database, within ``timeout_s``."""

    async def probe() -> None:
        engine = create_engine(settings.database_url)
        try:
            async with asyncio.timeout(timeout_s), engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        finally:
            await engine.dispose()

    try:
        asyncio.run(probe())
    except Exception as exc:  # any driver's failure: the message names the database only
        shown = make_url(settings.database_url).render_as_string(hide_password=True)
        raise Refused(DATABASE, f"cannot reach the database {shown}: {type(exc).__name__} "
                      "(is it running? THINKGATE_DATABASE_URL)") from None  # fmt: skip
