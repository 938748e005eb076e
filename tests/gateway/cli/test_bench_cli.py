"""``thinkgate bench`` against a real gateway: a missing or refused key stops it before any
load (exit 2, one line), a run whose every request failed exits 1, and the table names its
units."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.cli.main import main
from tests.e2e.conftest import StackFactory, stack_factory

__all__ = ["stack_factory"]


async def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["bench", "--duration", "0.5", "--concurrency", "2",
                                          *argv])  # fmt: skip
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_a_refused_key_stops_before_any_load(
    stack_factory: StackFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    stack: Any = await stack_factory()
    monkeypatch.delenv("THINKGATE_BENCH_KEY", raising=False)
    code, out, err = await bench(capsys, "--url", stack.url)
    assert (code, out) == (2, "") and "no key" in err
    code, out, err = await bench(capsys, "--url", stack.url, "--api-key", stack.keys["revoked"])
    assert (code, out) == (2, "") and "refused the key (401)" in err
    code, out, err = await bench(capsys, "--url", stack.url, "--api-key", stack.keys["auditor"])
    assert code == 2 and "refused the key (403)" in err


async def test_a_run_that_only_failed_exits_one_and_the_table_has_units(
    stack_factory: StackFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    stack: Any = await stack_factory()
    code, out, _ = await bench(capsys, "--url", stack.url, "--api-key", stack.keys["visible"],
                               "--model", "no-such-model")  # fmt: skip
    assert code == 1 and "TTFT p50 ms" in out and "first error" in out
    code, out, _ = await bench(capsys, "--url", stack.url, "--api-key", stack.keys["visible"],
                               "--max-tokens", "8")  # fmt: skip
    assert code == 0 and "e2e p99 ms" in out
