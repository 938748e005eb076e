"""Prefix-aware routing through the whole gateway, in front of two simulators that keep a
prefix cache and publish vLLM's KV events: each API's own client sees the cached tokens where
it reads them, a conversation stays on the engine that holds it, a session without events
keeps to one engine, and a hot shared prefix is spread over both."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai

from gateway.side.sim.app import SimApp, SimConfig, create_sim_app
from gateway.upstream.router import Router
from tests.e2e.conftest import StackFactory
from tests.waiting import eventually

MODEL = "deepseek-v3"  # the simulator's model without reasoning
SYSTEM = "You are a meticulous assistant for the payments team. " * 40  # ~540 tokens
EVENTS = SimConfig(kv_events="tcp://127.0.0.1:0", kv_events_replay="tcp://127.0.0.1:0",
                   prompt_cache=True)  # fmt: skip


async def _two(stack_factory: StackFactory, config: SimConfig = EVENTS,
               **settings: Any) -> tuple[Any, list[SimApp]]:  # fmt: skip
    sims = [create_sim_app(config), create_sim_app(config)]
    stack = await stack_factory(upstream_apps=sims, **settings)
    return stack, sims


def _router(stack: Any) -> Router:
    router = stack.app.framework.state.tg.router
    assert router is not None
    return router  # type: ignore[no-any-return]


async def _subscribed(stack: Any, sims: list[SimApp]) -> Router:
    """Every engine's events found (``GET /kv_event_sources``) and subscribed to."""
    await eventually(lambda: hasattr(stack.app.framework.state, "tg"), within_s=10)
    router = _router(stack)
    await eventually(lambda: len(router.feeds) == len(sims), within_s=15)
    return router


def _served(sims: list[SimApp]) -> list[int]:
    return [s.sim.requests_total for s in sims]


async def test_each_apis_client_reads_the_engines_cached_tokens(
    stack_factory: StackFactory,
) -> None:
    stack, sims = await _two(stack_factory)
    router = await _subscribed(stack, sims)
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        messages: list[Any] = [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": "Summarise the ledger."}]  # fmt: skip
        first = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        assert first.usage is not None and first.usage.prompt_tokens_details is not None
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        holder = next(i for i, n in enumerate(_served(sims)) if n)
        upstreams = router.pool.upstreams
        index = router.index  # made with the first subscription, which the fixture waited for
        assert index is not None
        await eventually(lambda: index.size(upstreams[holder].base_url) > 0)
        # the next turn: routed to the engine holding the first, and cached there
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=8,
            messages=[*messages, {"role": "assistant", "content": "Done."},
                      {"role": "user", "content": "And the tiles?"}],
        )  # fmt: skip
        assert raw.headers["x-thinkgate-route"].startswith("prefix")
        second = raw.parse()
        assert second.usage.prompt_tokens_details.cached_tokens > 0
        expected = int(raw.headers["x-thinkgate-route"].split("=")[1])
        assert second.usage.prompt_tokens_details.cached_tokens == expected
        assert _served(sims)[1 - holder] == 0  # every turn went to the holder

        response = await client.responses.create(
            model=MODEL, instructions=SYSTEM, input="Summarise the ledger.", max_output_tokens=8
        )
        again = await client.responses.create(
            model=MODEL, instructions=SYSTEM, input="Summarise the ledger.", max_output_tokens=8
        )
        assert response.usage is not None and again.usage is not None
        assert again.usage.input_tokens_details.cached_tokens > 0
    async with anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["visible"],
                                        max_retries=0) as claude:  # fmt: skip
        question = [{"role": "user", "content": "Summarise the ledger."}]
        # a system prompt of its own: nothing of it cached yet
        asked: Any = {"model": MODEL, "max_tokens": 8, "system": f"Claude. {SYSTEM}",
                      "messages": question}  # fmt: skip
        cold = (await claude.messages.create(**asked)).usage
        warm = (await claude.messages.create(**asked)).usage
        assert not cold.cache_read_input_tokens and warm.cache_read_input_tokens
        # Anthropic's input_tokens leaves the cache reads out: the two add up to the prompt
        assert warm.input_tokens + warm.cache_read_input_tokens == cold.input_tokens


async def test_without_events_a_session_keeps_to_one_engine(stack_factory: StackFactory) -> None:
    stack, sims = await _two(stack_factory, SimConfig(prompt_cache=True))
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        # rendezvous hashing over engines named by their (random) ports: with 16 sessions, all
        # on one engine by chance is 2 in 65,536 (with 6, 1 run in 32 failed)
        for session in (f"session-{i}" for i in range(16)):
            before = _served(sims)
            for turn in range(3):
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL, max_tokens=4, extra_headers={"x-session-id": session},
                    messages=[{"role": "user", "content": f"{SYSTEM} turn {turn}"}],
                )  # fmt: skip
                assert raw.headers["x-thinkgate-route"] == "session"
            grown = [a - b for a, b in zip(_served(sims), before, strict=True)]
            assert sorted(grown) == [0, 3]  # all three turns on one engine
    assert all(_served(sims))  # and the sessions spread over both


async def test_a_hot_prefix_shared_by_every_session_is_spread(stack_factory: StackFactory) -> None:
    """Every request holds the same long system prompt, cached on one engine: bounded load
    sends the overflow to the other."""
    slow = SimConfig(kv_events="tcp://127.0.0.1:0", kv_events_replay="tcp://127.0.0.1:0",
                     prompt_cache=True, ttft_ms=200)  # fmt: skip
    stack, sims = await _two(stack_factory, slow)
    await _subscribed(stack, sims)
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip

        async def ask(i: int) -> Any:
            return await client.chat.completions.create(
                model=MODEL, max_tokens=2,
                messages=[{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": f"question {i}"}],
            )  # fmt: skip

        await ask(-1)
        await eventually(lambda: any(s.sim.prefix and len(s.sim.prefix) for s in sims))
        await asyncio.gather(*(ask(i) for i in range(16)))
    served = _served(sims)
    assert min(served) >= 4, served  # neither engine took (nearly) everything
