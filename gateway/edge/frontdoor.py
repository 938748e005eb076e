"""The ASGI entry point: ``x-request-id`` on every response, and a direct lane for the hot route.

FastAPI serves every route, but each middleware of its stack (error handling, telemetry, body
limit, exception handlers) wraps ``send`` again, a function call per streamed chunk, and routes
every request through dependency machinery the chat route does not use. The front door
dispatches the generation endpoints (``gateway.app``'s lanes: ``POST /v1/chat/completions``,
``/v1/completions``, ``/v1/responses``, ``/v1/messages``) straight to their handlers and
renders their errors here, in each API's shape (``shaped``, as the framework's handlers do);
everything else (and lifespan) goes through FastAPI, where the routes are also registered so
the OpenAPI document describes them.

A client-supplied request id is kept when it is short and plain (so callers can correlate
their logs), otherwise a fresh one is made; handlers find it in ``scope["state"]``.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.edge.streaming import RAW_SEND
from gateway.errors import GatewayError, HeadersTooLarge

Handler = Callable[[Request], Awaitable[Response]]
# The answer to an exception no layer translated, given the request id (``internal_error`` by
# default; the app's also answers a database outage, ``gateway.db.DatabaseHealth``).
Unexpected = Callable[[Exception, str], GatewayError]
log = logging.getLogger("thinkgate")
_SAFE_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def shaped(path: str, error: GatewayError) -> Response:
    """The error in the shape of the API ``path`` belongs to (Anthropic's under /v1/messages)."""
    return error_response(error, anthropic=path.startswith("/v1/messages"))


def error_response(error: GatewayError, *, anthropic: bool = False) -> Response:
    """The error as a response, in OpenAI's shape or (the Messages API) Anthropic's."""
    return Response(
        error.to_anthropic() if anthropic else error.to_json(),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers(),
    )


class FrontDoor:
    def __init__(
        self, framework: ASGIApp, lanes: Mapping[tuple[str, str], Handler],
        max_header_bytes: int = 64 << 10, unexpected: Unexpected | None = None,
    ) -> None:  # fmt: skip
        self.framework = framework
        self.lanes = lanes
        self.max_header_bytes = max_header_bytes
        self.unexpected = unexpected or internal_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.framework(scope, receive, send)
            return
        scope[RAW_SEND] = send  # streams write past the framework's wrappers (DirectWriter)
        try:
            request_id = _incoming(scope) or b"req_" + secrets.token_hex(12).encode()
            scope.setdefault("state", {})["request_id"] = request_id.decode()
            if sum(len(k) + len(v) for k, v in scope["headers"]) > self.max_header_bytes:
                # httptools has no limit of its own; past this one nothing is looked at
                refused = shaped(scope["path"], HeadersTooLarge(
                    f"The request headers exceed {self.max_header_bytes} bytes."))  # fmt: skip
                refused.raw_headers.append((b"x-request-id", request_id))
                await refused(scope, receive, send)
                return
            handler = self.lanes.get((scope["method"], scope["path"]))
            if handler is None:
                await self.framework(scope, receive, _with_id(send, request_id))
                return
            scope["app"] = self.framework
            response = await _handle(handler, Request(scope, receive), self.unexpected)
            response.raw_headers.append((b"x-request-id", request_id))
            await response(scope, receive, send)
        finally:
            scope.pop(RAW_SEND, None)  # the server's cycle holds the scope: no cycle left behind


async def _handle(handler: Handler, request: Request, unexpected: Unexpected) -> Response:
    try:
        return await handler(request)
    except GatewayError as exc:
        return shaped(request.scope["path"], exc)
    except Exception as exc:
        return shaped(request.scope["path"], unexpected(exc, request.state.request_id))


def internal_error(exc: Exception, request_id: str) -> GatewayError:
    """Our fault: a 500 that says nothing more, logged with its traceback."""
    log.error("unhandled error (request %s)", request_id, exc_info=exc)
    return GatewayError("The gateway failed to handle the request.")


def _with_id(send: Send, request_id: bytes) -> Send:
    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id)]
        await send(message)

    return send_with_id


def _incoming(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return value if _SAFE_ID.fullmatch(value) else None
    return None
