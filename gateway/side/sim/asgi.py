"""The few ASGI moves the simulator needs: read a body, send a whole response, race a disconnect.

``race_disconnect`` follows Starlette's ``StreamingResponse``: a watcher task waits for
``http.disconnect`` and cancels the work's scope, so the work stops at its next ``await`` —
including in the middle of a long ``sleep`` — without any polling.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.types import Receive, Send

T = TypeVar("T")

JSON = b"application/json"


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or ``None`` if the client left while sending it."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def send_start(send: Send, status: int, content_type: bytes, length: int | None) -> None:
    headers = [(b"content-type", content_type)]
    if length is not None:
        headers.append((b"content-length", b"%d" % length))
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def send_whole(send: Send, status: int, body: bytes, content_type: bytes = JSON) -> None:
    """A complete response with a ``content-length``."""
    await send_start(send, status, content_type, len(body))
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_part(send: Send, body: bytes) -> None:
    """One body message of a response that goes on."""
    await send({"type": "http.response.body", "body": body, "more_body": True})


async def race_disconnect(receive: Receive, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work`` until it returns (its result) or the client disconnects (``None``)."""
    result: T | None = None
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            group.cancel_scope.cancel()

        group.start_soon(watch)
        result = await work()
        group.cancel_scope.cancel()
    return result
