"""The legacy completion's ``text`` split into reasoning and answer when the prompt opened the
reasoning, streamed and whole, under any chunking; logprobs and usage per policy."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.relay.apis.completions import CompletionsRelay, CompletionsWhole, opened_by
from gateway.relay.formats import BUILTIN, NONE
from gateway.relay.rewrite import Policy
from gateway.relay.sse import DONE_EVENT, Event, SSEParser

R1 = BUILTIN["deepseek_r1"]
OPEN_PROMPT = "User: why?\nAssistant: <think>\n"
TEXT = "Because <b> is bold.\n</think>\n\nIt is </thin> not <think> a tag."
LOGPROBS = {"tokens": ["x"], "token_logprobs": [-0.1]}


def policy(prompt: str | None, show: bool = True, usage: bool = False) -> Policy:
    fmt = opened_by(R1, prompt)
    return Policy(format=fmt, show_reasoning=show, reasoning_field="reasoning_content",
                  include_usage=usage, source="text", thinking=fmt.splits)  # fmt: skip


def piece(text: str, finish: str | None = None, **extra: Any) -> Event:
    choice = {"index": 0, "text": text, "logprobs": LOGPROBS, "finish_reason": finish}
    body = {"id": "cmpl-1", "object": "text_completion", "choices": [choice], **extra}
    return Event(orjson.dumps(body))


def usage(completion: int = 4) -> Event:
    counts = {"prompt_tokens": 2, "completion_tokens": completion, "total_tokens": 2 + completion}
    return Event(orjson.dumps({"id": "cmpl-1", "choices": [], "usage": counts}))


def sent(relay: CompletionsRelay, events: list[Event]) -> list[dict[str, Any]]:
    raw = b"".join(relay.feed(e) for e in events)
    assert raw.endswith(DONE_EVENT) or not events[-1].is_done
    return [orjson.loads(e.data) for e in SSEParser().feed(raw) if not e.is_done]


def joined(chunks: list[dict[str, Any]], key: str) -> str:
    return "".join(c.get(key) or "" for ch in chunks for c in ch["choices"])


def whole(text: str, **choice: Any) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion",
            "choices": [{"index": 0, "text": text, "logprobs": LOGPROBS, "finish_reason": "stop",
                         **choice}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 10, "total_tokens": 12}}  # fmt: skip


@pytest.mark.parametrize(
    ("prompt", "opened"),
    [(OPEN_PROMPT, True), ("x <think>  \n\t", True), ("Q: hi", False), ("<think> then", False),
     (None, False)],
)  # fmt: skip
def test_the_prompt_opens_the_reasoning_or_not(prompt: str | None, opened: bool) -> None:
    assert opened_by(R1, prompt).opened is opened
    assert opened_by(BUILTIN["think_tags"], prompt).opened is opened
    assert opened_by(NONE, OPEN_PROMPT) is NONE  # nothing to open


def test_a_whole_completion_is_split_when_the_prompt_opened_the_reasoning() -> None:
    body = CompletionsWhole(policy(OPEN_PROMPT)).complete(whole("I think.</think>\n\nBlue."))
    assert body["choices"][0] == {
        "index": 0,
        "text": "\n\nBlue.",
        "logprobs": LOGPROBS,
        "finish_reason": "stop",
        "reasoning_content": "I think.",
    }
    # no per-token deltas: 10 completion tokens shared out as 8 reasoning to 7 answer chars
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}


def test_a_hidden_key_gets_the_answer_without_reasoning_or_its_logprobs() -> None:
    body = whole("I think.</think>\n\nBlue.", reasoning_content="stale", token_ids=[7, 8])
    choice = CompletionsWhole(policy(OPEN_PROMPT, show=False)).complete(body)["choices"][0]
    assert choice == {"index": 0, "text": "\n\nBlue.", "logprobs": None, "finish_reason": "stop",
                      "token_ids": None}  # fmt: skip


@pytest.mark.parametrize("prompt", ["Q: hi", None])
def test_nothing_is_split_when_the_prompt_did_not_open_it(prompt: str | None) -> None:
    body = CompletionsWhole(policy(prompt, show=False)).complete(whole("I think.</think> Blue."))
    choice = body["choices"][0]
    assert choice["text"] == "I think.</think> Blue." and choice["logprobs"] == LOGPROBS
    assert "reasoning_content" not in choice
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_choices_are_split_each_on_its_own() -> None:
    body = whole("a</think>b")
    body["choices"].append({"index": 1, "text": "c</think>d", "finish_reason": "length"})
    out = CompletionsWhole(policy(OPEN_PROMPT)).complete(body)["choices"]
    assert [(c["text"], c["reasoning_content"]) for c in out] == [("b", "a"), ("d", "c")]


def test_a_visible_stream_carries_reasoning_content_and_drops_empty_chunks() -> None:
    events = [piece("I think"), piece("."), piece("</think>"), piece("\n\nBlue"),
              piece("", finish="stop"), usage(), Event(b"[DONE]")]  # fmt: skip
    chunks = sent(CompletionsRelay(policy(OPEN_PROMPT)), events)
    assert [c["choices"][0] for c in chunks] == [
        {"index": 0, "text": "", "logprobs": LOGPROBS, "finish_reason": None,
         "reasoning_content": "I think"},
        {"index": 0, "text": "", "logprobs": LOGPROBS, "finish_reason": None,
         "reasoning_content": "."},
        {"index": 0, "text": "\n\nBlue", "logprobs": LOGPROBS, "finish_reason": None},
        {"index": 0, "text": "", "logprobs": LOGPROBS, "finish_reason": "stop"},
    ]  # fmt: skip


def test_a_hidden_stream_drops_reasoning_chunks_and_their_logprobs() -> None:
    events = [piece("I think"), piece(".</thi"), piece("nk>\n\nBlue"), piece(".", finish="stop"),
              Event(b"[DONE]")]  # fmt: skip
    relay = CompletionsRelay(policy(OPEN_PROMPT, show=False))
    raw = b"".join(relay.feed(e) for e in events)
    assert b"think" not in raw and b"reasoning" not in raw
    chunks = [orjson.loads(e.data) for e in SSEParser().feed(raw) if not e.is_done]
    assert [(c["choices"][0]["text"], c["choices"][0]["logprobs"]) for c in chunks] == [
        ("\n\nBlue", LOGPROBS), (".", LOGPROBS)]  # fmt: skip
    mixed = CompletionsRelay(policy(OPEN_PROMPT, show=False))
    out = sent(mixed, [piece("hmm</think>Blue"), Event(b"[DONE]")])
    assert out[0]["choices"][0] == {"index": 0, "text": "Blue", "logprobs": None,
                                    "finish_reason": None}  # fmt: skip


@pytest.mark.parametrize("include", [True, False])
def test_usage_is_filled_and_reaches_only_a_client_that_asked(include: bool) -> None:
    relay = CompletionsRelay(policy(OPEN_PROMPT, usage=include))
    events = [piece("a"), piece("b"), piece("</think>"), piece("c", finish="stop"), usage(4)]
    chunks = sent(relay, [*events, Event(b"[DONE]")])
    filled = {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6,
              "completion_tokens_details": {"reasoning_tokens": 3}}  # fmt: skip
    assert relay.usage == filled
    assert [c["usage"] for c in chunks if "usage" in c] == ([filled] if include else [])
    assert len(chunks) == (4 if include else 3)  # the marker's chunk is dropped


def test_a_null_usage_placeholder_is_left_alone() -> None:
    out = sent(CompletionsRelay(policy(None)), [piece("x", usage=None), Event(b"[DONE]")])
    choice = {"index": 0, "text": "x", "logprobs": LOGPROBS, "finish_reason": None}
    assert out == [
        {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": None}
    ]


@settings(max_examples=200, deadline=None)
@given(
    cuts=st.sets(st.integers(min_value=1, max_value=len(TEXT) - 1), max_size=len(TEXT)),
    prompt=st.sampled_from([OPEN_PROMPT, "Q:"]),
    show=st.booleans(),
)
def test_any_chunking_gives_the_whole_completions_split(
    cuts: set[int], prompt: str, show: bool
) -> None:
    bounds = [0, *sorted(cuts), len(TEXT)]
    parts = [TEXT[a:b] for a, b in itertools.pairwise(bounds)]
    events = [piece(p, finish="stop" if i == len(parts) - 1 else None) for i, p in enumerate(parts)]
    chunks = sent(CompletionsRelay(policy(prompt, show)), [*events, Event(b"[DONE]")])
    expected = CompletionsWhole(policy(prompt, show)).complete(whole(TEXT))["choices"][0]
    assert joined(chunks, "text") == expected["text"]
    assert joined(chunks, "reasoning_content") == expected.get("reasoning_content", "")
    for c in chunks:  # no chunk left empty but the last, which carries the finish reason
        choice = c["choices"][0]
        assert choice["text"] or choice.get("reasoning_content") or choice["finish_reason"]
        assert "reasoning_content" not in choice or show
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
