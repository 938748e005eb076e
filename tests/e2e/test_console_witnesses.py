"""The console with a witness policy: records are verified only against checkpoints the
trusted witnesses cosigned (two ``thinkgate witness`` processes, as in ``test_witness``), and a
policy no checkpoint meets is loud."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from playwright.async_api import Browser, expect

from audit.witness import Cosigner, CosignerKey, WitnessPolicy
from tests.e2e.conftest import Stack
from tests.e2e.test_console import all_badges, browser, shot
from tests.e2e.test_witness import complete, cosigned_by, eventually, witnessed

__all__ = ["browser", "witnessed"]


async def sign_in_with(browser: Browser, stack: Stack, witnesses: str, quorum: str = "") -> Any:
    page = await (await browser.new_context()).new_page()
    await page.goto(f"{stack.root}/console/")
    await page.get_by_label("Auditor or admin key").fill(stack.keys["auditor"])
    await page.get_by_label("Witness keys (optional, one per line)").fill(witnesses)
    await page.get_by_label("Cosignatures required").fill(quorum)
    await page.get_by_role("button", name="Sign in").click()
    return page


async def test_records_are_verified_against_what_the_witnesses_cosigned(
    witnessed: tuple[Stack, list[tuple[str, Cosigner]]], browser: Browser, tmp_path: Path
) -> None:
    stack, witnesses = witnessed
    keys = "\n".join(c.verifier_key for _, c in witnesses)
    await complete(stack, 3)
    policy = WitnessPolicy(tuple(CosignerKey.parse(c.verifier_key) for _, c in witnesses), 2)
    await eventually(lambda: cosigned_by(stack, policy))
    page = await sign_in_with(browser, stack, keys)
    await all_badges(page, "verified", 3)
    await expect(page.locator("#checkpoint")).to_contain_text("cosigned by 2 witnesses")
    await shot(page, tmp_path, "witnessed")


async def test_a_policy_no_checkpoint_meets_is_loud(
    witnessed: tuple[Stack, list[tuple[str, Cosigner]]], browser: Browser
) -> None:
    stack, witnesses = witnessed

    stranger = Cosigner("witness.test/never", Ed25519PrivateKey.generate()).verifier_key
    await complete(stack, 1)
    page = await sign_in_with(browser, stack, f"{witnesses[0][1].verifier_key}\n{stranger}", "2")
    await expect(page.locator("#checkpoint")).to_have_text("log NOT verified")
    await expect(page.locator("#banner [role=alert]")).to_contain_text(
        "no checkpoint carries 2 cosignatures of the trusted witnesses"
    )
    await all_badges(page, "FAILED", 1)


async def test_a_bad_witness_key_is_refused_at_sign_in(
    witnessed: tuple[Stack, list[tuple[str, Cosigner]]], browser: Browser
) -> None:
    stack, _ = witnessed
    page = await sign_in_with(browser, stack, "not a key")
    await expect(page.locator("[role=alert]")).to_contain_text("not a witness key")
    assert await page.evaluate("sessionStorage.getItem('thinkgate.key')") is None
