"""Spend through the real SDKs against the simulator, with ``PRICES_FILE`` (docs/spend.md):
every exchange's cost in its ledger header, whatever its end (a stream the client left and
streams the engine cut short included: priced by what they streamed, never 0); ``thinkgate
spend report`` equal, to the nano-unit, to the sum over ``ledger export``'s records of usage ×
prices computed here on its own; the spend metric; a model without a price refused."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.cli.main import main
from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import Stack
from tests.scrape import sample
from tests.waiting import eventually

PRICES = b"""currency: EUR
models:
  deepseek-r1: {input: 0.55, cached_input: 0.14, output: 2.19, reasoning: 2.50}
"""
RATES = {"input": Decimal("0.55"), "cached": Decimal("0.14"), "output": Decimal("2.19"),
         "reasoning": Decimal("2.50")}  # fmt: skip


def by_hand(usage: dict[str, int]) -> Decimal:
    """The cost of one record's usage, computed here as the docs state it."""
    cached, reasoning = usage.get("cached_tokens", 0), usage["reasoning_tokens"]
    spent = ((usage["prompt_tokens"] - cached) * RATES["input"] + cached * RATES["cached"]
             + (usage["completion_tokens"] - reasoning) * RATES["output"]
             + reasoning * RATES["reasoning"])  # fmt: skip
    return (spent / 1_000_000).quantize(Decimal("0.000000001"))


async def cli(monkeypatch: pytest.MonkeyPatch, tmp: Path, *args: str) -> tuple[int, str]:
    for name, value in (("database_url", f"sqlite+aiosqlite:///{tmp / 'gw.db'}"),
                        ("ledger_key_file", tmp / "ledger-keys.json"),
                        ("signing_key_file", tmp / "signing-key.pem"),
                        ("prices_file", tmp / "prices.yaml")):  # fmt: skip
        monkeypatch.setenv(f"THINKGATE_{name.upper()}", str(value))
    out = io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out):
            return main(list(args))

    code = await asyncio.to_thread(run)
    return code, out.getvalue()


async def traffic(stack: Stack) -> None:
    """Chat whole and streamed, Responses, Messages, completions, and a stream left early."""
    key = stack.keys["visible"]
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=key, max_retries=0) as client:
        ask = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "Why?"}]}
        await client.chat.completions.create(**ask)  # type: ignore[call-overload]
        async for _ in await client.chat.completions.create(**ask, stream=True):  # type: ignore[call-overload]
            pass
        await client.responses.create(model="deepseek-r1", input="How?")
        await client.completions.create(model="deepseek-r1", prompt="Why?", max_tokens=8)
        with pytest.raises(openai.BadRequestError) as unpriced:
            await client.chat.completions.create(**{**ask, "model": "gpt-unpriced"})  # type: ignore[call-overload]
        assert (
            unpriced.value.code == "model_not_priced" and "gpt-unpriced" in unpriced.value.message
        )
    messages = anthropic.AsyncAnthropic(base_url=stack.root, api_key=key, max_retries=0)
    await messages.messages.create(model="deepseek-r1", max_tokens=256,
                                   messages=[{"role": "user", "content": "What?"}])  # fmt: skip
    await messages.close()
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": "deepseek-r1", "stream": True,
            "messages": [{"role": "user", "content": "Leave early?"}]}  # fmt: skip
    async with httpx.AsyncClient(timeout=10) as http, http.stream(
        "POST", f"{stack.url}/chat/completions", json=body, headers=headers
    ) as live:  # fmt: skip
        seen = 0
        async for _ in live.aiter_raw():
            seen += 1
            if seen >= 5:
                break  # the client leaves mid-stream


async def test_the_report_is_the_ledgers_usage_times_the_prices(
    stack_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "prices.yaml").write_bytes(PRICES)
    stack = await stack_factory(sim=SimConfig(itl_ms=3), prices_file=tmp_path / "prices.yaml")
    await traffic(stack)
    await eventually(lambda: hasattr(stack.app.framework.state, "tg"), within_s=10)
    # a second replica (the same database and ledger) whose engine cuts every stream short
    failing = await stack_factory(sim=SimConfig(itl_ms=3, drop_rate=1.0),
                                  prices_file=tmp_path / "prices.yaml")  # fmt: skip
    async with openai.AsyncOpenAI(base_url=failing.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        for _ in range(2):
            with pytest.raises(openai.APIError):
                async for _ in await client.chat.completions.create(
                    model="deepseek-r1", messages=[{"role": "user", "content": "Cut?"}],
                    stream=True,
                ):  # fmt: skip
                    pass

    async def eight_records() -> list[dict[str, Any]] | None:
        exported = tmp_path / "export.jsonl"
        code, out = await cli(monkeypatch, tmp_path, "ledger", "export", "--output",
                              str(exported))  # fmt: skip
        assert code == 0, out
        lines = [orjson.loads(line) for line in exported.read_bytes().splitlines()[1:]]
        headers = [orjson.loads(base64.b64decode(x["header"])) for x in lines]
        done = [h for h in headers if h["kind"] == "completion"]
        return done if len(done) >= 8 else None

    records = await eventually(eight_records, within_s=20, every=0.2)
    assert {r["status"] for r in records} == {"ok", "client_disconnected", "upstream_error"}
    expected = Decimal(0)
    for record in records:
        cost = record["cost"]
        assert (cost["currency"], len(cost["prices"])) == ("EUR", 16)
        assert Decimal(cost["amount"]) == by_hand(record["usage"]) > 0, record
        expected += Decimal(cost["amount"])
    for cut in (r for r in records if r["status"] in ("client_disconnected", "upstream_error")):
        assert Decimal(cut["cost"]["amount"]) > 0  # what it streamed is priced, never 0
    code, out = await cli(monkeypatch, tmp_path, "spend", "report")
    assert code == 0, out
    report = orjson.loads(out)
    assert report["totals"] == {"EUR": str(expected)} and report["unpriced"] == 0
    [row] = report["rows"]
    assert (row["tenant"], row["model"], row["requests"]) == ("acme", "deepseek-r1", 8)
    code, out = await cli(monkeypatch, tmp_path, "spend", "report", "--format", "csv",
                          "--tenant", "globex")  # fmt: skip
    assert code == 0 and out.splitlines()[0].startswith("tenant,key_id,model,currency")
    assert len(out.splitlines()) == 1  # nothing spent by another tenant
    counted = await _spend_metric(stack)
    admin = {"authorization": f"Bearer {stack.keys['admin']}"}
    async with httpx.AsyncClient(headers=admin) as http:
        served = await http.get(f"{stack.root}/admin/v1/spend", params={"tenant": "acme"})
    assert served.status_code == 200, served.text
    assert served.json()["totals"] == {"EUR": str(expected)}
    assert served.json()["data"] == report["rows"]
    failing_counted = await _spend_metric(failing)
    assert counted + failing_counted == pytest.approx(float(expected), rel=1e-9)


async def _spend_metric(stack: Stack) -> float:
    async with httpx.AsyncClient() as http:
        return await sample(http, f"{stack.root}/metrics", "thinkgate_spend_total",
                            tenant="acme", model="deepseek-r1", currency="EUR")  # fmt: skip


async def test_a_report_with_a_bad_prices_file_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "prices.yaml").write_text("currency: EUR\nmodels: [\n")
    code, out = await cli(monkeypatch, tmp_path, "spend", "report")
    assert (code, out) == (2, "")
    assert capsys.readouterr().err == (
        "thinkgate: prices: PRICES_FILE: not valid YAML (line 3, column 1)\n"
    )
