"""Guardrail policies over real vLLM's streams (CPU, the tiny model, its text pinned by a
literal regex): vLLM's own chunking, behind its reasoning parser and behind thinkgate's
splitter, and the planted values reach neither the client nor the record."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import create_app
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from tests.e2e.conftest import RecordingSink, ledger_files, make_keys
from tests.integration_vllm.conftest import TinyModel, VllmServer
from tests.integration_vllm.test_vllm import MODELS, Gateway, stream

POLICIES = """
policies:
  - name: pii
    detect: [email, credit_card]
    action: redact
  - name: keys
    detect: [secret_key]
    scope: [answer]
    action: block
"""
# what the model is made to write: an address in its reasoning, a card number in its answer
PLANTED = r"Mail jane\.doe@example\.com now\.\n</think>\n\nCard 4111 1111 1111 1111 ok\."
SECRET = r"Check\.\n</think>\n\nThe key is AKIAIOSFODNN7EXAMPLE and more\."


@contextlib.asynccontextmanager
async def policed(vllm_servers: dict[str, VllmServer], tiny_model: TinyModel, tmp_path: Path,
                  policies: str) -> AsyncIterator[Gateway]:  # fmt: skip
    """A gateway over both vLLM servers with ``policies`` as its GUARDRAILS_FILE."""
    path = tmp_path / "guardrails.yaml"
    path.write_text(policies)
    settings = Settings(
        upstreams=(vllm_servers["parsed"].url, vllm_servers["raw"].url),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        models={"tiny-r1-parsed": {"reasoning_source": "upstream"}},
        first_token_timeout_s=180,
        guardrails_file=path,
        **ledger_files(tmp_path),
    )
    ensure_keys(settings.ledger, create=True)
    keys = await make_keys(settings)
    sink = RecordingSink()
    async with BackgroundServer(create_app(settings, sink=sink)) as server:
        yield Gateway(f"{server.url}/v1", keys, sink, tiny_model)


@pytest.fixture
async def guarded(
    vllm_servers: dict[str, VllmServer], tiny_model: TinyModel, tmp_path: Path
) -> AsyncIterator[Gateway]:
    async with policed(vllm_servers, tiny_model, tmp_path, POLICIES) as gateway:
        yield gateway


async def pinned_stream(gw: Gateway, model: str, regex: str) -> tuple[str, str, list[Any]]:
    """A streamed chat request whose output vLLM is made to write as ``regex`` spells it."""
    return await stream(gw, model, max_tokens=100, extra_body=gw.pinned(regex))


@pytest.mark.parametrize("model", MODELS)
async def test_planted_values_are_redacted_in_vllms_own_chunking(
    guarded: Gateway, model: str
) -> None:
    reasoning, content, _ = await pinned_stream(guarded, model, PLANTED)
    assert (reasoning, content) == ("Mail [EMAIL] now.\n", "\n\nCard [CREDIT_CARD] ok.")
    [record] = await guarded.sink.wait_for(1)
    assert record.reasoning == ("Mail [EMAIL] now.\n",)
    assert record.content == ("\n\nCard [CREDIT_CARD] ok.",)
    assert [a.detector for _, a in record.guardrails] == ["email", "credit_card"]


@pytest.mark.parametrize("model", MODELS)
async def test_a_secret_in_the_answer_ends_it_with_content_filter(
    guarded: Gateway, model: str
) -> None:
    _, content, chunks = await pinned_stream(guarded, model, SECRET)
    assert content == "\n\nThe key is "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "content_filter"
    [record] = await guarded.sink.wait_for(1)
    assert record.finish_reasons == ("content_filter",)
    assert all("AKIA" not in text for text in record.content)
