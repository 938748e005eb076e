"""The simulator with every chat request scripted by the test (the Responses and Messages APIs
forward no field of their own to the engine, so a test scripts the engine instead)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from gateway.side.sim.app import SimConfig, create_sim_app


class Scripted:
    """The simulator with every chat request scripted by ``sim`` (the Responses and Messages
    APIs forward no field of their own to the engine, so the test scripts the engine), and
    the bodies it was sent, as it got them."""

    def __init__(self, sim: dict[str, Any] | None = None) -> None:
        self.app = create_sim_app(SimConfig())
        self.sim = sim
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each chat request's, as the engine got them

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        self.bodies.append(orjson.loads(body))
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        script = {"sim": self.sim} if self.sim is not None else {}
        scripted = orjson.dumps({**orjson.loads(body), **script})
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(scripted)).encode()))
        given = False

        async def once() -> Message:
            nonlocal given
            if given:
                return await receive()
            given = True
            return {"type": "http.request", "body": scripted, "more_body": False}

        await self.app({**scope, "headers": headers}, once, send)
