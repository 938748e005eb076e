"""The chunk path: per-choice splitting, reasoning policy, usage handling and byte framing."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import RemoteProtocolError, UpstreamStatusError
from gateway.relay.formats import BUILTIN, ReasoningSource
from gateway.relay.rewrite import Policy, ReasoningField, Rewriter, StreamRelay, rewrite_completion
from gateway.relay.sse import DONE_EVENT, Event, SSEParser


def chunk(index: int = 0, finish: str | None = None, usage: Any = ..., **delta: Any) -> Event:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not ...:
        body["usage"] = usage
    return Event(orjson.dumps(body))


def usage_chunk(completion: int, reasoning: int | None = None) -> Event:
    details = {"reasoning_tokens": reasoning} if reasoning is not None else None
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": completion,
        "total_tokens": 5 + completion,
        "completion_tokens_details": details,
    }
    return Event(
        orjson.dumps(
            {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        )
    )


def policy(
    parser: str = "deepseek_r1",
    show: bool = True,
    field: ReasoningField = "reasoning_content",
    usage: bool = False,
    source: ReasoningSource = "text",
    thinking: bool = True,
) -> Policy:
    return Policy.named(parser, show, field, include_usage=usage, source=source, thinking=thinking)


def client_view(out: bytes) -> list[dict[str, Any]]:
    """Decode what the client receives (all events but [DONE])."""
    parser = SSEParser()
    return [orjson.loads(e.data) for e in parser.feed(out) if not e.is_done]


def joined(chunks: list[dict[str, Any]], key: str, index: int = 0) -> str | None:
    parts = [c["delta"].get(key) for ch in chunks for c in ch["choices"] if c["index"] == index]
    for p in parts:
        assert p != "", f"empty {key} delta sent"
    text = "".join(p for p in parts if p)
    return text or None


def run_stream(relay: StreamRelay, events: list[Event]) -> list[dict[str, Any]]:
    return client_view(b"".join(relay.feed(e) for e in events))


R1_TOKENS = ["Let", " me", " think", ".\n", "</think>", "\n\n", "Blue", "."]


def r1_events(tokens: list[str] = R1_TOKENS) -> list[Event]:
    events = [chunk(role="assistant", content="")]
    events += [
        chunk(content=t, finish="stop" if i == len(tokens) - 1 else None)
        for i, t in enumerate(tokens)
    ]
    return [*events, usage_chunk(len(tokens)), Event(b"[DONE]")]


def test_template_opened_stream_is_split_and_tags_never_reach_content() -> None:
    chunks = run_stream(StreamRelay(policy()), r1_events())
    assert joined(chunks, "reasoning_content") == "Let me think.\n"
    assert joined(chunks, "content") == "\n\nBlue."
    assert all("reasoning" not in c["delta"] for ch in chunks for c in ch["choices"])


def test_role_chunk_keeps_role_but_drops_the_empty_content() -> None:
    chunks = run_stream(StreamRelay(policy()), r1_events())
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}


def test_hidden_policy_sends_no_byte_of_reasoning() -> None:
    relay = StreamRelay(policy(show=False))
    raw = b"".join(relay.feed(e) for e in r1_events())
    assert b"think" not in raw and b"Let" not in raw and b"reasoning" not in raw
    assert joined(client_view(raw), "content") == "\n\nBlue."


@pytest.mark.parametrize(
    ("field", "keys"),
    [
        ("reasoning_content", {"reasoning_content"}),
        ("reasoning", {"reasoning"}),
        ("both", {"reasoning", "reasoning_content"}),
    ],
)
def test_reasoning_field_setting(field: ReasoningField, keys: set[str]) -> None:
    chunks = run_stream(StreamRelay(policy(field=field)), r1_events())
    first = next(c["delta"] for ch in chunks for c in ch["choices"] if set(c["delta"]) & keys)
    assert set(first) == keys


def test_upstream_separated_reasoning_is_used_not_text_split() -> None:
    events = [
        chunk(role="assistant", content=""),
        chunk(reasoning="I reason"),
        chunk(reasoning=" <think>literally"),
        chunk(content="Answer </think> verbatim", finish="stop"),
        usage_chunk(4),
        Event(b"[DONE]"),
    ]
    chunks = run_stream(StreamRelay(policy(field="reasoning_content")), events)
    assert joined(chunks, "reasoning_content") == "I reason <think>literally"
    assert joined(chunks, "content") == "Answer </think> verbatim"
    assert all("reasoning" not in c["delta"] for ch in chunks for c in ch["choices"])


def test_held_text_leaves_with_the_finish_chunk() -> None:
    events = [chunk(content="x</think>"), chunk(content="a <", finish="length"), Event(b"[DONE]")]
    chunks = run_stream(StreamRelay(policy()), events)
    assert joined(chunks, "content") == "a <"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_length_cut_inside_reasoning_has_no_content() -> None:
    events = [
        chunk(content="still thin"),
        chunk(content="king </th", finish="length"),
        Event(b"[DONE]"),
    ]
    chunks = run_stream(StreamRelay(policy()), events)
    assert joined(chunks, "reasoning_content") == "still thinking </th"
    assert joined(chunks, "content") is None


def test_n_choices_keep_separate_state() -> None:
    events = [
        chunk(0, content="a</th"),
        chunk(1, content="b"),
        chunk(0, content="ink>A"),
        chunk(1, content="</think>B", finish="stop"),
        chunk(0, content="", finish="stop"),
        Event(b"[DONE]"),
    ]
    chunks = run_stream(StreamRelay(policy()), events)
    assert (joined(chunks, "reasoning_content", 0), joined(chunks, "content", 0)) == ("a", "A")
    assert (joined(chunks, "reasoning_content", 1), joined(chunks, "content", 1)) == ("b", "B")


def test_think_tags_parser_keeps_text_before_the_tag_as_content() -> None:
    events = [
        chunk(content="pre <thi"),
        chunk(content="nk>r</think>post", finish="stop"),
        Event(b"[DONE]"),
    ]
    chunks = run_stream(StreamRelay(policy(parser="think_tags")), events)
    assert (joined(chunks, "reasoning_content"), joined(chunks, "content")) == ("r", "pre post")


def test_usage_chunk_only_when_the_client_asked_and_reasoning_tokens_counted() -> None:
    without = run_stream(StreamRelay(policy()), r1_events())
    assert all("usage" not in c for c in without)
    relay = StreamRelay(policy(usage=True))
    with_usage = run_stream(relay, r1_events())
    usage = with_usage[-1]["usage"]
    # one token per delta: "Let"," me"," think",".\n" and the "</think>" tag token are reasoning
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 5
    assert relay.usage == usage


def test_upstream_reasoning_token_count_wins_when_reported() -> None:
    events = [*r1_events()[:-2], usage_chunk(len(R1_TOKENS), reasoning=3), Event(b"[DONE]")]
    relay = StreamRelay(policy(usage=True))
    run_stream(relay, events)
    assert relay.usage is not None
    assert relay.usage["completion_tokens_details"]["reasoning_tokens"] == 3


def test_merged_tokens_share_usage_by_characters() -> None:
    events = [
        chunk(content="aaaa</think>"),
        chunk(content="bbbb", finish="stop"),
        usage_chunk(20),
        Event(b"[DONE]"),
    ]
    relay = StreamRelay(policy(usage=True))
    run_stream(relay, events)
    assert relay.usage is not None
    assert relay.usage["completion_tokens_details"]["reasoning_tokens"] == 10


def test_null_usage_placeholders_pass_untouched() -> None:
    relay = StreamRelay(policy(parser="none"))
    event = chunk(content="x", usage=None)
    assert relay.feed(event) == b"data: " + event.data + b"\n\n"


def test_unchanged_chunk_is_reframed_from_the_upstream_bytes() -> None:
    relay = StreamRelay(policy(parser="none"))
    event = chunk(content="plain")
    assert relay.feed(event) == b"data: " + event.data + b"\n\n"


def test_done_is_reported_and_returned() -> None:
    relay = StreamRelay(policy())
    assert relay.feed(Event(b"[DONE]")) == DONE_EVENT
    assert relay.done


def test_hidden_reasoning_drops_logprobs_and_token_ids_that_would_spell_it() -> None:
    """vLLM's ``return_token_ids`` puts the output's ids on each choice: with the model's
    public tokenizer they decode to the reasoning, as logprobs spell it."""
    body = {
        "choices": [
            {
                "index": 0,
                "delta": {"content": "secret"},
                "logprobs": {"content": [{"token": "secret"}]},
                "token_ids": [31337],
                "finish_reason": None,
            }
        ]
    }
    relay = StreamRelay(policy(show=False))
    assert relay.feed(Event(orjson.dumps(body))) == b""
    body["choices"][0]["delta"] = {"content": "x</think>y"}
    out = client_view(relay.feed(Event(orjson.dumps(body))))
    assert out[0]["choices"][0]["logprobs"] is None
    assert out[0]["choices"][0]["token_ids"] is None


def test_a_whole_completion_withholds_token_ids_of_hidden_reasoning() -> None:
    message = {"role": "assistant", "content": "secret</think>answer"}
    whole = {"choices": [{"index": 0, "finish_reason": "stop", "token_ids": [1, 2, 3],
                          "message": message}]}  # fmt: skip
    hidden = Rewriter(policy(show=False)).complete(orjson.loads(orjson.dumps(whole)))
    shown = Rewriter(policy(show=True)).complete(orjson.loads(orjson.dumps(whole)))
    assert hidden["choices"][0]["token_ids"] is None
    assert shown["choices"][0]["token_ids"] == [1, 2, 3]


@pytest.mark.parametrize("raw", [b"not json", b"[1,2]", b'"str"'])
def test_garbage_event_is_a_remote_protocol_error(raw: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        StreamRelay(policy()).feed(Event(raw))


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "boom", "code": 500}},
        {"object": "error", "message": "boom", "type": "x", "code": 400},
    ],
)
def test_upstream_error_event_becomes_an_upstream_error(body: dict[str, Any]) -> None:
    with pytest.raises(UpstreamStatusError, match="boom"):
        StreamRelay(policy()).feed(Event(orjson.dumps(body)))


def completion(content: str | None, **message: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13},
    }


def test_non_streaming_is_the_same_split() -> None:
    body = rewrite_completion(Rewriter(policy()), completion("r1 reasoning\n</think>\n\nAnswer"))
    message = body["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": "\n\nAnswer",
        "reasoning_content": "r1 reasoning\n",
    }
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6


def test_non_streaming_hidden_and_reasoning_only() -> None:
    body = rewrite_completion(Rewriter(policy(show=False)), completion("cut inside reasoning"))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": None}


def test_non_streaming_upstream_separated() -> None:
    body = rewrite_completion(Rewriter(policy(field="both")), completion("A", reasoning="R"))
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "A",
        "reasoning": "R",
        "reasoning_content": "R",
    }


def test_chunk_whose_choices_were_all_dropped_is_not_sent_even_with_null_usage() -> None:
    relay = StreamRelay(policy(show=False, usage=True))
    assert relay.feed(chunk(content="hidden reasoning", usage=None)) == b""


@pytest.mark.parametrize(
    "body",
    [
        {"choices": "nope"},
        {"choices": [1]},
        {"choices": [{"index": 0, "delta": "x"}]},
        {"choices": [{"index": 0, "delta": {"content": 5}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": ["x"]}}]},
    ],
)
def test_wrongly_shaped_chunks_are_remote_protocol_errors(body: dict[str, Any]) -> None:
    with pytest.raises(RemoteProtocolError):
        StreamRelay(policy()).feed(Event(orjson.dumps(body)))


@pytest.mark.parametrize("choices", ["x", [1], [{"index": 0, "message": "m"}]])
def test_wrongly_shaped_completions_are_remote_protocol_errors(choices: Any) -> None:
    with pytest.raises(RemoteProtocolError):
        rewrite_completion(Rewriter(policy()), {"choices": choices})


class GeneralPathOnly(StreamRelay):
    """The relay without its fast path: the reference the fast path must agree with."""

    def _fast_path(self, chunk: dict[str, Any], raw: bytes) -> bytes | None:
        return None


TOKENS = st.sampled_from(
    ["Let", " me", "<", "</th", "ink>", "</think>", "<think>", "\n\n", "é", "a<b",
     "<|close|>", "think<|sep|>", "<tool_call>", "<|open|>think<|sep|>"]
)  # fmt: skip


FIELDS = st.sampled_from(["content", "content", "reasoning", "reasoning_content"])


@settings(max_examples=400, deadline=None)
@given(
    tokens=st.lists(st.tuples(FIELDS, TOKENS), max_size=25),
    parser=st.sampled_from(sorted(BUILTIN)),
    show=st.booleans(),
    field=st.sampled_from(["reasoning_content", "reasoning", "both"]),
    source=st.sampled_from(["text", "upstream"]),
    thinking=st.booleans(),
)
def test_fast_path_agrees_with_the_general_path(
    tokens: list[tuple[str, str]], parser: str, show: bool, field: ReasoningField,
    source: ReasoningSource, thinking: bool,
) -> None:  # fmt: skip
    last = len(tokens) - 1
    events = [chunk(role="assistant", content="")]
    events += [
        chunk(finish="stop" if i == last else None, **{f: t}) for i, (f, t) in enumerate(tokens)
    ]
    events += [usage_chunk(len(tokens)), Event(b"[DONE]")]
    fast = StreamRelay(policy(parser, show, field, True, source, thinking))
    general = GeneralPathOnly(policy(parser, show, field, True, source, thinking))
    assert client_view(b"".join(fast.feed(e) for e in events)) == client_view(
        b"".join(general.feed(e) for e in events)
    )
    assert fast.usage == general.usage
    assert [(c.reasoning, c.content) for c in fast.choices.values()] == [
        (c.reasoning, c.content) for c in general.choices.values()
    ]


def test_renamed_reasoning_chunk_keeps_every_other_byte() -> None:
    relay = StreamRelay(policy())
    relay.feed(chunk(role="assistant", content=""))
    event = chunk(content=" user")
    out = relay.feed(event)
    assert out == b"data: " + event.data.replace(b'{"content":', b'{"reasoning_content":') + b"\n\n"


# -- where reasoning comes from (REASONING_SOURCE) and thinking switched off ----------------

CONTENT_ONLY = [" This", " is", " the", " rest"]  # vLLM's R1 parser after an empty reasoning


def content_only_events() -> list[Event]:
    events = [chunk(role="assistant", content="")]
    last = len(CONTENT_ONLY) - 1
    events += [
        chunk(content=t, finish="stop" if i == last else None) for i, t in enumerate(CONTENT_ONLY)
    ]
    return [*events, usage_chunk(5), Event(b"[DONE]")]


@pytest.mark.parametrize("show", [True, False], ids=["visible", "hidden"])
def test_a_separating_upstream_without_reasoning_gives_the_answer_to_every_key(show: bool) -> None:
    relay = StreamRelay(policy(show=show, source="upstream", usage=True))
    chunks = run_stream(relay, content_only_events())
    assert joined(chunks, "content") == "".join(CONTENT_ONLY)
    assert joined(chunks, "reasoning_content") is None
    assert relay.usage is not None
    assert relay.usage["completion_tokens_details"]["reasoning_tokens"] == 0


def test_the_same_stream_read_as_text_is_what_the_text_source_means() -> None:
    # REASONING_SOURCE=text with R1's format: the output starts inside reasoning. This is why
    # the source is configured: the two readings of the same bytes differ.
    chunks = run_stream(StreamRelay(policy(source="text")), content_only_events())
    assert (joined(chunks, "reasoning_content"), joined(chunks, "content")) == (
        "".join(CONTENT_ONLY),
        None,
    )


@pytest.mark.parametrize("show", [True, False], ids=["visible", "hidden"])
def test_a_whole_message_with_null_reasoning_from_a_separating_upstream(show: bool) -> None:
    rewriter = Rewriter(policy(show=show, source="upstream"))
    body = rewrite_completion(rewriter, completion("This is the rest", reasoning=None))
    assert body["choices"][0]["message"]["content"] == "This is the rest"
    assert "reasoning_content" not in body["choices"][0]["message"]


def test_upstream_source_still_ends_reasoning_at_a_spelled_close_marker_of_the_format() -> None:
    events = [
        chunk(reasoning="plan<|close|>"),
        chunk(reasoning="think<|sep|>The answer"),
        chunk(content=".", finish="stop"),
        Event(b"[DONE]"),
    ]
    chunks = run_stream(StreamRelay(policy("kimi_k3", source="upstream")), events)
    assert (joined(chunks, "reasoning_content"), joined(chunks, "content")) == (
        "plan",
        "The answer.",
    )


@pytest.mark.parametrize("show", [True, False], ids=["visible", "hidden"])
def test_thinking_off_makes_every_text_field_the_answer(show: bool) -> None:
    # A hybrid model asked not to think, behind vLLM's deepseek_r1 parser: no </think> ever
    # comes, so the parser sends the whole answer as reasoning.
    events = [
        chunk(role="assistant", content=""),
        chunk(reasoning="Paris"),
        chunk(reasoning=" is </think> it", finish="stop"),
        usage_chunk(2),
        Event(b"[DONE]"),
    ]
    relay = StreamRelay(policy(show=show, thinking=False, source="upstream"))
    chunks = run_stream(relay, events)
    assert joined(chunks, "content") == "Paris is </think> it"
    assert joined(chunks, "reasoning_content") is None
    assert relay.usage is not None
    assert relay.usage["completion_tokens_details"]["reasoning_tokens"] == 0
    whole = Rewriter(policy(show=show, thinking=False))
    body = rewrite_completion(whole, completion("<think>x</think>y", reasoning="r"))
    assert body["choices"][0]["message"]["content"] == "r<think>x</think>y"


def test_a_multi_token_marker_cut_anywhere_in_the_bytes_splits_the_same() -> None:
    # DeepSeek-V4's tool-call marker holds multi-byte characters ("｜"): the upstream's reads
    # may cut it anywhere, inside a UTF-8 sequence included; the SSE parser and the splitter
    # between them give the same result for every cut.
    marker = "<｜DSML｜tool_calls>"
    events = [
        chunk(content="plan "),
        chunk(content=marker[:4]),
        chunk(content=marker[4:]),
        chunk(content='{"f": 1}', finish="stop"),
    ]
    wire = b"".join(b"data: " + e.data + b"\n\n" for e in events) + b"data: [DONE]\n\n"

    def client_sees(cuts: list[int]) -> tuple[str | None, str | None]:
        parser, relay, out = SSEParser(), StreamRelay(policy("deepseek_v4")), b""
        bounds = [0, *cuts, len(wire)]
        for a, b in itertools.pairwise(bounds):
            out += b"".join(relay.feed(e) for e in parser.feed(wire[a:b]))
        chunks = client_view(out)
        return joined(chunks, "reasoning_content"), joined(chunks, "content")

    expected = ("plan ", marker + '{"f": 1}')
    assert client_sees([]) == expected
    inside = [i for i in range(len(wire)) if wire[i] & 0xC0 == 0x80]  # UTF-8 continuation bytes
    assert inside
    for cut in range(1, len(wire)):
        assert client_sees([cut]) == expected, cut
