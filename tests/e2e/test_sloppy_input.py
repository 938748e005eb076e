"""Sloppy input a new user sends gets the error that says what is wrong (issue: "the first five
minutes"), in OpenAI's shape with ``param``; unknown fields still pass through untouched."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.side.sim.app import SimApp
from tests.e2e.conftest import Stack

GOOD = b'{"model":"deepseek-r1","messages":[{"role":"user","content":"x"}]'


async def post(stack: Stack, body: bytes, method: str = "POST") -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.request(method, f"{stack.url}/chat/completions", content=body,
                                    headers={"authorization": f"Bearer {stack.keys['visible']}",
                                             "content-type": "application/json"})  # fmt: skip


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (GOOD + b',"max_tokens":1e30}', "too large", "max_tokens"),
        (GOOD + b',"max_completion_tokens":1e30}', "too large", "max_completion_tokens"),
        ('{"model":"deepseek-r1","messages":[{"role":"user","content":"caf\xe9"}]}'
         .encode("latin-1"), "not valid UTF-8", None),
        (b"\xef\xbb\xbf" + GOOD + b"}", "byte order mark", None),
        (b'{"model":"deepseek-r1","messages":[{"role":"user","content":"\\ud800"}]}',
         "lone surrogate", None),
        (GOOD + b',"temperature":"hot"}', "temperature", "temperature"),
        (GOOD + b',"temperature":3}', "temperature", "temperature"),
        (GOOD + b',"top_p":"all"}', "top_p", "top_p"),
        (b'{"model":"deepseek-r1","messages":[{"role":"wizard","content":"x"}]}', "role",
         "messages.0.role"),
        (b"{not json", "not valid JSON", None),
        (GOOD + b',"echo":true}', "echo", "echo"),  # the echo would be read as output
        (GOOD + b',"audio":{"voice":"alloy"}}', "not supported", "audio"),
        (GOOD + b',"guided_json":{"type":"object"}}', "not supported", "guided_json"),
    ],
)  # fmt: skip
async def test_each_mistake_is_named(
    stack_factory: Any, body: bytes, message: str, param: str | None
) -> None:
    stack = await stack_factory()
    response = await post(stack, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"] and error["param"] == param
    assert isinstance(stack.sim, SimApp) and not stack.sim.sim.received  # no engine asked


async def test_a_get_on_a_post_route_is_405_method_not_allowed(stack_factory: Any) -> None:
    stack = await stack_factory()
    response = await post(stack, b"", method="GET")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


async def test_typed_fields_of_the_right_type_and_unknown_ones_pass(stack_factory: Any) -> None:
    stack = await stack_factory()
    response = await post(stack, GOOD + b',"temperature":1,"top_p":0.5,"seed":3,"mystery":[1]}')
    assert response.status_code == 200
    assert isinstance(stack.sim, SimApp)
    sent = stack.sim.sim.received[-1]
    assert (sent["temperature"], sent["top_p"], sent["seed"], sent["mystery"]) == (1, 0.5, 3, [1])


async def test_a_body_too_large_from_a_valid_key_is_logged_with_its_tenant(
    stack_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    stack = await stack_factory(max_body_bytes=2048)
    caplog.set_level(logging.INFO, logger="thinkgate.access")
    response = await post(stack, GOOD + b',"pad":"' + b"x" * 4096 + b'"}')
    assert response.status_code == 413
    fields = [r.__dict__.get("fields", {}) for r in caplog.records if r.name == "thinkgate.access"]
    assert [(f.get("tenant"), f.get("status")) for f in fields] == [("acme", "invalid")]


async def test_a_refused_field_is_logged_with_its_endpoint_model_and_name(
    stack_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator sees which client field was refused, on which API, for which model: never
    its value."""
    import logging

    stack = await stack_factory()
    caplog.set_level(logging.INFO, logger="thinkgate.access")
    response = await post(stack, GOOD + b',"audio":{"voice":"secret-voice-7"}}')
    assert response.status_code == 400
    fields = [r.__dict__.get("fields", {}) for r in caplog.records if r.name == "thinkgate.access"]
    [refused] = [f for f in fields if f.get("status") == "invalid"]
    assert (refused["endpoint"], refused["model"], refused["param"]) == (
        "chat.completions", "deepseek-r1", "audio")  # fmt: skip
    assert "secret-voice-7" not in caplog.text
