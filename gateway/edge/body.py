"""Reading a request body, bounded in size and in time, for every route that takes one."""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

from gateway.errors import ClientClosedRequest, RequestTimeout, RequestTooLarge


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """At most ``limit`` bytes within ``timeout_s``: a client that uploads a byte at a time
    cannot hold a request (and its buffer) open for ever."""
    declared = request.headers.get("content-length", "")
    # ASCII digits only ("²" is a digit to isdigit, not to int), and short: a value no int()
    # can read is left to the streaming check below, which holds whatever the header says
    if declared.isascii() and declared.isdigit() and len(declared) < 19 and int(declared) > limit:
        raise RequestTooLarge(f"The request body exceeds the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestTooLarge(f"The request body exceeds the limit of {limit} bytes.")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"The request body was not received within {timeout_s:g} s.") from None
    except ClientDisconnect:
        raise ClientClosedRequest("The client closed the connection during the upload.") from None
    return b"".join(chunks)
