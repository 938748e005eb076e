"""The auditor console in a real browser: headless Chromium (Debian's, driven by Playwright)
against a live gateway with its strict ledger on SQLite, the simulator behind it.

What an auditor does: sign in, filter, open a record (and see the access record it caused),
see every record verified by the page itself, export; what an admin does: create and revoke a
key. Then what an attacker does: tamper with stored bytes, proofs, signatures and checkpoints
(rewritten between the gateway and the page with Playwright's routing, as a proxy would), and
put script into a record's text. Screenshots go to the test's directory, and to
``THINKGATE_SCREENSHOTS`` when set (``docs/console/`` holds the README's)."""

from __future__ import annotations

import asyncio
import base64
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.async_api import Browser, Page, Route, async_playwright, expect

from audit.export import check_export
from audit.note import NoteSigner, NoteVerifier, load_signing_key
from gateway.cli.ledger import shred
from gateway.settings import Settings
from gateway.side.console import CSP
from tests.e2e.conftest import Stack, ledger_files, log_origin
from tests.e2e.test_audit_api import new_key

CHROMIUM = Path("/usr/bin/chromium")
HOSTILE = (
    '<script>window.__pwned = 1</script> <img src=x onerror="window.__pwned = 2"> '
    '[click me](javascript:window.__pwned=3) <a href="javascript:window.__pwned=4">link</a>'
)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not await asyncio.to_thread(CHROMIUM.exists):
        pytest.fail(
            "Debian's chromium is not installed (apt-get install chromium; .ci/run does it)"
        )
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"]
        )
        yield launched
        await launched.close()


@pytest.fixture
async def console(stack_factory: Any, tmp_path: Path) -> Stack:
    stack: Stack = await stack_factory()
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        for question in ("Why is the sky blue?", "Explain TCP handshakes", "What is entropy?"):
            await client.chat.completions.create(
                model="deepseek-r1", max_tokens=200,
                messages=[{"role": "user", "content": question}],
            )  # fmt: skip
    return stack


def settings_of(tmp_path: Path) -> Settings:
    """The settings the stack's gateway runs with (its database and key files)."""
    return Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
                    **ledger_files(tmp_path))  # fmt: skip


async def shot(page: Page, tmp_path: Path, name: str) -> None:
    """A full-page screenshot; a secret on the page is painted over (no key in a picture)."""
    hide = {"mask": [page.locator("#new-secret")], "full_page": True}
    await page.screenshot(path=str(tmp_path / f"{name}.png"), **hide)  # type: ignore[arg-type]
    if target := os.environ.get("THINKGATE_SCREENSHOTS"):
        await asyncio.to_thread(Path(target).mkdir, parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(target) / f"{name}.png"), **hide)  # type: ignore[arg-type]


async def sign_in(browser: Browser, stack: Stack, key: str = "auditor", **context: Any) -> Page:
    page = await (await browser.new_context(**context)).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors  # type: ignore[attr-defined]
    await page.goto(f"{stack.root}/console/")
    await page.get_by_label("Auditor or admin key").fill(stack.keys[key])
    await page.get_by_label("Auditor or admin key").press("Enter")  # the keyboard is enough
    return page


async def all_badges(page: Page, expected: str, count: int) -> None:
    """Wait until no record is still being checked; then each badge says ``expected``."""
    badges = page.locator("table.records .badge")
    await expect(badges).to_have_count(count)
    await expect(page.locator("table.records .badge", has_text="checking")).to_have_count(0)
    for text in await badges.all_inner_texts():
        assert expected in text, await badges.all_inner_texts()


async def test_the_console_is_served_with_a_strict_policy(console: Stack) -> None:
    async with httpx.AsyncClient(base_url=console.root) as client:
        index = await client.get("/console/")
        script = await client.get("/console/verify.js")
        missing = await client.get("/console/../settings.py")
        unknown = await client.get("/console/nothing.js")
        bare = await client.get("/console")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    for response in (index, script):
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in CSP and "unsafe" not in CSP and "frame-ancestors 'none'" in CSP
    assert script.headers["content-type"].startswith("text/javascript")
    assert b"<script>" not in index.content.replace(b'<script type="module" src=', b"")
    assert missing.status_code == unknown.status_code == 404
    assert bare.status_code == 308 and bare.headers["location"] == "/console/"


async def test_console_off_means_no_console(stack_factory: Any) -> None:
    stack = await stack_factory(console_enabled=False)
    async with httpx.AsyncClient(base_url=stack.root) as client:
        assert (await client.get("/console/")).status_code == 404


async def test_an_auditor_browses_filters_opens_and_sees_it_verified(
    console: Stack, browser: Browser, tmp_path: Path
) -> None:
    page = await sign_in(browser, console)
    await all_badges(page, "verified", 3)
    await expect(page.locator("#checkpoint")).to_have_text("log verified: 3 records")
    rows = page.locator("table.records tbody tr")
    assert "deepseek-r1" in await rows.nth(0).inner_text()
    assert "chat.completions" in await rows.nth(0).inner_text()
    await shot(page, tmp_path, "records")
    # the key lives in this tab's sessionStorage only: not the URL, a cookie or localStorage
    secret = console.keys["auditor"]
    assert await page.evaluate("sessionStorage.getItem('thinkgate.key')") == secret
    assert await page.evaluate("document.cookie") == ""
    assert secret not in await page.evaluate("JSON.stringify(localStorage)")
    # a filter keeps itself in the URL
    await page.get_by_label("Status").fill("ok")
    await page.get_by_label("Time range").select_option("24h")
    await page.get_by_role("button", name="Apply").click()
    await expect(page).to_have_url(f"{console.root}/console/#records?status=ok&range=24h")
    await all_badges(page, "verified", 3)
    assert secret not in page.url
    await page.get_by_label("Model").fill("qwen3")
    await page.get_by_role("button", name="Apply").click()
    await expect(page.locator(".empty")).to_have_text("No records match these filters.")
    # open one: header first, the body only on a click, and that read is recorded
    await page.goto(f"{console.root}/console/#record/1")
    await expect(page.locator("table.header")).to_contain_text("chat.completions")
    await expect(page.locator("main .badge").first).to_have_text("✓ verified")
    await page.get_by_role("button", name="Show the decrypted body").click()
    await expect(page.locator(".message.role-user")).to_contain_text("Explain TCP handshakes")
    await expect(page.locator("details.reasoning")).to_contain_text("TCP")
    await expect(page.locator(".access")).to_contain_text(
        "This read was recorded as access record 3"
    )
    await shot(page, tmp_path, "record")
    await page.locator(".access a").click()
    await expect(page.locator("table.header")).to_contain_text("access")
    await expect(page.locator("main .badge").first).to_have_text("✓ verified")
    assert not page.errors  # type: ignore[attr-defined]


async def test_signing_in_draws_the_records_once(console: Stack, browser: Browser) -> None:
    """One listing after sign-in: a second drawing would replace the filter form under a
    reader who already typed in it (CI saw a request id typed into the first one lost)."""
    page = await (await browser.new_context()).new_page()
    listings: list[str] = []
    page.on("request", lambda r: listings.append(r.url) if "/audit/v1/records?" in r.url else None)
    await page.goto(f"{console.root}/console/")
    await page.get_by_label("Auditor or admin key").fill(console.keys["auditor"])
    await page.get_by_label("Auditor or admin key").press("Enter")
    await all_badges(page, "verified", 3)
    assert len(listings) == 1, listings


async def test_request_ids_find_a_record(console: Stack, browser: Browser) -> None:
    async with httpx.AsyncClient(base_url=console.root) as client:
        listed = (await client.get("/audit/v1/records", headers={
            "authorization": f"Bearer {console.keys['auditor']}"})).json()["data"]  # fmt: skip
    wanted = listed[2]["request_id"]
    page = await sign_in(browser, console)
    await page.get_by_label("Request id").fill(wanted)
    await page.get_by_label("Request id").press("Enter")
    await all_badges(page, "verified", 1)
    await expect(page.locator("table.records tbody tr")).to_contain_text("2")


async def test_script_in_a_record_stays_text(
    stack_factory: Any, browser: Browser, tmp_path: Path
) -> None:
    stack = await stack_factory()
    sim = {"chunks": [["content", "<think>"], ["content", HOSTILE], ["content", "</think>"],
                      ["content", f"Answer: {HOSTILE} ```\n<b>code</b>\n```"]]}  # fmt: skip
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        await client.chat.completions.create(
            model="deepseek-r1", messages=[{"role": "user", "content": HOSTILE}],
            extra_body={"sim": sim},
        )  # fmt: skip
    page = await sign_in(browser, stack)
    await all_badges(page, "verified", 1)
    await page.goto(f"{stack.root}/console/#record/0")
    await page.get_by_role("button", name="Show the decrypted body").click()
    await expect(page.locator(".access")).to_contain_text("access record")
    main = page.locator("main")
    await expect(main).to_contain_text("<script>window.__pwned = 1</script>")
    await expect(main).to_contain_text("[click me](javascript:window.__pwned=3)")
    assert await page.evaluate("window.__pwned") is None
    assert await main.locator("script, img, b, a[href^='javascript']").count() == 0
    await expect(main.locator("pre.code code").first).to_have_text("<b>code</b>\n")
    await shot(page, tmp_path, "hostile-record")


async def test_a_changed_header_byte_fails_its_badge(
    console: Stack, browser: Browser, tmp_path: Path
) -> None:
    with sqlite3.connect(tmp_path / "gw.db") as db:  # whoever holds the database
        for (trigger,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                                     "AND tbl_name = 'ledger_entries'").fetchall():  # fmt: skip
            db.execute(f'DROP TRIGGER "{trigger}"')  # write-once is the database's own rule
        (header,) = db.execute("SELECT header FROM ledger_entries WHERE idx = 1").fetchone()
        db.execute("UPDATE ledger_entries SET header = ? WHERE idx = 1",
                   (header.replace(b'"stream":false', b'"stream":true '),))  # fmt: skip
    page = await sign_in(browser, console)
    badges = page.locator("table.records .badge")
    await expect(badges.nth(1)).to_have_text("✗ FAILED")
    assert "do not hash to its leaf" in (await badges.nth(1).get_attribute("title") or "")
    await expect(badges.nth(0)).to_have_text("✓ verified")
    await expect(badges.nth(2)).to_have_text("✓ verified")
    await shot(page, tmp_path, "tampered")


async def test_a_changed_proof_hash_fails(console: Stack, browser: Browser) -> None:
    async def flip(route: Route) -> None:
        response = await route.fetch()
        body = await response.json()
        first = bytearray(base64.b64decode(body["hashes"][0]))
        first[0] ^= 1
        body["hashes"][0] = base64.b64encode(first).decode()
        await route.fulfill(response=response, json=body)

    page = await sign_in(browser, console)
    await all_badges(page, "verified", 3)
    await page.route("**/audit/v1/proof/inclusion*", flip)
    await page.reload()
    await all_badges(page, "FAILED", 3)
    title = await page.locator("table.records .badge").first.get_attribute("title")
    assert title == "the inclusion proof does not lead to the signed root"


async def test_a_bad_checkpoint_signature_is_loud(console: Stack, browser: Browser) -> None:
    async def forge(route: Route) -> None:
        response = await route.fetch()
        note = await response.text()
        text, signature = note.rsplit(" ", 1)
        raw = bytearray(base64.b64decode(signature))
        raw[10] ^= 1
        await route.fulfill(response=response, body=f"{text} {base64.b64encode(raw).decode()}\n")

    page = await sign_in(browser, console)
    await all_badges(page, "verified", 3)
    await page.route("**/audit/v1/checkpoint", forge)
    await page.reload()
    await expect(page.locator("#checkpoint")).to_have_text("log NOT verified")
    await expect(page.locator("#banner [role=alert]")).to_contain_text(
        "the checkpoint's signature is invalid"
    )
    await all_badges(page, "FAILED", 3)


@pytest.mark.parametrize("fork", ["rewritten", "shrunk"])
async def test_a_checkpoint_that_does_not_extend_the_pinned_one_is_caught(
    console: Stack, browser: Browser, tmp_path: Path, fork: str
) -> None:
    """Signed with the log's own key (the operator controls it): only the consistency check
    against the checkpoint this browser kept can catch a rewritten history."""
    page = await sign_in(browser, console)
    await all_badges(page, "verified", 3)
    async with openai.AsyncOpenAI(base_url=console.url, api_key=console.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        await client.chat.completions.create(
            model="deepseek-r1", max_tokens=20, messages=[{"role": "user", "content": "Hi"}]
        )  # the real tree grows to 4
    size = 4 if fork == "rewritten" else 2
    origin = log_origin(tmp_path)
    signer = NoteSigner(origin, load_signing_key(tmp_path / "signing-key.pem"))
    forged = signer.sign(f"{origin}\n{size}\n{base64.b64encode(bytes(32)).decode()}\n")

    async def serve_forged(route: Route) -> None:
        await route.fulfill(status=200, body=forged, content_type="text/plain; charset=utf-8")

    await page.route("**/audit/v1/checkpoint", serve_forged)
    await page.reload()
    await expect(page.locator("#checkpoint")).to_have_text("log NOT verified")
    expected = ("does not extend the one of size 3" if fork == "rewritten"
                else "the log shrank from 3 to 2 records")  # fmt: skip
    await expect(page.locator("#banner [role=alert]")).to_contain_text(expected)
    await shot(page, tmp_path, f"fork-{fork}")


async def test_a_served_key_other_than_the_pinned_one_is_refused(
    console: Stack, browser: Browser
) -> None:
    page = await (await browser.new_context()).new_page()
    await page.goto(f"{console.root}/console/")
    await page.get_by_label("Auditor or admin key").fill(console.keys["auditor"])
    wrong = "thinkgate.local/ledger+00000000+AQ" + "A" * 42 + "="
    await page.get_by_label("Log verifier key (optional)").fill(wrong)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("[role=alert]")).to_contain_text("not the pinned " + wrong)
    assert await page.evaluate("sessionStorage.getItem('thinkgate.key')") is None


async def test_export_downloads_a_file_the_offline_verifier_accepts(
    console: Stack, browser: Browser, tmp_path: Path
) -> None:
    page = await sign_in(browser, console, accept_downloads=True)
    await all_badges(page, "verified", 3)
    await page.get_by_role("link", name="Export").click()
    async with page.expect_download() as started:
        await page.get_by_role("button", name="Download export").click()
    download = await started.value
    saved = tmp_path / download.suggested_filename
    await download.save_as(saved)
    await expect(page.locator("main")).to_contain_text("3 records and the checkpoint")
    command = await page.locator("#verify-command").inner_text()
    assert command == (f"thinkgate ledger verify --export {download.suggested_filename} "
                       "--public-key verifier.key")  # fmt: skip
    async with page.expect_download() as key_started:
        await page.get_by_role("button", name="Download the pinned verifier key").click()
    key_file = tmp_path / "verifier.key"
    await (await key_started.value).save_as(key_file)
    verifier = NoteVerifier(key_file.read_text().strip())
    with saved.open("rb") as lines:
        report = check_export(lines, verifier)
    assert (report.records, report.tree_size) == (3, 3)
    await shot(page, tmp_path, "export")


async def test_the_overview_draws_from_headers(
    console: Stack, browser: Browser, tmp_path: Path
) -> None:
    page = await sign_in(browser, console)
    await all_badges(page, "verified", 3)
    await page.get_by_role("link", name="Overview").click()
    await expect(page.locator("svg.chart")).to_have_count(2)
    await expect(page.locator("table.top").first).to_contain_text("deepseek-r1")
    await expect(page.locator("main")).to_contain_text("3 completions.")
    assert await page.locator("svg.chart rect").count() == 3  # ok; reasoning and answer
    await shot(page, tmp_path, "overview")
    # no decryption for charts: the ledger holds no access record
    async with httpx.AsyncClient(base_url=console.root) as client:
        access = (await client.get("/audit/v1/records?kind=access", headers={
            "authorization": f"Bearer {console.keys['auditor']}"})).json()["data"]  # fmt: skip
    assert access == []


async def test_a_shredded_tenants_body_shows_destroyed(
    console: Stack, browser: Browser, tmp_path: Path
) -> None:
    await shred(settings_of(tmp_path), "acme")
    page = await sign_in(browser, console)
    await all_badges(page, "verified", 4)  # the three completions and the shred
    await page.goto(f"{console.root}/console/#record/0")
    await page.get_by_role("button", name="Show the decrypted body").click()
    await expect(page.locator(".destroyed")).to_contain_text("Destroyed")
    await expect(page.locator("main")).to_contain_text("Shredded by record 3")
    await shot(page, tmp_path, "destroyed")


async def test_an_admin_creates_and_revokes_a_key(
    console: Stack, browser: Browser, tmp_path: Path
) -> None:
    page = await sign_in(browser, console, key="admin", viewport={"width": 400, "height": 900})
    await expect(page.locator("table.keys")).to_contain_text("acme")
    await page.get_by_label("Tenant", exact=True).fill("initech")
    await page.get_by_label("Role").select_option("client")
    await page.get_by_label("Reasoning").select_option("visible")
    await page.get_by_label("Requests/min").fill("60")
    await page.get_by_role("button", name="Create key").click()
    secret = await page.get_by_label("The new key's secret").input_value()
    assert secret.startswith("sk-tg-")
    await shot(page, tmp_path, "keys-narrow")
    async with openai.AsyncOpenAI(base_url=console.url, api_key=secret, max_retries=0) as client:
        assert (await client.models.list()).data  # the new key works
    key_id = secret.split("-")[2]
    row = page.locator("table.keys tr", has_text=key_id)
    await expect(row).to_contain_text("initech")
    await row.get_by_role("button", name=f"Revoke key {key_id}").click()
    await row.get_by_role("button", name=f"Confirm revoking key {key_id}").click()
    await expect(page.locator("table.keys tr", has_text=key_id)).to_contain_text("revoked")
    async with openai.AsyncOpenAI(base_url=console.url, api_key=secret, max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()


async def test_a_client_key_cannot_sign_in(console: Stack, browser: Browser) -> None:
    page = await sign_in(browser, console, key="visible")
    await expect(page.locator("[role=alert]")).to_contain_text("needs a key with the role")
    assert await page.evaluate("sessionStorage.getItem('thinkgate.key')") is None


async def test_only_an_all_tenants_auditor_gets_a_tenant_filter(
    console: Stack, browser: Browser, tmp_path: Path
) -> None:
    page = await sign_in(browser, console)
    await all_badges(page, "verified", 3)
    await expect(page.get_by_label("Tenant", exact=True)).to_have_count(0)  # acme's own only
    await expect(page.locator("#nav")).to_contain_text("tenant acme")
    console.keys["star"] = await new_key(tmp_path, "*", "auditor")
    star = await sign_in(browser, console, key="star")
    await all_badges(star, "verified", 3)
    await star.get_by_label("Tenant", exact=True).fill("globex")
    await star.get_by_role("button", name="Apply").click()
    await expect(star.locator(".empty")).to_have_text("No records match these filters.")
    await star.get_by_label("Tenant", exact=True).fill("acme")
    await star.get_by_role("button", name="Apply").click()
    await all_badges(star, "verified", 3)


async def test_guardrail_acts_are_shown_and_filtered(
    stack_factory: Any, tmp_path: Path, browser: Browser
) -> None:
    policies = tmp_path / "guardrails.yaml"
    policies.write_text("policies:\n  - {name: pii, detect: [email], action: redact}\n")
    stack: Stack = await stack_factory(guardrails_file=policies)
    planted = {"sim": {"chunks": ["Mail jane.doe@example.com today", "</think>", "\n\nDone."]}}
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        for extra in ({}, planted, {}):
            await client.chat.completions.create(
                model="deepseek-r1", max_tokens=200, extra_body=extra,
                messages=[{"role": "user", "content": "Who do I write to?"}],
            )  # fmt: skip
    page = await sign_in(browser, stack)
    await all_badges(page, "verified", 3)
    rows = page.locator("table.records tbody tr")
    await expect(
        rows.filter(has=page.locator(".tag.guardrail", has_text="pii:redact"))
    ).to_have_count(1)
    await page.get_by_label("Guardrail policy").fill("pii")
    await page.get_by_label("Guardrail policy").press("Enter")
    await all_badges(page, "verified", 1)
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("pii:redact")
    await rows.first.get_by_role("link").click()
    await expect(page.locator("table.header")).to_contain_text('["pii:redact"]')
    assert "jane.doe@example.com" not in await page.content()
    assert page.errors == []  # type: ignore[attr-defined]


async def test_retention_and_holds_are_shown_and_held_records_marked(
    stack_factory: Any, tmp_path: Path, browser: Browser
) -> None:
    stack: Stack = await stack_factory(retention_days=365)
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        await client.chat.completions.create(
            model="deepseek-r1", max_tokens=50, messages=[{"role": "user", "content": "Hi"}]
        )
    admin = {"authorization": f"Bearer {stack.keys['admin']}"}
    async with httpx.AsyncClient(base_url=stack.root, headers=admin) as http:
        hold = (await http.post("/admin/v1/holds", json={
            "tenant": "acme", "reason": "SEC inquiry 7"})).json()  # fmt: skip
        await http.put("/admin/v1/retention/acme", json={"days": 2190})
    page = await sign_in(browser, stack)
    rows = page.locator("table.records tbody tr")
    held = rows.filter(has=page.locator(".tag.held", has_text=f"held: {hold['id']}"))
    # every acme record: the completion, the hold's own record and the retention setting's
    await expect(held).to_have_count(3)
    await page.get_by_role("link", name="Retention").click()
    await expect(page.get_by_role("heading", name="Tenant acme")).to_be_visible()
    await expect(page.locator("main")).to_contain_text("2190 days")
    await expect(page.locator("main")).to_contain_text("The gateway's default retention: 365 days")
    await expect(page.locator("table.holds tbody tr")).to_contain_text("SEC inquiry 7")
    assert page.errors == []  # type: ignore[attr-defined]
