"""``read_body`` (``gateway/edge/body.py``) over a real Starlette ``Request`` whose ``receive`` is
a hand-made client: one that uploads within the limit, declares or sends too much, trickles,
stalls or goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from starlette.requests import Request
from starlette.types import Message

from gateway.edge.body import read_body
from gateway.errors import ClientClosedRequest, RequestTimeout, RequestTooLarge


class Client:
    """Sends ``parts`` as body messages, then does what ``then`` says: nothing more (the body
    is complete), ``stall`` (never sends again) or ``disconnect``."""

    def __init__(self, parts: Sequence[bytes], then: str = "end", pause_s: float = 0.0) -> None:
        self.parts, self.then, self.pause_s = list(parts), then, pause_s
        self.calls = 0

    async def receive(self) -> Message:
        self.calls += 1
        if self.pause_s:
            await asyncio.sleep(self.pause_s)  # the client's own pace, not the test's timing
        if self.parts:
            part = self.parts.pop(0)
            more = bool(self.parts) or self.then != "end"
            return {"type": "http.request", "body": part, "more_body": more}
        if self.then == "disconnect":
            return {"type": "http.disconnect"}
        await asyncio.get_running_loop().create_future()  # stalls until cancelled
        raise AssertionError("unreachable")


def request(client: Client, content_length: int | str | None = None) -> Request:
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "query_string": b"", "headers": headers}  # fmt: skip
    return Request(scope, client.receive)


@pytest.mark.parametrize("content_length", [None, 10])
async def test_a_body_within_the_limit_is_returned_whole(content_length: int | None) -> None:
    client = Client([b"abc", b"", b"defg", b"hij"])  # exactly the limit, an empty part within
    assert await read_body(request(client, content_length), limit=10, timeout_s=5) == b"abcdefghij"


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    client = Client([b"x" * 11])
    with pytest.raises(RequestTooLarge) as refused:
        await read_body(request(client, 11), limit=10, timeout_s=5)
    assert client.calls == 0  # not one byte was read
    assert refused.value.status == 413 and refused.value.code == "request_too_large"
    assert "10 bytes" in refused.value.message


@pytest.mark.parametrize(
    "content_length",
    [None, 4, "4, 4", "abc"],
    ids=["chunked", "declared-less-than-sent", "two-lengths", "not-a-number"],
)
async def test_a_body_over_the_limit_is_refused_while_streaming(
    content_length: int | str | None,
) -> None:
    """Whatever the header says, the bytes that arrive are counted; reading stops at the part
    that crosses the limit."""
    client = Client([b"x" * 6, b"x" * 6, b"x" * 6])
    with pytest.raises(RequestTooLarge) as refused:
        await read_body(request(client, content_length), limit=10, timeout_s=5)
    assert client.calls == 2  # the third part was never asked for
    assert refused.value.status == 413


async def test_a_client_that_stalls_gets_a_timeout() -> None:
    client = Client([b"{"], then="stall")
    with pytest.raises(RequestTimeout) as refused:
        await asyncio.wait_for(read_body(request(client), limit=100, timeout_s=0.05), 5)
    assert refused.value.status == 408 and refused.value.code == "request_timeout"
    assert "0.05 s" in refused.value.message


async def test_the_timeout_bounds_the_whole_body_not_each_part() -> None:
    """A client that sends a byte every 10 ms never pauses for 100 ms, yet cannot take longer
    than 100 ms over the whole upload."""
    client = Client([b"x"] * 1000, pause_s=0.01)
    with pytest.raises(RequestTimeout):
        await asyncio.wait_for(read_body(request(client), limit=10_000, timeout_s=0.1), 5)
    assert 2 < client.calls < 1000


async def test_a_client_that_goes_away_mid_upload_is_a_closed_request() -> None:
    client = Client([b'{"model":'], then="disconnect")
    with pytest.raises(ClientClosedRequest) as refused:
        await read_body(request(client, 100), limit=1000, timeout_s=5)
    assert refused.value.status == 499 and refused.value.outcome == "client_disconnected"


@pytest.mark.parametrize("declared", ["²", "9" * 5000, "1e3"])
async def test_a_content_length_no_int_can_read_is_left_to_the_streaming_check(
    declared: str,
) -> None:
    # "²" is a digit to str.isdigit, not to int(); 5000 digits are past int()'s limit
    with pytest.raises(RequestTooLarge):
        await read_body(request(Client([b"x" * 10]), content_length=declared), 5, 1.0)
