"""Guardrail policies end to end, through the real SDKs: a planted value in the reasoning or the
answer reaches neither the client nor the record as text when the policy says so, a block ends
each endpoint in its own shape, and the record and the metrics say what acted."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.ledger.sink import guardrail_body
from tests.e2e.conftest import RecordingSink, Stack, StackFactory
from tests.e2e.scripted import Scripted

EMAIL, CARD, KEY = "jane.doe@example.com", "4111 1111 1111 1111", "AKIAIOSFODNN7EXAMPLE"
# the email split across three reads of the reasoning, the card across two of the answer
SIM = {"sim": {"chunks": ["Mail jane", ".doe@exa", "mple.com soon", "</think>",
                          "\n\nCard 4111 1111 ", "1111 1111 done."]}}  # fmt: skip
BLOCKED = {"sim": {"chunks": ["Think", "</think>", "\n\nThe key is AKIAIOSFOD",
                              "NN7EXAMPLE and more", " text"]}}  # fmt: skip
MESSAGES: list[Any] = [{"role": "user", "content": "Where do I send it?"}]
POLICIES = """
policies:
  - name: pii
    tenants: [acme]
    detect: [email, credit_card]
    action: redact
    targets: [{targets}]
  - name: secrets
    detect: [secret_key]
    scope: [answer]
    action: block
  - name: audit-ibans
    detect: [iban]
    action: flag
"""


async def guarded(stack_factory: StackFactory, tmp_path: Path, targets: str = "client, ledger",
                  ) -> tuple[Stack, RecordingSink]:  # fmt: skip
    path = tmp_path / "guardrails.yaml"
    path.write_text(POLICIES.replace("{targets}", targets))
    sink = RecordingSink()
    stack = await stack_factory(sink=sink, guardrails_file=path)
    return stack, sink


def openai_client(stack: Stack, key: str = "visible") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url, api_key=stack.keys[key], max_retries=0)


async def streamed_and_whole(stack: Stack, extra: dict[str, Any]) -> tuple[list[Any], Any]:
    """The same chat request streamed (its chunks) and whole, by the visible key."""
    async with openai_client(stack) as client:
        stream = await client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, stream=True, extra_body=extra
        )
        chunks = [c async for c in stream]
        whole = await client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, extra_body=extra
        )
    return chunks, whole


async def test_a_planted_email_and_card_reach_neither_the_client_nor_the_record(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack, sink = await guarded(stack_factory, tmp_path)
    chunks, whole = await streamed_and_whole(stack, SIM)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert reasoning == "Mail [EMAIL] soon" and content == "\n\nCard [CREDIT_CARD] done."
    message = whole.choices[0].message
    assert message.content == content
    assert getattr(message, "reasoning_content", None) == reasoning
    for record in await sink.wait_for(2):
        assert record.reasoning == ("Mail [EMAIL] soon",)
        assert record.content == ("\n\nCard [CREDIT_CARD] done.",)
        acts = [(a.policy, a.action, a.channel, a.detector) for _, a in record.guardrails]
        assert acts == [("pii", "redact", "reasoning", "email"),
                        ("pii", "redact", "answer", "credit_card")]  # fmt: skip
        # the record keeps a keyed hash of each value: whoever holds the value can match it
        body = guardrail_body(record.guardrails)
        key = bytes.fromhex(body["hash_key"])
        digests = [a["hmac"] for a in body["acts"]]
        assert digests == [hmac.new(key, v.encode(), hashlib.sha256).hexdigest()
                           for v in (EMAIL, CARD)]  # fmt: skip
        assert EMAIL not in str(body) and CARD not in str(body)
    # ... with standard tools, as docs/guardrails.md says
    openssl = await asyncio.create_subprocess_exec(
        "openssl", "dgst", "-sha256", "-mac", "HMAC", "-macopt", f"hexkey:{body['hash_key']}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await openssl.communicate(EMAIL.encode())
    assert openssl.returncode == 0 and out.decode().split()[-1] == digests[0]
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{stack.root}/metrics")).text
    assert (
        'thinkgate_guardrail_actions_total{action="redact",policy="pii",scope="reasoning"} 2.0'
        in metrics
    )


async def test_targets_say_which_copy_is_redacted(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack, sink = await guarded(stack_factory, tmp_path, targets="ledger")
    async with openai_client(stack) as client:
        whole = await client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, extra_body=SIM
        )
    assert EMAIL in (getattr(whole.choices[0].message, "reasoning_content", "") or "")
    (record,) = await sink.wait_for(1)
    assert record.reasoning == ("Mail [EMAIL] soon",)


async def test_another_tenant_is_not_under_a_tenants_policy(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack, sink = await guarded(stack_factory, tmp_path)
    async with openai_client(stack, "other") as client:
        whole = await client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, extra_body=SIM
        )
    assert CARD in (whole.choices[0].message.content or "")
    (record,) = await sink.wait_for(1)
    assert record.guardrails == ()


async def test_a_block_ends_chat_and_completions_with_content_filter(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack, sink = await guarded(stack_factory, tmp_path)
    chunks, whole = await streamed_and_whole(stack, BLOCKED)
    async with openai_client(stack) as client:
        legacy = await client.completions.create(
            model="deepseek-r1", prompt="Where?", extra_body=BLOCKED
        )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert content == "\n\nThe key is " and finishes[-1] == "content_filter"
    assert finishes.count("content_filter") == 1 and "stop" not in finishes
    assert whole.choices[0].finish_reason == "content_filter"
    assert whole.choices[0].message.content == "\n\nThe key is "
    assert legacy.choices[0].finish_reason == "content_filter" and KEY not in legacy.choices[0].text
    for record in await sink.wait_for(3):
        assert record.finish_reasons == ("content_filter",)
        assert [(a.policy, a.action) for _, a in record.guardrails] == [("secrets", "block")]
        assert all(KEY not in text for text in record.content)


async def test_a_block_ends_responses_incomplete_and_messages_with_refusal(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    path = tmp_path / "guardrails.yaml"
    path.write_text(POLICIES.replace("{targets}", "client"))
    sink = RecordingSink()
    stack = await stack_factory(sink=sink, guardrails_file=path,
                                upstream_apps=[Scripted(BLOCKED["sim"])])  # fmt: skip
    async with openai_client(stack) as client:
        response = await client.responses.create(model="deepseek-r1", input="Where?")
        events = [e async for e in await client.responses.create(
            model="deepseek-r1", input="Where?", stream=True)]  # fmt: skip
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "content_filter"
    assert response.output_text == "\n\nThe key is "
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "content_filter"  # type: ignore[union-attr]
    async with anthropic.AsyncAnthropic(base_url=stack.root, api_key=stack.keys["visible"],
                                        max_retries=0) as claude:  # fmt: skip
        message = await claude.messages.create(
            model="deepseek-r1", max_tokens=200, messages=[{"role": "user", "content": "Where?"}]
        )
        async with claude.messages.stream(
            model="deepseek-r1", max_tokens=200, messages=[{"role": "user", "content": "Where?"}]
        ) as stream:
            final = await stream.get_final_message()
    for got in (message, final):
        assert got.stop_reason == "refusal"
        assert all(KEY not in getattr(block, "text", "") for block in got.content)
    records = await sink.wait_for(4)
    assert all(("secrets:block" in {f"{a.policy}:{a.action}" for _, a in r.guardrails})
               for r in records)  # fmt: skip


async def test_a_flag_changes_nothing_and_marks_the_record(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    stack, sink = await guarded(stack_factory, tmp_path)
    iban = "GB82 WEST 1234 5698 7654 32"
    sim = {"sim": {"chunks": ["Pay", "</think>", f"\n\nTo {iban} today."]}}
    async with openai_client(stack, "hidden") as client:
        whole = await client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, extra_body=sim
        )
    assert whole.choices[0].message.content == f"\n\nTo {iban} today."
    (record,) = await sink.wait_for(1)
    assert [(a.policy, a.action) for _, a in record.guardrails] == [("audit-ibans", "flag")]


def test_a_bad_policy_file_stops_serve_with_its_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "guardrails.yaml"
    path.write_text("policies:\n  - name: pii\n    detect: [email, phon]\n    action: redact\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--upstream", "http://127.0.0.1:9/v1",
         "--port", "0"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "THINKGATE_GUARDRAILS_FILE": str(path),
             "THINKGATE_HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "line 3" in done.stderr and "policies.0.detect" in done.stderr
    assert "unknown detector 'phon'" in done.stderr


async def test_a_block_stops_the_engine(stack_factory: StackFactory, tmp_path: Path) -> None:
    """Nothing more of a blocked choice can reach the client, so the engine's request is
    closed there (vLLM aborts it) rather than read to its end."""
    stack, sink = await guarded(stack_factory, tmp_path)
    assert stack.sim is not None
    long = {"sim": {"chunks": ["Think", "</think>", "\n\nThe key is AKIAIOSFOD",
                               "NN7EXAMPLE", *[" more"] * 200], "itl_ms": 20}}  # fmt: skip
    async with openai_client(stack) as client:
        stream = await client.chat.completions.create(
            model="deepseek-r1", messages=MESSAGES, stream=True, extra_body=long
        )
        finishes = [c.choices[0].finish_reason async for c in stream if c.choices]
    assert finishes[-1] == "content_filter"
    await stack.sim.sim.wait_for(lambda s: s.cancelled == 1, timeout=5)
    assert stack.sim.sim.finished == {"stop": 0, "length": 0, "abort": 0}
    (record,) = await sink.wait_for(1)
    assert record.finish_reasons == ("content_filter",) and record.status == "ok"
    assert record.usage is not None and record.usage.completion_tokens < 50  # what streamed


PROMPT_POLICIES = """
policies:
  - name: no-secrets-in
    detect: [secret_key]
    scope: [prompt]
    action: block
  - name: pii-in
    detect: [email]
    scope: [prompt]
    action: redact
    targets: [client]
"""


async def test_a_prompt_is_redacted_for_the_engine_or_refused_before_it(
    stack_factory: StackFactory, tmp_path: Path
) -> None:
    path = tmp_path / "guardrails.yaml"
    path.write_text(PROMPT_POLICIES)
    sink, engine = RecordingSink(), Scripted()
    stack = await stack_factory(sink=sink, guardrails_file=path, upstream_apps=[engine])
    ask = [{"role": "user", "content": f"Write to {EMAIL} about the plan."}]
    async with openai_client(stack) as client:
        await client.chat.completions.create(model="deepseek-r1", messages=ask)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="deepseek-r1", messages=[{"role": "user", "content": f"Use {KEY} now"}]
            )
    assert refused.value.code == "guardrail_blocked" and KEY not in str(refused.value)
    # the engine got one request (the refused one never reached it), its prompt redacted
    assert [b["messages"] for b in engine.bodies] == [
        [{"role": "user", "content": "Write to [EMAIL] about the plan."}]
    ]
    (record,) = await sink.wait_for(1)
    assert record.messages == ask  # the record keeps what was sent (targets: client)
    assert [(c, a.policy, a.channel) for c, a in record.guardrails] == [(None, "pii-in", "prompt")]
