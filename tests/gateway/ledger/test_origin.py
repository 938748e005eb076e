"""The log's name (``gateway.ledger.sink.log_origin``): unique per deployment by default, kept
by a log that already has checkpoints, and ``AUDIT_ORIGIN`` when set."""

from __future__ import annotations

from pathlib import Path

from audit.record import Body, Facts
from gateway.cli.ledger import opened, with_origin
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings


def deployment(root: Path, **overrides: str) -> Settings:
    root.mkdir(parents=True, exist_ok=True)
    settings = Settings(home=root, **overrides)  # type: ignore[arg-type]
    ensure_keys(settings.ledger, create=True)
    return settings


async def test_two_deployments_get_two_names_and_each_keeps_its_own(tmp_path: Path) -> None:
    one, two = deployment(tmp_path / "one"), deployment(tmp_path / "two")
    first, second = (await with_origin(one)).audit_origin, (await with_origin(two)).audit_origin
    assert first != second
    assert first.startswith("thinkgate/") and len(first) == len("thinkgate/") + 12
    assert (await with_origin(one)).audit_origin == first  # stable: derived from the key


async def test_a_log_with_checkpoints_keeps_their_name(tmp_path: Path) -> None:
    named = deployment(tmp_path / "old", audit_origin="old.example/log")
    async with opened(named) as ledger:
        await ledger.append(Facts(kind="completion", tenant="acme", key_id="k", request_id="r",
                                  created_at=1.7e9), Body())  # fmt: skip
        assert (await ledger.checkpoint() or "").startswith("old.example/log\n1\n")
    unnamed = named.model_copy(update={"audit_origin": ""})
    assert (await with_origin(unnamed)).audit_origin == "old.example/log"
    async with opened(unnamed) as ledger:  # an upgrade that drops AUDIT_ORIGIN: same log
        await ledger.append(Facts(kind="completion", tenant="acme", key_id="k", request_id="s",
                                  created_at=1.7e9), Body())  # fmt: skip
        assert (await ledger.checkpoint() or "").startswith("old.example/log\n2\n")
