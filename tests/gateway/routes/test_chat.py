"""The pure helpers of ``gateway/routes/chat.py``: ``rewriter`` (reasoning shown only to a
visible key whose request did not lower it; the model's format and source from the settings;
thinking as the request switched it; a ``StreamRelay`` for streams) and ``estimate_tokens``
(OpenAI's reservation rule). Both read only ``state.settings``: a stand-in carries it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import pytest

from gateway.api.chat import ChatRequest, parse_chat_request
from gateway.auth.keys import KeyInfo, ReasoningPolicy
from gateway.guard.policy import NONE as NO_GUARDRAILS
from gateway.guard.policy import Guardrails, parse
from gateway.pipeline.steps import Pipeline
from gateway.relay.formats import BUILTIN
from gateway.relay.rewrite import Rewriter, StreamRelay
from gateway.routes.chat import estimate_tokens, rewriter
from gateway.routes.state import AppState
from gateway.settings import ModelOverride, Settings

MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class State:
    settings: Settings
    guardrails: Guardrails = NO_GUARDRAILS

    @property
    def pipeline(self) -> Pipeline:
        unused = cast(Any, None)  # a policy is built from the settings and the guardrails
        return Pipeline(self.settings.pipeline, unused, unused, unused, unused, unused, unused,
                        guardrails=self.guardrails)  # fmt: skip


def state(**changes: Any) -> AppState:
    return cast(AppState, State(Settings(**changes)))


def key(reasoning: ReasoningPolicy) -> KeyInfo:
    return KeyInfo("0123456789ab", "acme", "client", reasoning, None, None,
                   datetime.now(UTC), None, b"")  # fmt: skip


def chat(**fields: Any) -> ChatRequest:
    return parse_chat_request(orjson.dumps({"model": "m", "messages": MESSAGES, **fields}))


@pytest.mark.parametrize(
    ("reasoning", "fields", "shown"),
    [
        ("visible", {}, True),
        ("hidden", {}, False),
        ("hidden", {"include_reasoning": True}, False),  # a request cannot raise its visibility
        ("visible", {"include_reasoning": False}, False),
        ("visible", {"reasoning": {"exclude": True}}, False),
        ("visible", {"reasoning": {"exclude": False}}, True),
    ],
)
def test_reasoning_is_shown_only_to_a_visible_key_that_did_not_lower_it(
    reasoning: ReasoningPolicy, fields: dict[str, Any], shown: bool
) -> None:
    relay = rewriter(state(), key(reasoning), chat(**fields))
    assert relay.policy.show_reasoning is shown


def test_the_models_format_and_source_come_from_the_settings() -> None:
    models = {"qwen": ModelOverride(reasoning_parser="qwen3", reasoning_source="upstream")}
    settings = state(models=models, reasoning_parser="glm45", reasoning_field="both")
    own = rewriter(settings, key("visible"), chat(model="qwen")).policy
    assert (own.format, own.source, own.reasoning_field) == (BUILTIN["qwen3"], "upstream", "both")
    other = rewriter(settings, key("visible"), chat(model="other")).policy
    assert (other.format, other.source) == (BUILTIN["glm45"], "text")  # the defaults


@pytest.mark.parametrize(
    ("parser", "fields", "thinking"),
    [
        ("qwen3", {}, True),
        ("qwen3", {"chat_template_kwargs": {"enable_thinking": False}}, False),
        ("qwen3", {"chat_template_kwargs": {"thinking": False}}, True),  # not qwen3's switch
        ("qwen3", {"reasoning_effort": "none"}, False),
        ("deepseek_v3", {}, False),  # its template does not think unless asked
        ("deepseek_v3", {"chat_template_kwargs": {"thinking": True}}, True),
        ("deepseek_r1", {"reasoning_effort": "none"}, True),  # no switch: always thinks
    ],
)
def test_thinking_follows_the_requests_switches_for_the_models_format(
    parser: str, fields: dict[str, Any], thinking: bool
) -> None:
    relay = rewriter(state(reasoning_parser=parser), key("hidden"), chat(**fields))
    assert relay.policy.thinking is thinking


def test_a_stream_gets_a_stream_relay_with_usage_and_leak_repair_as_asked() -> None:
    streamed = rewriter(state(), key("visible"), chat(stream=True, stop=["\n\n"],
                        stream_options={"include_usage": True}))  # fmt: skip
    assert isinstance(streamed, StreamRelay)
    assert (streamed.policy.include_usage, streamed.policy.repair_leak) == (True, True)
    quiet = rewriter(state(), key("visible"), chat(stream=True)).policy
    assert (quiet.include_usage, quiet.repair_leak) == (False, False)  # usage is forced upstream


def test_a_non_streamed_request_gets_a_plain_rewriter_that_never_repairs_leaks() -> None:
    relay = rewriter(state(), key("visible"), chat(stop="\n"))
    assert type(relay) is Rewriter
    assert relay.policy.repair_leak is False


def test_estimate_is_the_prompts_bytes_over_four_plus_max_tokens_per_choice() -> None:
    request = chat(max_tokens=100, n=3)
    prompt = len(request.upstream_body) // 4
    assert prompt > 0
    assert estimate_tokens(request, state()) == prompt + 300


def test_estimate_prefers_max_completion_tokens_and_defaults_from_the_settings() -> None:
    newer = chat(max_tokens=100, max_completion_tokens=40)
    assert estimate_tokens(newer, state()) == len(newer.upstream_body) // 4 + 40
    unset = chat(n=2)
    expected = len(unset.upstream_body) // 4 + 2 * 512
    assert estimate_tokens(unset, state(default_max_tokens=512)) == expected


def test_estimate_counts_the_forwarded_body_not_the_clients() -> None:
    """The gateway's own directives are removed before forwarding: they cost nothing."""
    plain = chat(max_tokens=10)
    directive = chat(max_tokens=10, include_reasoning=False, reasoning={"exclude": True})
    assert estimate_tokens(directive, state()) == estimate_tokens(plain, state())
    longer = chat(max_tokens=10, messages=[{"role": "user", "content": "hi" + "x" * 4000}])
    assert estimate_tokens(longer, state()) - estimate_tokens(plain, state()) == 1000


@pytest.mark.parametrize(
    ("scope", "guarded"), [("[prompt]", False), ("[answer]", True), ("[reasoning, prompt]", True)]
)
def test_a_choice_is_guarded_only_by_policies_over_its_reasoning_or_answer(
    scope: str, guarded: bool
) -> None:
    """A prompt-only policy leaves the relay's fast paths to its choices."""
    policies = parse(f"policies:\n  - {{name: p, detect: [email], scope: {scope}, action: flag}}\n")
    stand_in = cast(AppState, State(Settings(), policies))
    relay = rewriter(stand_in, key("visible"), chat(stream=True))
    assert (relay.policy.guard is not None) is guarded
