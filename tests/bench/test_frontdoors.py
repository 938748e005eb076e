"""The protocol front door of ``bench.frontdoors`` relays a stream whole, keeps the connection
alive between requests, and refuses a wrong key: its figures are a relay's, not a shortcut's."""

from __future__ import annotations

import asyncio

import httpx

from bench.relay_doors import KEY, serve_protocol
from gateway.edge.servers import BackgroundServer
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.gateway.cli.test_main import free_port
from tests.waiting import eventually


async def test_the_protocol_door_relays_what_the_engine_sends() -> None:
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=0, itl_ms=0))) as sim:
        port = free_port()
        door = asyncio.create_task(serve_protocol(port, f"{sim.url}/v1"))
        body = {"model": "deepseek-r1", "stream": True, "max_tokens": 16,
                "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1") as client:

                async def up() -> bool:  # listening (the simulator has no /v1/health)
                    try:
                        await client.get("/health")
                    except httpx.TransportError:
                        return False
                    return True

                await eventually(up)
                auth = {"authorization": f"Bearer {KEY}"}
                relayed = [(await client.post("/chat/completions", json=body, headers=auth))
                           for _ in range(2)]  # one connection, kept alive  # fmt: skip
                refused = await client.post("/chat/completions", json=body)
            async with httpx.AsyncClient() as direct:
                straight = await direct.post(f"{sim.url}/v1/chat/completions", json=body)
        finally:
            door.cancel()
    assert refused.status_code == 401
    for reply in relayed:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert len(events) == len([x for x in straight.text.splitlines() if x.startswith("data: ")])
