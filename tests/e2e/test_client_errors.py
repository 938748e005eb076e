"""An engine's 4xx is the client's mistake, relayed: counted as ``invalid`` in metrics, the
access log and the record, never as an upstream failure (so ``ThinkgateHighErrorRate``, which
leaves client errors out, stays quiet), and vLLM's numeric ``code`` becomes an OpenAI word."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import Receive, Scope, Send

from tests.e2e.conftest import RecordingSink

# vLLM 0.32's answer to max_tokens above the model's context, as it sends it
TOO_LONG = {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
            "message": "This model's maximum context length is 512 tokens. However, you "
                       "requested 10000 output tokens."}  # fmt: skip


class RefusingEngine:
    """A model server that refuses every completion as vLLM refuses a too-long one."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].endswith("/models"):
            body, status = {"object": "list", "data": [{"id": "m", "object": "model"}]}, 200
        elif scope["path"].endswith("/chat/completions"):
            while (await receive()).get("more_body"):
                pass
            body, status = TOO_LONG, 400
        else:
            body, status = {"detail": "Not Found"}, 404
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": orjson.dumps(body)})


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name]  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
async def test_an_engines_4xx_is_an_invalid_request_not_an_upstream_failure(
    stack_factory: Any, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    sink = RecordingSink()
    stack = await stack_factory(upstream_apps=[RefusingEngine()], sink=sink)
    caplog.set_level(logging.INFO, logger="thinkgate.access")
    async with openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys["visible"],
                                  max_retries=0) as client:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=10000,
                stream=stream,
            )  # fmt: skip
    assert caught.value.status_code == 400
    assert caught.value.body["code"] == "invalid_request"  # type: ignore[index]
    assert "maximum context length" in caught.value.body["message"]  # type: ignore[index]
    [record] = await sink.wait_for(1)
    assert (record.status, record.error_code) == ("invalid", "invalid_request")
    async with httpx.AsyncClient() as raw:
        metrics = (await raw.get(f"{stack.root}/metrics")).text
    statuses = {labels["status"] for labels, value in
                samples(metrics, "thinkgate_requests_total") if value}  # fmt: skip
    assert statuses == {"invalid"}
    assert not [v for _, v in samples(metrics, "thinkgate_upstream_errors_total") if v]
    lines = [json.loads(r.getMessage()) if r.getMessage().startswith("{") else r.__dict__
             for r in caplog.records if r.name == "thinkgate.access"]  # fmt: skip
    fields = [line.get("fields", line) for line in lines]
    assert [f.get("status") for f in fields] == ["invalid"]
