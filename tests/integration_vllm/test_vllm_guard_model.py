"""A guard model on real vLLM (CPU): the tiny model serves as the guard, its verdict pinned by
``structured_outputs`` in the policy's ``params`` (the one choice it may write), over streams
of real vLLM's chunking: an unsafe verdict blocks the answer, a safe one lets it through."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.integration_vllm.conftest import TinyModel, VllmServer
from tests.integration_vllm.test_vllm import Gateway, stream
from tests.integration_vllm.test_vllm_guardrails import policed

# the guard is the raw server's tiny-r1; each policy pins what it says
POLICIES = """
policies:
  - name: judged-unsafe
    models: [tiny-r1-parsed]
    detect:
      - model: tiny-r1
        upstream: "{guard}"
        params: {{structured_outputs: {{choice: ["unsafe\\nS1"]}}}}
    scope: [answer]
    action: block
  - name: judged-safe
    models: [tiny-r1]
    detect:
      - model: tiny-r1
        upstream: "{guard}"
        params: {{structured_outputs: {{choice: ["safe"]}}}}
    scope: [reasoning, answer]
    action: block
"""
WRITTEN = r"Plan\.\n</think>\n\nStep one\. Step two\."


@pytest.fixture
async def judged(
    vllm_servers: dict[str, VllmServer], tiny_model: TinyModel, tmp_path: Path
) -> AsyncIterator[Gateway]:
    policies = POLICIES.format(guard=vllm_servers["raw"].url)
    async with policed(vllm_servers, tiny_model, tmp_path, policies) as gateway:
        yield gateway


async def verdicts(gw: Gateway, outcome: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(gw.url.removesuffix("/v1") + "/metrics")).text
    found = re.search(rf'thinkgate_guard_model_seconds_count{{outcome="{outcome}",[^}}]*}} (\S+)',
                      text)  # fmt: skip
    return float(found[1]) if found else 0.0


async def test_an_unsafe_verdict_of_vllm_blocks_the_answer(judged: Gateway) -> None:
    reasoning, content, chunks = await stream(judged, "tiny-r1-parsed", max_tokens=100,
                                              extra_body=judged.pinned(WRITTEN))  # fmt: skip
    assert (reasoning, content) == ("Plan.\n", "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "content_filter"
    [record] = await judged.sink.wait_for(1)
    assert [(a.policy, a.detector) for _, a in record.guardrails] == [
        ("judged-unsafe", "model:tiny-r1:S1")
    ]
    assert "".join(record.content) == ""
    assert await verdicts(judged, "unsafe") >= 1 and await verdicts(judged, "error") == 0


async def test_a_safe_verdict_of_vllm_lets_the_stream_through(judged: Gateway) -> None:
    reasoning, content, chunks = await stream(judged, "tiny-r1", max_tokens=100,
                                              extra_body=judged.pinned(WRITTEN))  # fmt: skip
    assert (reasoning, content) == ("Plan.\n", "\n\nStep one. Step two.")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    [record] = await judged.sink.wait_for(1)
    assert record.guardrails == ()
    # the reasoning at its end, the answer at "one." and at its end
    assert await verdicts(judged, "safe") >= 3 and await verdicts(judged, "error") == 0
