"""``python -m bench.relay --port P --upstream URL --key K``: the bare relay, the baseline.

What a minimal Python proxy in front of an engine is: raw ASGI on uvicorn (uvloop, httptools,
as the gateway runs), aiohttp's client upstream, and nothing parsed: it checks the bearer key,
forwards the body, and writes every upstream read to the client as it comes. The gateway's
cost per chunk is quoted against this one measured in the same run (``bench.realistic``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import aiohttp
import uvicorn

_DROP = {b"host", b"content-length", b"connection", b"authorization", b"accept-encoding"}
_KEEP = ("content-type",)


class Relay:
    def __init__(self, upstream: str, key: str) -> None:
        self._upstream = upstream.rstrip("/")
        self._auth = f"Bearer {key}".encode()
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # nothing to start; closing the session on the way out
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self._session is not None:
                await self._session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = dict(scope["headers"])
        if headers.get(b"authorization") != self._auth and scope["path"] != "/health":
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
            )
        forward = {k.decode(): v.decode() for k, v in scope["headers"] if k not in _DROP}
        url = self._upstream + scope["path"].removeprefix("/v1")  # /health: the engine's
        async with self._session.request(scope["method"], url, data=body or None,
                                         headers=forward) as response:  # fmt: skip
            kept = [(k.encode(), v.encode()) for k, v in response.headers.items()
                    if k.lower() in _KEEP]  # fmt: skip
            await send({"type": "http.response.start", "status": response.status,
                        "headers": kept})  # fmt: skip
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the engine's OpenAI base URL")
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    uvicorn.run(Relay(args.upstream, args.key), host=args.host, port=args.port, loop="uvloop",
                http="httptools", access_log=False, log_level="warning", lifespan="off",
                backlog=2048)  # fmt: skip


if __name__ == "__main__":
    main()
