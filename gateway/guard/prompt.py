"""Guardrail policies over a request's prompt, before the engine sees it (sans-I/O).

``screen_prompt(policies, body, messages, ledger_messages)`` applies the policies whose
``scope`` has ``prompt`` to every text a request carries: each string of the upstream body's
``messages`` (what the engine gets, whatever API the request came through) and of ``prompt``
(legacy completions), and of the record's ``messages``. Keys that name rather than say (``role``,
``type``, ``id``, ``name``, ``tool_call_id``, ``call_id``) are left alone.

- ``block``: ``PromptBlocked`` names the policy and the detector (the route refuses the request
  with a 400, before any engine is asked).
- ``redact``: the match is replaced by its label in what the engine gets, always (``targets``
  speaks of the answer's two copies; a prompt has one reader, the engine), and in the record's
  messages when ``targets`` has ``ledger``.
- ``flag``: nothing changes.

Every act is returned, with its value, for the record (which keeps only a keyed hash of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.guard.policy import GuardPolicy
from gateway.relay.guarding import GuardAct

_NAMING_KEYS = frozenset({"role", "type", "id", "name", "tool_call_id", "call_id"})


class PromptBlocked(Exception):
    def __init__(self, policy: str, detector: str) -> None:
        super().__init__(f"policy {policy!r} refused the prompt: it holds a {detector} match")
        self.policy = policy
        self.detector = detector


@dataclass(frozen=True, slots=True)
class ScreenedPrompt:
    body: dict[str, Any]  # the upstream body, redacted
    messages: list[Any]  # the record's messages
    acts: tuple[GuardAct, ...]


def screen_prompt(
    policies: Sequence[GuardPolicy], body: dict[str, Any], messages: list[Any]
) -> ScreenedPrompt:
    from gateway.guard.scanner import ChannelScanner  # with a policy only (``guard.stream``)

    rules = [(p, d) for p in policies if "prompt" in p.channels for d in p.detectors]
    acts: list[GuardAct] = []

    def text(value: str, for_ledger: bool) -> str:
        scanner = ChannelScanner([d for _, d in rules])
        _, findings = scanner.feed(value, final=True)
        out, cursor = [], 0
        for finding in findings:
            policy, detector = rules[finding.rule]
            if not for_ledger:
                acts.append(GuardAct(policy.name, policy.action, "prompt", detector.name,
                                     finding.text))  # fmt: skip
                if policy.action == "block":
                    raise PromptBlocked(policy.name, detector.name)
            redact = policy.action == "redact" and (not for_ledger or "ledger" in policy.targets)
            out.append(value[cursor : finding.start])
            out.append(detector.label if redact else finding.text)
            cursor = finding.end
        out.append(value[cursor:])
        return "".join(out)

    sent = dict(body)
    for field in ("messages", "prompt"):
        if field in sent:
            sent[field] = _walk(sent[field], lambda v: text(v, False))
    kept = _walk(messages, lambda v: text(v, True))
    return ScreenedPrompt(sent, kept, tuple(acts))


def _walk(value: Any, change: Any) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_walk(v, change) for v in value]
    if isinstance(value, dict):
        return {k: v if k in _NAMING_KEYS else _walk(v, change) for k, v in value.items()}
    return value
