"""The console's Spend page in a real browser (Debian's Chromium through Playwright) against a
live gateway with ``PRICES_FILE``: an admin sets a key's budget and a tenant's from the page,
sees what each window spent (the admin API's figures, to the nano-unit) and the ledger's spend
report (``GET /admin/v1/spend``'s rows and totals), removes a budget; a subject's text stays
text; without prices the page says budgets need them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
from playwright.async_api import Browser, expect

from tests.e2e.conftest import Stack
from tests.e2e.test_budgets import PRICES, key_id
from tests.e2e.test_console import browser, console, shot, sign_in  # noqa: F401

HOSTILE = '<img src=x onerror="window.__pwned = 1">'


async def priced(stack_factory: Any, tmp_path: Path) -> Stack:
    (tmp_path / "prices.yaml").write_bytes(PRICES)
    stack: Stack = await stack_factory(prices_file=tmp_path / "prices.yaml")
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        for question in ("Why is the sky blue?", "What is entropy?"):
            await client.chat.completions.create(
                model="deepseek-r1", max_tokens=20,
                messages=[{"role": "user", "content": question}],
            )  # fmt: skip
    return stack


async def admin_get(stack: Stack, path: str) -> Any:
    headers = {"authorization": f"Bearer {stack.keys['admin']}"}
    async with httpx.AsyncClient(base_url=stack.root, headers=headers) as http:
        answer = await http.get(path)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_an_admin_sets_sees_and_removes_budgets_and_reads_the_report(
    stack_factory: Any, tmp_path: Path, browser: Browser,  # noqa: F811
) -> None:  # fmt: skip
    stack = await priced(stack_factory, tmp_path)
    page = await sign_in(browser, stack, key="admin")
    await page.get_by_role("link", name="Spend").click()
    await expect(page.get_by_role("heading", name="Spend", exact=True)).to_be_visible()
    await expect(page.get_by_text("No budgets yet.")).to_be_visible()
    spent = await admin_get(stack, "/admin/v1/spend")
    [total] = spent["totals"].values()
    await expect(page.get_by_role("list", name="Totals")).to_have_text(f"{total} USD")
    rows = page.locator("table.spend tbody tr")
    await expect(rows).to_have_count(len(spent["data"]))
    assert float(total) > 0

    form = page.get_by_role("form", name="Set a budget")
    await form.get_by_label("Scope").select_option("key")
    await form.get_by_label("Tenant or key id").fill(key_id(stack))
    await form.get_by_label("Amount").fill("250")
    await form.get_by_role("button", name="Set budget").click()
    budgets = page.locator("table.budgets tbody tr")
    await expect(budgets).to_have_count(1)
    [shown] = (await admin_get(stack, "/admin/v1/budgets"))["data"]
    await expect(budgets.first).to_contain_text(f"{shown['spent']} USD")
    await expect(budgets.first).to_contain_text("hard (refuses)")
    assert shown["amount"] == "250" and shown["resets_at"].endswith("T00:00:00Z")
    assert shown["spent"] == "0.000000000"  # a new budget counts from when it is set

    await form.get_by_label("Scope").select_option("tenant")
    await form.get_by_label("Tenant or key id").fill(HOSTILE)
    await form.get_by_label("Amount").fill("1000")
    await form.get_by_label("Period").select_option("month")
    await form.get_by_label("Soft (alert only)").check()
    await form.get_by_role("button", name="Set budget").click()
    await expect(budgets).to_have_count(2)
    await expect(page.locator("table.budgets")).to_contain_text(HOSTILE)  # as text
    assert await page.evaluate("window.__pwned") is None
    await shot(page, tmp_path, "spend")

    remove = page.get_by_role("button", name=f"Remove the key {key_id(stack)} budget per day")
    await remove.click()
    await page.get_by_role("button", name=f"Confirm removing the key {key_id(stack)}").click()
    await expect(budgets).to_have_count(1)
    left = (await admin_get(stack, "/admin/v1/budgets"))["data"]
    assert [(b["scope"], b["soft"]) for b in left] == [("tenant", True)]

    wanted = page.get_by_role("search", name="Spend report")
    await wanted.get_by_label("Key id").fill("no-such-key")
    await wanted.get_by_role("button", name="Report").click()
    await expect(page.get_by_text("No records in this range.")).to_be_visible()
    assert "key=no-such-key" in page.url
    assert page.errors == []  # type: ignore[attr-defined]


async def test_without_prices_the_page_says_budgets_need_them(
    console: Stack, browser: Browser,  # noqa: F811
) -> None:  # fmt: skip
    page = await sign_in(browser, console, key="admin")
    await page.get_by_role("link", name="Spend").click()
    await expect(page.get_by_role("alert").first).to_contain_text("PRICES_FILE")
