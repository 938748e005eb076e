"""Prefix-aware routing in front of two real vLLM 0.32 servers (CPU) that publish their KV
events: a conversation's next turns go to the engine that holds its prefix and vLLM reports the
cached tokens the router expected; a cleared cache is no longer preferred; one tenant never
reuses another's cached prompt. Block size on the CPU is 128 tokens; the tiny model's tokenizer
makes about a token per character."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.upstream.router import Router
from tests.e2e.conftest import RecordingSink, ledger_files, make_keys
from tests.integration_vllm.conftest import ROUTE, VllmServer
from tests.waiting import eventually

MODEL = ROUTE
SYSTEM = "You are a careful assistant who answers briefly. " * 5  # ~250 tokens: 1 full block


@dataclass
class Routing:
    url: str
    keys: dict[str, str]
    app: Any  # the front door, its framework app the FastAPI one
    servers: list[VllmServer]
    sharing: str = "tenant"

    @property
    def router(self) -> Router:
        router = self.app.framework.state.tg.router
        assert router is not None
        return router  # type: ignore[no-any-return]

    async def ask(self, messages: list[dict[str, Any]], key: str = "visible") -> tuple[
            str, int, str]:  # fmt: skip
        """The answer's text, vLLM's cached tokens and the gateway's routing header."""
        async with openai.AsyncOpenAI(base_url=self.url, api_key=self.keys[key],
                                      max_retries=0) as client:  # fmt: skip
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,
                max_tokens=4,
                temperature=0,  # type: ignore[arg-type]
            )
        whole = raw.parse()
        assert whole.usage is not None and whole.usage.prompt_tokens_details is not None
        cached = whole.usage.prompt_tokens_details.cached_tokens or 0
        return whole.choices[0].message.content or "", cached, raw.headers["x-thinkgate-route"]

    def holding(self) -> list[str]:
        index = self.router.index
        return [s.url for s in self.servers if index is not None and index.size(s.url)]


async def _routing(servers: list[VllmServer], tmp_path: Any,
                   **options: Any) -> AsyncIterator[Routing]:  # fmt: skip
    settings = Settings(
        upstreams=tuple(s.url for s in servers),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        models={MODEL: {"reasoning_parser": "none"}},
        first_token_timeout_s=180,
        **ledger_files(tmp_path),
        **options,
    )
    ensure_keys(settings.ledger, create=True)
    keys = await make_keys(settings)
    app = create_app(settings, sink=RecordingSink())
    async with BackgroundServer(app) as server:
        gw = Routing(f"{server.url}/v1", keys, app, servers)
        await eventually(lambda: hasattr(app.framework.state, "tg"), within_s=10)  # started
        # subscribed to every engine's events, found by asking each (GET /kv_event_sources)
        await eventually(lambda: len(gw.router.feeds) == len(servers), within_s=30)
        yield gw


@pytest.fixture
async def routing(routing_servers: list[VllmServer], tmp_path: Any) -> AsyncIterator[Routing]:
    async for gw in _routing(routing_servers, tmp_path):
        yield gw


@pytest.fixture(params=["tenant", "global"])
async def one_engine(
    routing_servers: list[VllmServer], tmp_path: Any, request: pytest.FixtureRequest
) -> AsyncIterator[Routing]:
    """One engine, so that both tenants' requests reach the same cache."""
    async for gw in _routing(routing_servers[:1], tmp_path, prefix_cache_sharing=request.param):
        gw.sharing = request.param
        yield gw


async def _reset(server: VllmServer) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        (await client.post(f"{server.root}/reset_prefix_cache")).raise_for_status()


async def test_a_conversations_turns_go_to_the_engine_holding_its_prefix(
    routing: Routing,
) -> None:
    for server in routing.servers:  # whatever earlier tests left
        await _reset(server)
    turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there."}]
    answer, cached, _ = await routing.ask(turn)
    assert cached == 0
    await eventually(lambda: len(routing.holding()) == 1, within_s=30)
    (holder,) = routing.holding()
    for words in ("And now?", "Once more."):
        turn = [*turn, {"role": "assistant", "content": answer}, {"role": "user", "content": words}]
        before = {s.url: s for s in routing.servers}[holder]
        answer, cached, said = await routing.ask(turn)
        assert said.startswith("prefix; cached=")
        expected = int(said.split("=")[1])
        assert cached > 0 and abs(cached - expected) <= 128  # to one block
        assert routing.holding() and holder in routing.holding() and before.url == holder


async def test_after_its_cache_is_cleared_an_engine_is_no_longer_preferred(
    routing: Routing,
) -> None:
    turn = [{"role": "system", "content": SYSTEM + " Second."},
            {"role": "user", "content": "Hi."}]  # fmt: skip
    for server in routing.servers:
        await _reset(server)
    await routing.ask(turn)
    await eventually(lambda: routing.holding(), within_s=30)  # its events came in
    _, cached, said = await routing.ask(turn)
    assert said.startswith("prefix") and cached > 0
    for server in routing.servers:
        await _reset(server)
        # vLLM publishes AllBlocksCleared at its next step: one request directly to it
        async with httpx.AsyncClient(timeout=60) as client:
            await client.post(f"{server.url}/completions",
                              json={"model": MODEL, "prompt": "x", "max_tokens": 1})  # fmt: skip
    await eventually(lambda: not routing.holding(), within_s=30)
    _, cached, said = await routing.ask(turn)
    assert not said.startswith("prefix") and cached == 0


async def test_one_tenant_never_reuses_anothers_cached_prompt(one_engine: Routing) -> None:
    """By default; with ``PREFIX_CACHE_SHARING=global`` (the control) it does."""
    prompt = [{"role": "system", "content": f"{SYSTEM} Private to {one_engine.sharing}."},
              {"role": "user", "content": "Secret question."}]  # fmt: skip
    await one_engine.ask(prompt, key="visible")  # tenant acme
    _, theirs, _ = await one_engine.ask(prompt, key="other")  # tenant globex, the same prompt
    _, again, _ = await one_engine.ask(prompt, key="visible")
    assert again > 0
    assert (theirs == 0) if one_engine.sharing == "tenant" else (theirs > 0)
