"""The settings sections one component reads instead of the whole ``Settings``
(``Settings.section`` makes them): plain, frozen values, named as the settings are."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from pydantic import SecretStr


@dataclasses.dataclass(frozen=True, slots=True)
class RoutingSettings:
    """What routing reads: the engines' KV events, the cache salt (``gateway.upstream.router``)."""

    upstreams: tuple[str, ...]
    routing: Literal["least_loaded", "prefix"] | None
    upstream_kv_events: tuple[str, ...]
    kv_events_silence_s: float
    prefix_cache_sharing: Literal["tenant", "global"]
    prefix_cache_secret: SecretStr


@dataclasses.dataclass(frozen=True, slots=True)
class BatchSettings:
    """What files and batches read (``gateway.batch``)."""

    batch_max_concurrency: int
    batch_max_active_per_tenant: int
    batch_max_queued_lines_per_tenant: int
    batch_max_lines: int
    files_max_bytes: int
    files_retention_s: float
    batch_lease_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class LogSettings:
    """What the logging configuration reads (``gateway.telemetry.logs``)."""

    log_level: Literal["debug", "info", "warning", "error"]
    log_format: Literal["auto", "json", "text"]


@dataclasses.dataclass(frozen=True, slots=True)
class LedgerSettings:
    """What the audit ledger's opening and sink read (``gateway.ledger.sink``)."""

    home: Path
    ledger_key_file: Path
    signing_key_file: Path
    audit_origin: str
    audit_mode: Literal["strict", "async"]
    audit_capture: Literal["full", "reasoning", "metadata"]
    audit_fail: Literal["closed", "open"]
    audit_spool_file: Path
    audit_batch_max: int
    checkpoint_interval_ms: int
    background_stale_s: float

    def file_hint(self, name: str) -> str:
        return file_hint(self.home, name)


def file_hint(home: Path, name: str) -> str:
    """How to point the file setting ``name`` elsewhere: for every error naming a missing file
    it defaults to."""
    where = str(home) if home.is_absolute() else f"{home} in {Path.cwd()}"
    return f"set THINKGATE_{name.upper()}, or THINKGATE_HOME (now {where})"


@dataclasses.dataclass(frozen=True, slots=True)
class SiemSettings:
    """What the SIEM export reads (``gateway.side.siem``)."""

    siem_syslog_url: str
    siem_file: Path | None
    siem_hec_url: str
    siem_hec_token: SecretStr | None
    siem_tls_ca_file: Path | None
    siem_batch: int
    siem_interval_s: float
    siem_max_backlog: int
