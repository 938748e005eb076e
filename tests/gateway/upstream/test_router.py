"""The router's pure parts: what it asks ``/tokenize``, a request's session key, the header
(the rest is driven end to end in tests/e2e/test_prefix_routing.py and against real vLLM in
tests/integration_vllm/test_vllm_routing.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.upstream.router import Routed, session_of, tokenize_body


def test_a_chat_request_is_tokenized_as_the_engine_will_render_it() -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"x": 1}],
               "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 9,
               "stream": True}  # fmt: skip
    assert tokenize_body(request, "/chat/completions") == {
        "model": "m", "messages": request["messages"], "tools": [{"x": 1}],
        "chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": True,
    }  # fmt: skip
    continued = {**request, "continue_final_message": True}
    assert tokenize_body(continued, "/chat/completions")["add_generation_prompt"] is False  # type: ignore[index]


def test_a_completions_prompt_is_tokenized_or_already_tokens() -> None:
    assert tokenize_body({"model": "m", "prompt": "abc"}, "/completions") == {
        "model": "m", "prompt": "abc"}  # fmt: skip
    assert tokenize_body({"prompt": [1, 2, 3]}, "/completions") == {"tokens": [1, 2, 3]}
    assert tokenize_body({"prompt": ["a", "b"]}, "/completions") is None  # a batch
    assert tokenize_body({"input": "x"}, "/embeddings") is None


def test_the_session_key_is_the_first_a_client_sent() -> None:
    params = {"prompt_cache_key": "pck", "user": "u", "metadata": {"user_id": "claude-session"}}
    assert session_of("hdr", params) == "hdr"
    assert session_of(None, params) == "pck"
    assert session_of(None, {"metadata": {"user_id": "claude-session"}, "user": "u"}) == (
        "claude-session")  # fmt: skip
    assert session_of(None, {"user": "u"}) == "u"
    assert session_of(None, {"user": "", "metadata": "not a map"}) is None


def test_the_route_header_names_no_engine() -> None:
    assert Routed([], 1, "prefix", 384).header() == "prefix; cached=384"
    assert Routed([], 1, "session").header() == "session"
    assert Routed([], 0, "load").header() == "load"


async def test_an_engine_slow_to_tokenize_costs_the_prefix_never_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``/tokenize`` hangs (a fault injected by a stand-in engine): the request is routed by
    its session within the bound, not held."""
    import asyncio

    import orjson

    from gateway.cache.events import BlocksStored
    from gateway.cache.index import PrefixIndex
    from gateway.edge.servers import BackgroundServer
    from gateway.settings import Settings
    from gateway.upstream import router as router_module
    from gateway.upstream.pool import UpstreamPool, create_transport
    from gateway.upstream.router import Router

    never = asyncio.Event()

    async def engine(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await never.wait()  # /tokenize never answers

    monkeypatch.setattr(router_module, "TOKENIZE_S", 0.2)
    async with BackgroundServer(engine) as a, BackgroundServer(engine) as b:
        settings = Settings(upstreams=(f"{a.url}/v1", f"{b.url}/v1"))
        transport = create_transport(settings.upstream)
        pool = UpstreamPool(transport, settings.upstream)
        try:
            router = Router(settings.routing_section, pool)
            holder = pool.upstreams[0].base_url
            router.index = PrefixIndex()  # as an engine's subscription makes it
            router.index.apply(holder, [BlocksStored((1,), None, (1, 2), 2, (None,))])
            body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            async with asyncio.timeout(5):
                routed = await router.order(list(pool.upstreams), body, "/chat/completions", "s1")
            assert routed.reason == "session"
        finally:
            never.set()
            pool.close()
            await transport.aclose()
