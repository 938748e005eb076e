"""The upstream pool keeps connections alive across requests, streamed or not."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.app import create_app
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import ledger_files, make_keys
from tests.tcpproxy import TcpProxy
from tests.waiting import eventually


class PortRecorder:
    """Wraps an ASGI app and records the client port of every request: one port, one
    connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.ports: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Not /metrics, /health or /kv_event_sources: the KV scraper, the prober and the
        # router's discovery of KV events keep their own schedule.
        if scope["type"] == "http" and scope["path"] not in (
            "/metrics",
            "/health",
            "/kv_event_sources",
        ):
            self.ports.append(scope["client"][1])
        await self.app(scope, receive, send)


async def test_sequential_requests_reuse_one_upstream_connection(tmp_path: Any) -> None:
    recorder = PortRecorder(create_sim_app(SimConfig()))
    async with BackgroundServer(recorder) as sim:
        settings = Settings(
            upstreams=(f"{sim.url}/v1",),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
            models_cache_ttl_s=3600,
            **ledger_files(tmp_path),
        )
        ensure_keys(settings.ledger, create=True)
        keys = await make_keys(settings)
        async with BackgroundServer(create_app(settings)) as gateway, httpx.AsyncClient() as client:
            headers = {"authorization": f"Bearer {keys['visible']}"}
            for stream in (True, False, True, True, False):
                body = {
                    "model": "deepseek-r1",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": stream,
                    "max_tokens": 20,
                }
                response = await client.post(
                    f"{gateway.url}/v1/chat/completions", json=body, headers=headers
                )
                assert response.status_code == 200
            # streams go over the wire client, the rest over aiohttp: keep-alive connections
            # carried the three streams on one, and the catalogue fetch and both whole
            # requests on one (or two, when the start-up health probe raced the catalogue
            # fetch); without reuse, six
            ports = recorder.ports
            assert len(ports) == 6
            assert len({ports[1], ports[3], ports[4]}) == 1
            assert len({ports[0], ports[2], ports[5]}) <= 2
            assert sim.open_connections <= 3


async def test_a_dead_engine_leaves_rotation_and_comes_back(tmp_path: Any) -> None:
    """Engine A dies (its port refuses): clients still get answers (retry on B before the first
    byte), A's probe fails and A leaves rotation; when A answers again it gets traffic again."""
    fast = SimConfig(ttft_ms=1, itl_ms=1)
    sim_a, sim_b = create_sim_app(fast), create_sim_app(fast)
    async with (
        BackgroundServer(sim_a) as a,
        BackgroundServer(sim_b) as b,
        TcpProxy(a.host, a.port) as proxy,
    ):
        settings = Settings(
            upstreams=(f"http://127.0.0.1:{proxy.port}/v1", f"{b.url}/v1"),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
            models_cache_ttl_s=3600,
            **ledger_files(tmp_path),
        )
        ensure_keys(settings.ledger, create=True)
        keys = await make_keys(settings)
        gateway_app = create_app(settings)
        async with BackgroundServer(gateway_app) as gateway, httpx.AsyncClient() as client:

            async def ask() -> None:
                body = {"model": "deepseek-r1", "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
                response = await client.post(
                    f"{gateway.url}/v1/chat/completions", json=body,
                    headers={"authorization": f"Bearer {keys['hidden']}"},
                )  # fmt: skip
                assert response.status_code == 200, response.text

            await ask()  # the lifespan has run: the app's state is there
            pool = gateway_app.framework.state.tg.upstreams  # type: ignore[attr-defined]
            engine_a = pool.upstreams[0]
            await proxy.stop()
            for _ in range(6):
                await ask()  # every one answered, by B
            await eventually(lambda: not engine_a.health.serving, within_s=5)
            served_by_a = sim_a.sim.requests_total
            await proxy.start()
            await eventually(lambda: engine_a.health.serving, within_s=5)

            async def a_serves_again() -> bool:
                await ask()
                return sim_a.sim.requests_total > served_by_a

            await eventually(a_serves_again, within_s=5)


async def test_a_whole_completion_may_take_longer_than_the_idle_timeout(
    stack_factory: Any,
) -> None:
    """A non-streamed answer is silent until the engine finished it: that wait is the first
    token's (``FIRST_TOKEN_TIMEOUT_S``), not a stall between reads (``IDLE_TIMEOUT_S``)."""
    stack = await stack_factory(sim=SimConfig(ttft_ms=800), idle_timeout_s=0.2,
                                first_token_timeout_s=30)  # fmt: skip
    body = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8}  # fmt: skip
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(f"{stack.url}/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message.get("reasoning_content") or message["content"]  # what the engine said
