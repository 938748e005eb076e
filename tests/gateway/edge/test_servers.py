"""``BackgroundServer`` (``gateway/edge/servers.py``): stopped, it stops at once and gracefully.
A response in flight is finished first, an idle keep-alive connection is closed without
holding the stop, a response that outlives the graceful timeout is cancelled, and the app's
lifespan shutdown runs after the connections are done."""

from __future__ import annotations

import asyncio
import time

import httpx
from starlette.types import Receive, Scope, Send

from gateway.edge.servers import BackgroundServer
from tests.waiting import eventually


class App:
    """Lifespan events in ``seen``; ``/stream`` sends one chunk, then a second once ``more``
    is set; ``/`` answers at once."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.more = asyncio.Event()
        self.streaming = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                self.seen.append(kind)
                await send({"type": f"{message['type']}.complete"})
                if kind == "shutdown":
                    return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if scope["path"] != "/stream":
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await send({"type": "http.response.body", "body": b"first ", "more_body": True})
        self.streaming.set()
        try:
            await self.more.wait()
        except asyncio.CancelledError:
            self.seen.append("cancelled")
            raise
        self.seen.append("finished")
        await send({"type": "http.response.body", "body": b"second"})


async def test_a_response_in_flight_is_finished_before_the_lifespan_shuts_down() -> None:
    app = App()
    server = BackgroundServer(app)
    await server.__aenter__()
    async with httpx.AsyncClient(base_url=server.url) as idle, \
            httpx.AsyncClient(base_url=server.url) as client:  # fmt: skip
        assert (await idle.get("/")).text == "ok"  # a keep-alive connection, left idle
        async with client.stream("GET", "/stream") as response:
            await app.streaming.wait()
            assert server.open_connections == 2
            stopping = asyncio.create_task(server.__aexit__(None, None, None))
            await eventually(lambda: server.open_connections == 1, within_s=5)  # idle closed
            assert not stopping.done() and app.seen == ["startup"]
            app.more.set()
            body = await response.aread()
        await stopping
    assert body == b"first second"
    assert app.seen == ["startup", "finished", "shutdown"]


async def test_a_response_that_outlives_the_graceful_timeout_is_cancelled() -> None:
    app = App()
    server = BackgroundServer(app)
    await server.__aenter__()
    async with httpx.AsyncClient(base_url=server.url) as client, \
            client.stream("GET", "/stream") as response:  # fmt: skip
        await app.streaming.wait()
        began = time.monotonic()
        await server.__aexit__(None, None, None)
        waited = time.monotonic() - began
        assert response.status_code == 200
    assert app.seen == ["startup", "cancelled", "shutdown"]
    assert waited >= 2  # uvicorn.Config's timeout_graceful_shutdown, as BackgroundServer sets


async def test_an_idle_server_stops_without_waiting_for_a_tick() -> None:
    """uvicorn's own server sleeps 0.1 s in every stop, on top of its tick: no stop of it
    takes less. Here a stop waits for nothing that is not open (the quickest of ten stops,
    which a loaded machine may slow one by one but hardly all)."""
    stops = []
    for _ in range(10):
        app = App()
        server = BackgroundServer(app)
        await server.__aenter__()
        began = time.monotonic()
        await server.__aexit__(None, None, None)
        stops.append(time.monotonic() - began)
        assert app.seen == ["startup", "shutdown"]
    assert min(stops) < 0.1, stops
