"""The auditor's first five minutes: a query with empty parameters (``?tenant=&since=&until=``,
as the README's walkthrough and every form leave them) means no filter, and times are RFC 3339
or epoch seconds alike in the API and the CLI."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.cli.main import main


async def test_empty_parameters_mean_no_filter(stack_factory: Any) -> None:
    stack = await stack_factory()
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        await client.chat.completions.create(
            model="deepseek-r1", messages=[{"role": "user", "content": "hi"}]
        )
    headers = {"authorization": f"Bearer {stack.keys['auditor']}"}
    async with httpx.AsyncClient() as raw:
        plain = await raw.get(f"{stack.root}/audit/v1/records", headers=headers)
        empty = await raw.get(f"{stack.root}/audit/v1/records?tenant=&since=&until=&model=",
                              headers=headers)  # fmt: skip
        exported = await raw.get(f"{stack.root}/audit/v1/export?tenant=&since=&until=",
                                 headers=headers)  # fmt: skip
        since = datetime.fromtimestamp(time.time() - 3600, UTC).isoformat().replace("+00:00", "Z")
        timed = await raw.get(f"{stack.root}/audit/v1/records", params={"since": since},
                              headers=headers)  # fmt: skip
    assert plain.status_code == empty.status_code == exported.status_code == 200
    assert empty.json()["data"] == plain.json()["data"] and plain.json()["data"]
    assert len(exported.text.strip().splitlines()) >= len(plain.json()["data"])
    assert timed.json()["data"] == plain.json()["data"]


@pytest.mark.parametrize("since", ["2026-01-01T00:00:00Z", "1767225600"])
def test_the_cli_export_takes_rfc_3339_or_epoch_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    since: str,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["ledger", "init"]) == 0
    capsys.readouterr()
    assert main(["ledger", "export", "--since", since, "--until", "2100-01-01T00:00:00+02:00"]) == 0


def test_the_cli_names_a_bad_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["ledger", "export", "--since", "yesterday"])
    assert "RFC 3339 or epoch seconds" in capsys.readouterr().err
