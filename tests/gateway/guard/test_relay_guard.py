"""A guarded choice in the relays: what the review of the first version found, held down."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.guard.detectors import PatternError, custom
from gateway.guard.policy import parse
from gateway.guard.scanner import ChannelScanner
from gateway.guard.stream import ChoiceGuard
from gateway.relay.apis.completions import CompletionsRelay
from gateway.relay.choice import ChoiceState
from gateway.relay.formats import BUILTIN
from gateway.relay.rewrite import Policy, StreamRelay
from gateway.relay.sse import Event, SSEParser

PII = parse(
    "policies:\n  - {name: pii, detect: [email], action: redact}\n"
    "  - {name: keys, detect: [secret_key], scope: [answer], action: block}\n"
).policies
EMAIL = "jane.doe@example.com"


def guarded(**policy: Any) -> Policy:
    return Policy.named("deepseek_r1", True, "reasoning_content",
                        guard=lambda: ChoiceGuard(PII), **policy)  # fmt: skip


def event(choices: list[dict[str, Any]]) -> Event:
    return Event(data=orjson.dumps({"id": "c", "choices": choices}))


def test_a_long_look_behind_of_a_files_own_regex_is_found_one_character_at_a_time() -> None:
    secret = custom(r"(?<=here is the very secret access password, it is: )\w{6}")
    text = "here is the very secret access password, it is: hunter2 ok"
    scanner = ChannelScanner([secret])
    found = []
    for i, char in enumerate(text):
        released, findings = scanner.feed(char, final=i == len(text) - 1)
        found += [f.text for f in findings]
        scanner.drop_before(released)
    assert found == ["hunter"]


@pytest.mark.parametrize("pattern", [r"\d+-\d+", r"x{3,}", r"ACME-[0-9]{6}(?=\w*)"])
def test_a_regex_without_a_bound_is_refused(pattern: str) -> None:
    with pytest.raises(PatternError, match="no upper bound"):
        custom(pattern)


def test_a_regex_longer_than_max_length_is_refused() -> None:
    with pytest.raises(PatternError, match="more than max_length"):
        custom(r"[a-z]{40}", max_length=16)


def test_a_guarded_chunk_carries_no_logprobs_or_token_ids() -> None:
    relay = StreamRelay(guarded())
    logprobs = {"content": [{"token": " jane", "logprob": -0.1}]}
    relay.feed(event([{"index": 0, "delta": {"content": "</think>"}}]))
    out = relay.feed(event([{"index": 0, "delta": {"content": "plain words "},
                             "logprobs": logprobs, "token_ids": [1, 2]}]))  # fmt: skip
    chunk = orjson.loads(out.removeprefix(b"data: ").strip())
    choice = chunk["choices"][0]
    assert choice["logprobs"] is None and choice["token_ids"] is None


def test_a_block_in_one_prompt_of_a_batch_leaves_the_others_streaming() -> None:
    relay = CompletionsRelay(guarded(choices=2))  # two prompts, n = 1
    relay.feed(event([{"index": 0, "text": "</think>key AKIAIOSFODNN7EXAMPLE and on"},
                      {"index": 1, "text": "</think>fine "}]))  # fmt: skip
    assert relay.choices[0].blocked == "keys" and not relay.all_blocked
    out = relay.feed(event([{"index": 1, "text": "still going on"}]))
    assert b"still going" in out


def test_reasoning_after_the_answer_began_is_not_lost() -> None:
    state = ChoiceState.start(BUILTIN["deepseek_r1"], "upstream", thinking=True,
                              repair_leak=False, guard=ChoiceGuard(PII))  # fmt: skip
    state.take(None, "think one ", final=False)
    state.take("answer ", None, final=False)
    shown = state.take(None, f"think two {EMAIL} ", final=False)[0]
    shown += state.take(None, None, final=True)[0]
    assert shown == "think two [EMAIL] "
    assert "".join(state.reasoning) == "think one think two [EMAIL] "


def test_a_budget_cut_resumes_from_the_models_reasoning_and_sends_what_it_held() -> None:
    state = ChoiceState.start(BUILTIN["deepseek_r1"], "text", thinking=True, repair_leak=False,
                              guard=ChoiceGuard(PII))  # fmt: skip
    shown = state.take(f"so I mail {EMAIL} and the total is 4211", None, final=False)[0]
    state.end_reasoning()
    assert state.model_reasoning() == f"so I mail {EMAIL} and the total is 4211"
    later = state.take("The answer.", None, final=True)  # "4211" could have been a number
    assert shown + later[0] == "so I mail [EMAIL] and the total is 4211"
    assert later[1] == "The answer."
    assert "".join(state.reasoning) == "so I mail [EMAIL] and the total is 4211"


@pytest.mark.parametrize("action", ["redact", "flag"])
def test_a_copy_a_policy_leaves_alone_is_the_text_itself_even_where_matches_overlap(
    action: str,
) -> None:
    """A phone number that took a card's first digits, and the card's rest: two findings that
    overlap, each leaving the client's copy (targets: ledger) as it came."""
    policies = parse(f"policies:\n  - {{name: p, detect: [phone, credit_card], action: {action}, "
                     "targets: [ledger]}\n").policies  # fmt: skip
    text = "call 90 5500-0000-0000-0004 now"
    for pieces in ([text], list(text)):
        guard = ChoiceGuard(policies)
        shown = [guard.take("", piece, False).content for piece in pieces]
        shown.append(guard.take("", "", True).content)
        assert "".join(shown) == text
        assert [a.detector for a in guard.acts] == ["phone", "credit_card"]


class GeneralPathOnly(StreamRelay):
    """The relay without its fast paths: the reference a guarded fast path must agree with."""

    def _fast_path(self, chunk: dict[str, Any], raw: bytes) -> bytes | None:
        return None

    def _guarded(self, chunk: dict[str, Any], raw: bytes) -> bytes | None:
        return None


MIXED = parse(
    "policies:\n  - {name: pii, detect: [email], action: redact}\n"
    "  - {name: phones, detect: [phone], action: redact, targets: [client]}\n"
    "  - {name: cards, detect: [credit_card], scope: [reasoning], action: flag}\n"
    "  - {name: keys, detect: [secret_key], scope: [answer], action: block}\n"
).policies
PIECES = st.sampled_from(
    [" me", "</think>", "</th", "ink>", "\n\n", " jane", ".doe@", "example", ".com",
     " +1 415", " 555", "-0198", " 4111 1111", " 1111 1111", " AKIAIOSFODNN7", "EXAMPLE ",
     "é", " thought12", "\u2028", '"q"']
)  # fmt: skip
FIELDS = st.sampled_from(["content", "content", "reasoning", "reasoning_content"])


def _client(out: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e.data) for e in SSEParser().feed(out) if not e.is_done]


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.tuples(FIELDS, PIECES), max_size=30),
    source=st.sampled_from(["text", "upstream"]),
    show=st.booleans(),
    field=st.sampled_from(["reasoning_content", "reasoning", "both"]),
    logprobs=st.booleans(),
)
def test_a_guarded_fast_path_agrees_with_the_general_path(
    pieces: list[tuple[str, str]], source: Any, show: bool, field: Any, logprobs: bool
) -> None:
    """What the client gets, what the record keeps, what was shown and every act: the same
    whether a guarded choice's chunks take the fast path or not."""
    guarded = Policy.named("deepseek_r1", show, field, include_usage=True, source=source,
                           guard=lambda: ChoiceGuard(MIXED))  # fmt: skip
    last = len(pieces) - 1
    choices = [[{"index": 0, "delta": {f: t}, "logprobs": {"content": []} if logprobs else None,
                 "finish_reason": "stop" if i == last else None}]
               for i, (f, t) in enumerate(pieces)]  # fmt: skip
    events = [event(c) for c in choices] + [Event(b"[DONE]")]
    fast, general = StreamRelay(guarded), GeneralPathOnly(guarded)
    assert _client(b"".join(fast.feed(e) for e in events)) == _client(
        b"".join(general.feed(e) for e in events)
    )
    for a, b in zip(fast.choices.values(), general.choices.values(), strict=True):
        assert (a.reasoning, a.content, a.shown_text()) == (b.reasoning, b.content, b.shown_text())
        assert (a.deltas, a.reasoning_tokens, a.blocked) == (
            b.deltas,
            b.reasoning_tokens,
            b.blocked,
        )
        assert a.guard is not None and b.guard is not None and a.guard.acts == b.guard.acts


def test_a_guarded_chunk_is_the_upstreams_bytes_with_the_released_text_patched_in() -> None:
    """The guard holds "jane" back (it could begin an email); the next chunk carries it
    with its own text, every other byte as the upstream sent it (nothing re-encoded)."""
    relay = StreamRelay(guarded())
    relay.feed(event([{"index": 0, "delta": {"content": "</think>"}}]))
    assert relay.feed(event([{"index": 0, "delta": {"content": "jane"}}])) == b""
    sent = b'{"id":"c", "choices":[{"index":0,"delta":{"content":" wrote!"},"x":1.50}]}'
    out = relay.feed(Event(sent))
    assert out == b"data: " + sent.replace(b'" wrote!"', b'"jane wrote!"') + b"\n\n"
