"""Budgets in money through the real SDKs against the simulator (docs/spend.md): a key with a
small daily budget is refused ``budget_exceeded`` on chat (whole and streamed), Responses,
Messages and completions once spent, in each API's shape, having overshot it by at most one
request's reservation; the budget resets at the UTC day's end (the gateway's clock moved);
two replicas on one Redis share one budget; the CLI and the admin API set and show them."""

from __future__ import annotations

import asyncio
import contextlib
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.auth.keys import split_key
from gateway.cli.main import main
from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import Stack
from tests.e2e.test_batches import chat_line, ended, jsonl
from tests.scrape import sample
from tests.waiting import eventually

PRICES = b"""currency: USD
models:
  deepseek-r1: {input: 1000, output: 1000}
"""  # a thousandth of a dollar a token: a few requests spend the budget
BUDGET = Decimal("0.6")
MAX_TOKENS = 100
ASK = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "Why?"}],
       "max_tokens": MAX_TOKENS}  # fmt: skip
# the most one request reserves: its prompt (bytes / 4) and MAX_TOKENS, at $0.001 a token; the
# other APIs ask for twice the tokens once the budget is spent: more than the chat request
# the budget could no longer take
RESERVATION = Decimal("0.001") * (MAX_TOKENS + 40)


async def gateway(stack_factory: Any, tmp_path: Path, **settings: Any) -> Stack:
    (tmp_path / "prices.yaml").write_bytes(PRICES)
    prices = tmp_path / "prices.yaml"
    stack: Stack = await stack_factory(sim=SimConfig(itl_ms=1), prices_file=prices, **settings)
    return stack


async def set_budget(stack: Stack, key_id: str, amount: Decimal = BUDGET) -> dict[str, Any]:
    admin = {"authorization": f"Bearer {stack.keys['admin']}"}
    async with httpx.AsyncClient(headers=admin) as http:
        put = await http.put(f"{stack.root}/admin/v1/budgets/key/{key_id}/day",
                             json={"amount": str(amount)})  # fmt: skip
    assert put.status_code == 200, put.text
    return dict(put.json())


def key_id(stack: Stack, name: str = "visible") -> str:
    found = split_key(stack.keys[name])
    assert found is not None
    return found[0]


async def state_of(stack: Stack) -> Any:
    await eventually(lambda: hasattr(stack.app.framework.state, "tg"), within_s=10)
    return stack.app.framework.state.tg


async def spend_down(client: openai.AsyncOpenAI) -> int:
    """Chat until refused; how many were answered."""
    answered = 0
    with pytest.raises(openai.RateLimitError) as refused:  # noqa: PT012 - the loop ends in it
        for _ in range(100):
            await client.chat.completions.create(**ASK)  # type: ignore[call-overload]
            answered += 1
    assert refused.value.code == "budget_exceeded", refused.value
    assert "daily budget of key" in refused.value.message
    assert "resets at" in refused.value.message
    return answered


async def budgets_view(stack: Stack) -> list[dict[str, Any]]:
    admin = {"authorization": f"Bearer {stack.keys['admin']}"}
    async with httpx.AsyncClient(headers=admin) as http:
        listed = await http.get(f"{stack.root}/admin/v1/budgets")
    assert listed.status_code == 200, listed.text
    return list(listed.json()["data"])


async def test_a_spent_key_is_refused_on_every_api_and_resets_the_next_day(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await gateway(stack_factory, tmp_path)
    state = await state_of(stack)
    await set_budget(stack, key_id(stack))
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        answered = await spend_down(client)
        assert answered >= 2
        [view] = await budgets_view(stack)
        spent = Decimal(view["spent"])
        assert spent <= BUDGET + RESERVATION  # overshot by at most one reservation
        assert view["resets_at"].endswith("T00:00:00Z")
        with pytest.raises(openai.RateLimitError) as streamed:
            async for _ in await client.chat.completions.create(**ASK, stream=True):  # type: ignore[call-overload]
                pass  # the same request as the one refused, streamed
        assert streamed.value.code == "budget_exceeded"
        with pytest.raises(openai.RateLimitError) as responses:
            await client.responses.create(model="deepseek-r1", input="Why?",
                                          max_output_tokens=2 * MAX_TOKENS)  # fmt: skip
        assert responses.value.code == "budget_exceeded"
        with pytest.raises(openai.RateLimitError) as completions:
            await client.completions.create(model="deepseek-r1", prompt="Why?",
                                            max_tokens=2 * MAX_TOKENS)  # fmt: skip
        assert completions.value.code == "budget_exceeded"
        assert int(completions.value.response.headers["retry-after"]) >= 1
    messages = anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["visible"],
                                        max_retries=0)  # fmt: skip
    with pytest.raises(anthropic.RateLimitError) as refused:
        await messages.messages.create(model="deepseek-r1", max_tokens=2 * MAX_TOKENS,
                                       messages=[{"role": "user", "content": "Why?"}])  # fmt: skip
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert "budget" in refused.value.message
    await messages.close()
    async with openai.AsyncOpenAI(
        base_url=stack.url, api_key=stack.keys["hidden"], max_retries=0
    ) as other:  # another key of the tenant: its own
        assert (await other.chat.completions.create(**ASK)).choices  # type: ignore[call-overload]
    spending = state.spending
    real = spending.clock
    spending.clock = lambda: real() + 86_400  # the next UTC day
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        assert (await client.chat.completions.create(**ASK)).choices  # type: ignore[call-overload]


async def test_embeddings_background_responses_and_batch_lines_keep_the_budget_too(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await gateway(stack_factory, tmp_path)
    await set_budget(stack, key_id(stack), Decimal("0.001"))  # less than any request reserves
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        with pytest.raises(openai.RateLimitError) as embedded:
            await client.embeddings.create(model="deepseek-r1", input="alpha")
        assert embedded.value.code == "budget_exceeded"
        with pytest.raises(openai.RateLimitError) as background:
            await client.responses.create(model="deepseek-r1", input="Why?", background=True,
                                          max_output_tokens=16)  # fmt: skip
        assert background.value.code == "budget_exceeded"
        lines = jsonl([chat_line("q1", "Why is the sky blue?", max_tokens=16)])
        uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(lines)),
                                             purpose="batch")  # fmt: skip
        batch = await client.batches.create(input_file_id=uploaded.id,
                                            endpoint="/v1/chat/completions",
                                            completion_window="24h")  # fmt: skip

        async def line_refused() -> bool:  # the two above, and the line at least once
            async with httpx.AsyncClient() as http:
                name = "thinkgate_ratelimit_rejections_total"
                return await sample(http, f"{stack.root}/metrics", name, kind="budget") >= 3

        await eventually(line_refused, within_s=20, every=0.1)
        async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["hidden"],
                                      max_retries=0) as other:  # fmt: skip
            theirs = await other.files.create(file=("in.jsonl", io.BytesIO(lines)),
                                              purpose="batch")  # fmt: skip
            unheld = await other.batches.create(input_file_id=theirs.id,
                                                endpoint="/v1/chat/completions",
                                                completion_window="24h")  # fmt: skip
            done = await ended(other, unheld.id)  # another key's batch does not wait
            assert (done.status, done.request_counts.completed) == ("completed", 1)  # type: ignore[union-attr]
        waiting = await client.batches.retrieve(batch.id)
        assert waiting.status == "in_progress" and waiting.request_counts.completed == 0  # type: ignore[union-attr]
        await set_budget(stack, key_id(stack), Decimal("100"))  # raised: the line runs
        done = await ended(client, batch.id)
        assert (done.status, done.request_counts.completed) == ("completed", 1)  # type: ignore[union-attr]
        assert (await client.embeddings.create(model="deepseek-r1", input="alpha")).data


async def test_two_replicas_on_one_redis_share_one_budget(
    stack_factory: Any, tmp_path: Path
) -> None:
    redis = {"redis_url": "redis://127.0.0.1:6379/0"}
    first = await gateway(stack_factory, tmp_path, **redis)
    await state_of(first)  # its schema made: the second replica finds it
    second = await gateway(stack_factory, tmp_path, **redis)  # the same database
    await set_budget(first, key_id(first))
    answered = 0
    clients = [openai.AsyncOpenAI(base_url=s.url, api_key=first.keys["visible"], max_retries=0)
               for s in (first, second)]  # fmt: skip
    try:
        with pytest.raises(openai.RateLimitError) as refused:  # noqa: PT012 - ends in it
            for turn in range(100):
                await clients[turn % 2].chat.completions.create(**ASK)  # type: ignore[call-overload]
                answered += 1
        assert refused.value.code == "budget_exceeded"
    finally:
        for client in clients:
            await client.close()
    [view] = await budgets_view(second)
    assert Decimal(view["spent"]) <= BUDGET + RESERVATION
    assert 2 <= answered <= int(BUDGET / Decimal("0.001") / 10)  # one budget, not two


async def test_the_cli_sets_lists_and_removes(
    stack_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = await gateway(stack_factory, tmp_path)
    monkeypatch.setenv("THINKGATE_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}")

    async def cli(*args: str) -> tuple[int, str]:
        out = io.StringIO()

        def run() -> int:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                return main(list(args))

        return await asyncio.to_thread(run), out.getvalue()

    code, said = await cli("budget", "set", "--tenant", "acme", "--amount", "120.50", "--per",
                           "month", "--soft")  # fmt: skip
    assert code == 0, said
    code, said = await cli("budget", "set", "--key", "nokey", "--amount", "1", "--per", "day")
    assert code == 1 and "no key" in said
    code, said = await cli("budget", "list")
    assert code == 0 and said.split("\t")[:3] == ["tenant", "acme", "120.50"], said
    views = await budgets_view(stack)
    assert [(v["scope"], v["amount"], v["soft"], Decimal(v["remaining"])) for v in views] == [
        ("tenant", "120.50", True, Decimal("120.50"))]  # fmt: skip
    code, said = await cli("budget", "remove", "--tenant", "acme", "--per", "month")
    assert code == 0

    async def gone() -> bool:  # the gateway reads the budgets again within BOOK_TTL_S
        return await budgets_view(stack) == []

    await eventually(gone, within_s=10, every=0.2)
