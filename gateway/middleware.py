"""``x-request-id`` on every response, as a pure ASGI middleware (no per-request wrappers).

A client-supplied id is kept when it is short and plain (so a caller can correlate its own
logs), otherwise a fresh one is made. The id is put in ``scope["state"]`` for handlers.
"""

from __future__ import annotations

import re
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_SAFE_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming(scope) or b"req_" + secrets.token_hex(12).encode()
        scope.setdefault("state", {})["request_id"] = request_id.decode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)


def _incoming(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return value if _SAFE_ID.fullmatch(value) else None
    return None
