"""The policy file: what it selects, and a bad one named by its line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.guard.policy import PolicyFileError, load, parse
from gateway.guard.prompt import PromptBlocked, screen_prompt

FILE = """
policies:
  - name: pii
    tenants: [acme, globex]
    models: ["qwen3-*", deepseek-r1]
    detect: [email, {phone: {region: GB}}, {regex: "ACME-[0-9]{6}", label: "[ACME]"}]
    scope: [reasoning, answer, prompt]
    action: redact
    targets: [ledger]
  - name: everyone
    detect: [secret_key]
    action: flag
"""


def test_policies_are_selected_by_tenant_and_model_in_file_order() -> None:
    guardrails = parse(FILE)
    assert [p.name for p in guardrails.select("acme", "qwen3-32b")] == ["pii", "everyone"]
    assert [p.name for p in guardrails.select("acme", "deepseek-r1")] == ["pii", "everyone"]
    assert [p.name for p in guardrails.select("acme", "kimi-k3")] == ["everyone"]
    assert [p.name for p in guardrails.select("initech", "qwen3-32b")] == ["everyone"]
    pii = guardrails.policies[0]
    assert [d.name for d in pii.detectors] == ["email", "phone", "regex"]
    assert pii.targets == {"ledger"} and pii.channels == {"reasoning", "answer", "prompt"}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("policies:\n  - name: a\n    detect: [mail]\n    action: redact\n",
         "line 3, policies.0.detect"),
        ("policies:\n  - name: a\n    detect: [email]\n    action: erase\n",
         "line 4, policies.0.action"),
        ("policies:\n  - name: a\n    detect: [email]\n    action: flag\n    colour: red\n",
         "line 5, policies.0.colour"),
        ("policies:\n  - name: a\n    detect: [{regex: '('}]\n    action: flag\n",
         "line 3, policies.0.detect.0.regex: does not compile"),
        ("policies:\n  - name: a\n    detect: [{regex: 'x*'}]\n    action: flag\n",
         "policies.0.detect.0.regex: matches the empty string"),
        ("policies:\n  - {name: a, detect: [email], action: flag}\n"
         "  - {name: a, detect: [iban], action: flag}\n", "policy names must be unique: a"),
        ("policies:\n  - name: a\n    detect: [{model: llama-guard}]\n    action: block\n",
         "line 3, policies.0.detect.0.upstream: Field required"),
        ("policies:\n  - name: a\n    detect: [{model: g, upstream: 'http://g/v1'}]\n"
         "    action: redact\n", "finds no span to redact"),
        ("policies:\n  - name: a\n    detect:\n      - email\n      - model: g\n"
         "        upstream: http://g/v1\n        params: {messages: []}\n    action: block\n",
         "line 7, policies.0.detect.1.params: Value error, params may not set messages"),
        ("policies:\n  - name: a\n    detect: [{model: g, upstream: 'http://g:x/v1'}]\n"
         "    action: flag\n", "policies.0.detect.0.upstream: Value error, not a URL"),
        ("policies:\n  - name: a\n    detect: [7]\n    action: flag\n",
         "policies.0.detect.0: a detector is a name or a mapping"),
        ("policies: [\n", "is not valid YAML"),
    ],
)  # fmt: skip
def test_a_bad_file_names_its_line_and_field(text: str, where: str) -> None:
    with pytest.raises(PolicyFileError) as refused:
        parse(text, "g.yaml")
    assert where in str(refused.value) and str(refused.value).startswith("g.yaml")


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="cannot be read"):
        load(tmp_path / "absent.yaml")


def test_the_prompt_is_redacted_for_the_engine_and_for_the_record_as_targets_say() -> None:
    (pii,) = parse(FILE).select("acme", "deepseek-r1")[:1]
    messages: list[Any] = [{"role": "user", "content": "id ACME-123456, mail a@b.io"}]
    body: dict[str, Any] = {"model": "m", "messages": messages}
    screened = screen_prompt([pii], body, messages)
    sent = screened.body["messages"][0]["content"]
    assert sent == "id [ACME], mail [EMAIL]"  # the engine never sees them
    assert screened.messages[0]["content"] == sent  # targets: ledger
    assert [a.detector for a in screened.acts] == ["regex", "email"]
    assert messages[0]["content"] == "id ACME-123456, mail a@b.io"  # not changed in place


def test_a_blocked_prompt_names_the_policy_and_leaves_names_alone() -> None:
    guardrails = parse("policies:\n  - {name: keys, detect: [secret_key], scope: [prompt], "
                       "action: block}\n")  # fmt: skip
    named = {
        "messages": [{"role": "tool", "tool_call_id": "AKIAIOSFODNN7EXAMPLE", "content": "ok"}]
    }
    assert screen_prompt(guardrails.policies, named, named["messages"]).acts == ()
    leaking = {"prompt": ["fine", "key AKIAIOSFODNN7EXAMPLE"]}
    with pytest.raises(PromptBlocked) as blocked:
        screen_prompt(guardrails.policies, leaking, [])
    assert (blocked.value.policy, blocked.value.detector) == ("keys", "secret_key")
