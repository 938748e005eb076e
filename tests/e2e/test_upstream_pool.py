"""The upstream pool keeps connections alive across requests, streamed or not."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.app import create_app
from gateway.ledgersink import ensure_keys
from gateway.servers import BackgroundServer
from gateway.settings import Settings
from gateway.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import ledger_files, make_keys


class PortRecorder:
    """Wraps an ASGI app and records the client port of every request: one port, one
    connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.ports: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Not /metrics: the gateway's KV scraper reads it on its own schedule.
        if scope["type"] == "http" and scope["path"] != "/metrics":
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
        ensure_keys(settings, create=True)
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
            # one keep-alive connection carried the catalogue fetch and all five requests
            assert len(recorder.ports) == 6
            assert len(set(recorder.ports)) == 1
            assert sim.open_connections == 1
