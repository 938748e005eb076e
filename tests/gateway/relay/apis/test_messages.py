"""The chat completion as an Anthropic Messages message: streamed events (block order, indexes,
the seal of the thinking, a hidden key's redacted block) and the whole message, which must
say the same."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import RemoteProtocolError
from gateway.relay.apis.messages import MessageMeta, MessagesStream, MessagesWhole
from gateway.relay.rewrite import Policy
from gateway.relay.sse import Event, SSEParser
from tests.gateway.relay.test_responses_tools import more, opening
from tests.gateway.relay.test_rewrite import chunk, usage_chunk

R1 = ["Let", " me", " think", ".\n", "</think>", "\n\n", "Blue", "."]
SECRET = ["Secret", " plan", ".\n", "</think>", "\n\nBlue", "."]
Sent = list[tuple[str, dict[str, Any]]]


def seal(text: str) -> str:
    return "sig:" + text[::-1]


def policy(show: bool = True) -> Policy:
    return Policy.named("deepseek_r1", show_reasoning=show, reasoning_field="reasoning_content",
                        include_usage=True)  # fmt: skip


def meta(thinking: bool = True, stops: tuple[str, ...] = ()) -> MessageMeta:
    return MessageMeta("m", thinking, stops, seal, id="msg_1")


def finish_chunk(finish: str, stop_reason: Any = None) -> Event:
    choice = {"index": 0, "delta": {}, "finish_reason": finish, "stop_reason": stop_reason}
    return Event(orjson.dumps({"id": "chatcmpl-1", "choices": [choice]}))


def token_events(tokens: list[str], finish: str = "stop", stop_reason: Any = None) -> list[Event]:
    events = [chunk(role="assistant", content=""), *(chunk(content=t) for t in tokens)]
    return [*events, finish_chunk(finish, stop_reason), usage_chunk(len(tokens)), Event(b"[DONE]")]


def streamed(relay: MessagesStream, events: list[Event]) -> tuple[bytes, Sent]:
    raw = b"".join(relay.feed(e) for e in events) + relay.end()
    sent = [(e.event or "", orjson.loads(e.data)) for e in SSEParser().feed(raw)]
    assert all(name == data["type"] for name, data in sent)
    return raw, sent


def shape(sent: Sent) -> list[tuple[str, int | None, str | None]]:
    """(event, index, block or delta type), runs of the same delta squeezed into one."""
    out: list[tuple[str, int | None, str | None]] = []
    for name, data in sent:
        kind = (data.get("content_block") or data.get("delta") or {}).get("type")
        step = (name, data.get("index"), kind if name.startswith("content_block") else None)
        if not (out and out[-1] == step and name == "content_block_delta"):
            out.append(step)
    return out


def assembled(sent: Sent) -> list[dict[str, Any]]:
    """The content blocks a client puts together from the events, as Anthropic's SDK does."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for name, data in sent:
        if name == "content_block_start":
            assert data["index"] == len(blocks)
            blocks[data["index"]], partial[data["index"]] = dict(data["content_block"]), ""
        elif name == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            field = {"thinking_delta": "thinking", "text_delta": "text"}.get(delta["type"])
            if field:
                block[field] += delta[field]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                partial[data["index"]] += delta["partial_json"]
        elif name == "content_block_stop" and blocks[data["index"]]["type"] == "tool_use":
            blocks[data["index"]]["input"] = orjson.loads(partial[data["index"]] or "{}")
    return [blocks[i] for i in sorted(blocks)]


def whole(content: str, finish: str = "stop", **message: Any) -> dict[str, Any]:
    choice = {"index": 0, "finish_reason": finish,
              "message": {"role": "assistant", "content": content, **message}}  # fmt: skip
    usage = {"prompt_tokens": 3, "completion_tokens": 10, "total_tokens": 13}
    return {"id": "c", "object": "chat.completion", "choices": [choice], "usage": usage}


def test_a_visible_thinking_stream_in_order() -> None:
    _, sent = streamed(MessagesStream(policy(), meta()), token_events(R1))
    assert shape(sent) == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    signatures = [
        d["delta"] for _, d in sent if d.get("delta", {}).get("type") == "signature_delta"
    ]
    assert signatures == [{"type": "signature_delta", "signature": seal("Let me think.\n")}]
    assert assembled(sent) == [
        {"type": "thinking", "thinking": "Let me think.\n", "signature": seal("Let me think.\n")},
        {"type": "text", "text": "\n\nBlue."},
    ]
    assert sent[0][1]["message"] == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0},
    }  # fmt: skip
    assert sent[-2][1] == {"type": "message_delta",
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"input_tokens": 5, "output_tokens": 8}}  # fmt: skip


def test_a_hidden_key_gets_a_redacted_block_and_no_byte_of_the_reasoning() -> None:
    raw, sent = streamed(MessagesStream(policy(show=False), meta()), token_events(SECRET))
    assert b"Secret" not in raw and b"plan" not in raw and b"thinking_delta" not in raw
    assert sent[1:3] == [
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block":
                                 {"type": "redacted_thinking", "data": seal("Secret plan.\n")}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]  # fmt: skip
    assert assembled(sent)[1:] == [{"type": "text", "text": "\n\nBlue."}]


@pytest.mark.parametrize("show", [True, False], ids=["visible", "hidden"])
def test_no_thinking_block_when_the_request_did_not_ask(show: bool) -> None:
    raw, sent = streamed(MessagesStream(policy(show), meta(thinking=False)), token_events(SECRET))
    assert assembled(sent) == [{"type": "text", "text": "\n\nBlue."}]
    assert b"Secret" not in raw and b"thinking" not in raw


def call_events(text: str, tail: str) -> list[Event]:
    return [
        chunk(role="assistant", content=""),
        chunk(content="Plan"),
        chunk(content="</think>"),
        chunk(content=text),
        chunk(tool_calls=[opening(0, "call_a", "lookup", '{"q":')]),
        chunk(tool_calls=[more(0, '"x"}')]),
        chunk(tool_calls=[opening(1, "call_b", "clock")]),
        chunk(content=tail, finish="tool_calls"),
        usage_chunk(7),
        Event(b"[DONE]"),
    ]


CALLS = [
    {"type": "tool_use", "id": "call_a", "name": "lookup", "input": {"q": "x"}},
    {"type": "tool_use", "id": "call_b", "name": "clock", "input": {}},
]


THOUGHT = {"type": "thinking", "thinking": "Plan", "signature": seal("Plan")}
WHOLE_CALLS = [
    {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"q":"x"}'}},
    {"id": "call_b", "type": "function", "function": {"name": "clock", "arguments": ""}},
]


@pytest.mark.parametrize(
    ("thinking", "text", "tail", "expected"),
    [
        (False, "\n\n", "\n", CALLS),
        (True, " \n", "\n", [THOUGHT, *CALLS]),
        (False, "I'll look.", "", [{"type": "text", "text": "I'll look."}, *CALLS]),
    ],
    ids=["whitespace", "thinking-whitespace", "text"],
)
def test_tool_calls_are_tool_use_blocks(
    thinking: bool, text: str, tail: str, expected: Any
) -> None:
    _, sent = streamed(MessagesStream(policy(), meta(thinking)), call_events(text, tail))
    assert assembled(sent) == expected
    starts = [d["content_block"] for n, d in sent if n == "content_block_start"]
    assert starts[-2:] == [{**CALLS[0], "input": {}}, {**CALLS[1], "input": {}}]
    pieces = [d["delta"] for _, d in sent if d.get("delta", {}).get("type") == "input_json_delta"]
    assert [p["partial_json"] for p in pieces] == ['{"q":', '"x"}']
    assert sent[-2][1]["delta"]["stop_reason"] == "tool_use"
    body = whole("Plan</think>" + text + tail, "tool_calls", tool_calls=WHOLE_CALLS)
    message = MessagesWhole(policy(), meta(thinking)).complete(body)
    assert message["content"] == expected and message["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("finish", "matched", "stops", "expected"),
    [
        ("stop", None, (), ("end_turn", None)),
        ("length", None, (), ("max_tokens", None)),
        ("tool_calls", None, (), ("tool_use", None)),
        ("stop", "END", ("##", "END"), ("stop_sequence", "END")),
        ("stop", "END", ("##",), ("end_turn", None)),
        ("stop", 7, ("7",), ("end_turn", None)),
        ("length", "END", ("END",), ("max_tokens", None)),
    ],
)
def test_stop_reason(finish: str, matched: Any, stops: tuple[str, ...], expected: Any) -> None:
    relay = MessagesStream(policy(), meta(stops=stops))
    _, sent = streamed(relay, token_events(R1, finish, matched))
    delta = sent[-2][1]["delta"]
    assert (delta["stop_reason"], delta["stop_sequence"]) == expected
    body = whole("x</think>Blue", finish)
    body["choices"][0]["stop_reason"] = matched
    message = MessagesWhole(policy(), meta(stops=stops)).complete(body)
    assert (message["stop_reason"], message["stop_sequence"]) == expected


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        ({"type": "rate_limit_error", "message": "slow down"}, "rate_limit_error", "slow down"),
        ({"type": "invalid_request_error", "message": "bad"}, "invalid_request_error", "bad"),
        ({"type": "upstream_error", "code": "upstream_overloaded", "message": "busy"},
         "overloaded_error", "busy"),
        ({"type": "server_error"}, "api_error", "The gateway failed while streaming."),
    ],
)  # fmt: skip
def test_a_failure_is_one_error_event_and_the_end(error: Any, kind: str, message: str) -> None:
    relay = MessagesStream(policy(), meta())
    before = b"".join(relay.feed(e) for e in token_events(R1)[:3])
    failure = relay.error_event(orjson.dumps({"error": error}))
    assert [(e.event, orjson.loads(e.data)) for e in SSEParser().feed(failure)] == [
        ("error", {"type": "error", "error": {"type": kind, "message": message}})
    ]
    assert relay.end() == b"" and before.startswith(b"event: message_start\n")
    early = MessagesStream(policy(), meta())
    names = [e.event for e in SSEParser().feed(early.error_event(orjson.dumps({"error": error})))]
    assert names == ["message_start", "error"] and early.end() == b""


def test_the_keepalive_is_a_ping_event() -> None:
    assert SSEParser().feed(MessagesStream(policy(), meta()).keepalive) == [
        Event(b'{"type":"ping"}', "ping")
    ]


@pytest.mark.parametrize(("show", "thinking"), [(True, True), (False, True), (True, False)])
def test_the_whole_message_says_what_the_stream_says(show: bool, thinking: bool) -> None:
    _, sent = streamed(MessagesStream(policy(show), meta(thinking)), token_events(SECRET))
    message = MessagesWhole(policy(show), meta(thinking)).complete(whole("".join(SECRET)))
    assert message["content"] == assembled(sent)
    assert message["usage"] == {
        "input_tokens": 3,
        "output_tokens": 10,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert (message["id"], message["model"], message["role"]) == ("msg_1", "m", "assistant")
    if not show:
        assert b"Secret" not in orjson.dumps(message)


def test_an_empty_answer_is_the_same_text_block_streamed_and_whole() -> None:
    # all the tokens went to reasoning; the client did not ask for thinking blocks
    _, sent = streamed(MessagesStream(policy(), meta(False)), token_events(["Still", " going"]))
    message = MessagesWhole(policy(), meta(False)).complete(whole("Still going", "length"))
    assert message["content"] == [{"type": "text", "text": ""}]
    assert assembled(sent) == message["content"]


@pytest.mark.parametrize("arguments", ['{"q":', "not json", "[1, 2]", "3"])
def test_tool_arguments_that_are_no_json_object_are_the_upstreams_fault(arguments: str) -> None:
    call = {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = whole("x</think>", "tool_calls", tool_calls=[call])
    with pytest.raises(RemoteProtocolError):
        MessagesWhole(policy(), meta()).complete(body)


def test_message_start_carries_the_prompts_estimate_and_message_delta_the_engines_count() -> None:
    estimated = MessageMeta("m", False, (), seal, id="msg_1", input_tokens=42)
    _, sent = streamed(MessagesStream(policy(), estimated), token_events(R1))
    assert sent[0][1]["message"]["usage"]["input_tokens"] == 42
    assert sent[-2][1]["usage"] == {"input_tokens": 5, "output_tokens": 8}
    # no usage from the engine (its last chunk lost): the estimate, never a 0 over it
    no_usage = [e for e in token_events(R1) if b'"usage"' not in e.data]
    _, bare = streamed(MessagesStream(policy(), estimated), no_usage)
    assert bare[-2][1]["usage"]["input_tokens"] == 42
    message = MessagesWhole(policy(), estimated).complete({**whole("x</think>Blue"), "usage": None})
    assert message["usage"]["input_tokens"] == 42


EDITS = {"applied_edits": [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 2,
                            "cleared_input_tokens": 310}]}  # fmt: skip


def test_the_context_edits_are_reported_on_the_message_and_the_last_delta() -> None:
    managed = MessageMeta("m", True, (), seal, id="msg_1", context_management=EDITS)
    _, sent = streamed(MessagesStream(policy(), managed), token_events(R1))
    assert "context_management" not in sent[0][1]["message"]
    assert sent[-2][1]["context_management"] == EDITS
    assert MessagesWhole(policy(), managed).complete(whole("x</think>Blue"))[
        "context_management"] == EDITS  # fmt: skip
    _, plain = streamed(MessagesStream(policy(), meta()), token_events(R1))
    assert all("context_management" not in data for _, data in plain)
    assert "context_management" not in MessagesWhole(policy(), meta()).complete(whole("Blue"))


@pytest.mark.parametrize("show", [True, False], ids=["visible", "hidden"])
def test_display_omitted_sends_the_signature_and_no_byte_of_the_reasoning(show: bool) -> None:
    omitted = MessageMeta("m", True, (), seal, id="msg_1", omit_thinking=True)
    raw, sent = streamed(MessagesStream(policy(show), omitted), token_events(SECRET))
    assert b"Secret" not in raw and b"plan" not in raw and b"thinking_delta" not in raw
    assert shape(sent)[1:4] == [
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
    ]
    blocks = [{"type": "thinking", "thinking": "", "signature": seal("Secret plan.\n")},
              {"type": "text", "text": "\n\nBlue."}]  # fmt: skip
    assert assembled(sent) == blocks
    message = MessagesWhole(policy(show), omitted).complete(whole("".join(SECRET)))
    assert message["content"] == blocks and b"Secret" not in orjson.dumps(message)


def test_display_omitted_without_a_sealer_sends_a_hidden_key_nothing() -> None:
    unsealed = MessageMeta("m", True, (), None, id="msg_1", omit_thinking=True)
    raw, sent = streamed(MessagesStream(policy(False), unsealed), token_events(SECRET))
    assert assembled(sent) == [{"type": "text", "text": "\n\nBlue."}] and b"Secret" not in raw
    _, visible = streamed(MessagesStream(policy(True), unsealed), token_events(SECRET))
    assert assembled(visible)[0] == {"type": "thinking", "thinking": "", "signature": ""}


def test_the_engines_cached_tokens_are_anthropics_cache_reads() -> None:
    """Anthropic's ``input_tokens`` leaves out what was read from the cache: a client adds the
    two to know the prompt's size."""
    from gateway.relay.apis.messages import message_usage

    usage = {"prompt_tokens": 405, "completion_tokens": 5,
             "prompt_tokens_details": {"cached_tokens": 384}}  # fmt: skip
    assert message_usage(usage) == {"input_tokens": 21, "output_tokens": 5,
                                    "cache_creation_input_tokens": 0,
                                    "cache_read_input_tokens": 384}  # fmt: skip
    assert message_usage({"prompt_tokens": 7})["cache_read_input_tokens"] == 0
