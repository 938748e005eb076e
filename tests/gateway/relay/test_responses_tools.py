"""Tool calls on the way to the Responses API: the pieces put together (``ToolCalls``), then
shown as ``function_call`` items, streamed and whole, beside reasoning that may be sealed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import RemoteProtocolError
from gateway.relay.apis.responses import ResponseMeta, ResponsesStream, ResponsesWhole, Sealer
from gateway.relay.rewrite import Policy
from gateway.relay.sse import Event, SSEParser
from gateway.relay.toolcalls import ToolCalls
from tests.gateway.relay.test_rewrite import chunk, completion, usage_chunk


def opening(index: int, call_id: str, name: str, arguments: str = "") -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {"index": index, "id": call_id, "type": "function", "function": function}


def more(index: int, arguments: str) -> dict[str, Any]:
    return {"index": index, "function": {"arguments": arguments}}


# --- ToolCalls ------------------------------------------------------------------------------


def test_pieces_join_by_index() -> None:
    calls = ToolCalls()
    steps = [
        [opening(0, "call_a", "get_weather")],
        [opening(1, "call_b", "get_time", '{"tz":'), more(0, '{"city":')],
        [more(1, '"CET"}')],
        [opening(0, "call_other", "renamed", '"Paris"}')],
    ]
    added = [[(p.call.index, p.arguments, p.new) for p in calls.add(step)] for step in steps]
    assert added == [
        [(0, "", True)],
        [(1, '{"tz":', True), (0, '{"city":', False)],
        [(1, '"CET"}', False)],
        [(0, '"Paris"}', False)],  # a known index: a new id or name starts nothing
    ]
    assert [call.as_dict() for call in calls.calls] == [
        {"id": "call_a", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"id": "call_b", "name": "get_time", "arguments": '{"tz":"CET"}'},
    ]


def test_a_whole_messages_calls_are_indexed_by_position() -> None:
    calls = ToolCalls()
    message = [opening(0, "call_a", "f", "{}"), opening(0, "call_b", "g", '{"x":1}')]
    for call in message:
        del call["index"]
    assert [p.new for p in calls.add(message)] == [True, True]
    assert [(c.index, c.id, c.name, "".join(c.arguments)) for c in calls.calls] == [
        (0, "call_a", "f", "{}"),
        (1, "call_b", "g", '{"x":1}'),
    ]


@pytest.mark.parametrize(
    "first",
    [
        more(0, "{}"),
        {"index": 0, "id": "call_a", "type": "function"},
        opening(0, "call_a", "", "{}"),
        {**opening(0, "call_a", ""), "function": {"name": 7, "arguments": "{}"}},
    ],
    ids=["arguments-only", "no-function", "empty-name", "name-not-a-string"],
)
def test_a_call_begins_with_a_name(first: dict[str, Any]) -> None:
    calls = ToolCalls()
    with pytest.raises(RemoteProtocolError, match="without a name"):
        calls.add([first])
    assert calls.calls == []


@pytest.mark.parametrize(
    "raw",
    [
        {"index": 0},
        "[]",
        None,
        ["call"],
        [{**more(0, "x"), "index": "0"}],
        [{**more(0, "x"), "index": True}],
        [{**more(0, "x"), "index": 1.0}],
        [{"index": 0, "function": {"arguments": 3}}],
        [{"index": 0, "function": {"name": "f", "arguments": {"city": "Paris"}}}],
    ],
)
def test_malformed_tool_calls_are_the_upstreams_fault(raw: Any) -> None:
    with pytest.raises(RemoteProtocolError):
        ToolCalls().add(raw)


def test_a_function_that_is_not_an_object_is_the_upstreams_fault() -> None:
    with pytest.raises(RemoteProtocolError):
        ToolCalls().add([{"index": 0, "function": "get_weather"}])


# --- ResponsesStream -----------------------------------------------------------------------

REASONING = ["Plotting", " quietly."]
THOUGHT = "".join(REASONING)
STREAMED_CALLS = [  # OpenAI's shape first (an empty first piece), then vLLM's (arguments in it)
    [opening(0, "call_a", "get_weather")],
    [more(0, '{"city":')],
    [more(0, '"Paris"}')],
    [opening(1, "call_b", "get_time", '{"tz":')],
    [more(1, '"CET"}')],
]
WEATHER = {"call_id": "call_a", "name": "get_weather", "arguments": '{"city":"Paris"}'}
TIME = {"call_id": "call_b", "name": "get_time", "arguments": '{"tz":"CET"}'}


SEALED = {"encrypted_content": f"SEALED:{len(THOUGHT)}"}  # the whole reasoning, sealed once
SHOWN = {"content": [{"type": "reasoning_text", "text": THOUGHT}]}
VISIBLE_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    *["response.reasoning_text.delta"] * 2,
    "response.reasoning_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def seal(text: str) -> str:
    return "SEALED:" + str(len(text))


def policy(show: bool) -> Policy:
    return Policy.named("deepseek_r1", show, "reasoning_content", source="upstream")


def relay_stream(show: bool, sealer: Sealer | None = None) -> tuple[bytes, list[Any]]:
    """A vLLM stream (reasoning, two calls, ``tool_calls``, usage) through ``ResponsesStream``:
    the bytes sent and the events they hold."""
    relay = ResponsesStream(policy(show), ResponseMeta("m", {}, seal=sealer))
    upstream = [
        chunk(role="assistant", content=""),
        *(chunk(reasoning=text) for text in REASONING),
        *(chunk(tool_calls=calls) for calls in STREAMED_CALLS),
        chunk(finish="tool_calls"),
        usage_chunk(len(REASONING) + len(STREAMED_CALLS)),
        Event(b"[DONE]"),
    ]
    raw = b"".join(relay.feed(event) for event in upstream) + relay.end()
    parsed = SSEParser().feed(raw)
    sent = [orjson.loads(event.data) for event in parsed]
    assert [event.event for event in parsed] == [e["type"] for e in sent]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    return raw, sent


def call_events(deltas: int) -> list[str]:
    return [
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]


def test_two_calls_stream_as_function_call_items() -> None:
    _, sent = relay_stream(show=True)
    types = [e["type"] for e in sent]
    assert types == [
        "response.created",
        "response.in_progress",
        *VISIBLE_EVENTS,
        *call_events(2),
        *call_events(2),
        "response.completed",
    ]
    calls = [(1, WEATHER, ['{"city":', '"Paris"}']), (2, TIME, ['{"tz":', '"CET"}'])]
    for index, call, pieces in calls:
        added, *deltas, done, item_done = [e for e in sent if e.get("output_index") == index]
        item_id = added["item"]["id"]
        assert item_id.startswith("fc_")
        assert added["item"] == {
            "id": item_id,
            "type": "function_call",
            "status": "in_progress",
            **call,
            "arguments": "",
        }
        assert [(d["item_id"], d["delta"]) for d in deltas] == [(item_id, p) for p in pieces]
        assert (done["item_id"], done["name"], done["arguments"]) == (
            item_id,
            call["name"],
            call["arguments"],
        )
        expected = {"id": item_id, "type": "function_call", "status": "completed", **call}
        assert item_done["item"] == expected
    final = sent[-1]["response"]
    assert final["status"] == "completed"
    output = final["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call", "function_call"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert output[1:] == [e["item"] for e in sent if e["type"] == "response.output_item.done"][1:]
    assert final["usage"]["output_tokens"] == len(REASONING) + len(STREAMED_CALLS)


@pytest.mark.parametrize(
    ("show", "sealer", "events", "announced", "item"),
    [
        pytest.param(False, None, [], None, None, id="hidden"),
        pytest.param(
            False,
            seal,
            ["response.output_item.added", "response.output_item.done"],
            SEALED,  # announced when it closes: already sealed
            SEALED,
            id="hidden-sealed",
        ),
        pytest.param(
            True,
            seal,
            VISIBLE_EVENTS,
            {"content": []},  # its part comes in content_part.added
            SHOWN | SEALED,
            id="visible-sealed",
        ),
    ],
)
def test_the_reasoning_item_per_key_and_seal(
    show: bool,
    sealer: Sealer | None,
    events: list[str],
    announced: dict[str, Any] | None,
    item: dict[str, Any] | None,
) -> None:
    raw, sent = relay_stream(show, sealer)
    first_call = next(i for i, e in enumerate(sent) if "call_id" in e.get("item", {}))
    assert [e["type"] for e in sent[2:first_call]] == events  # reasoning ends: before the call
    output = sent[-1]["response"]["output"]
    calls = [entry for entry in output if entry["type"] == "function_call"]
    assert [{k: c[k] for k in WEATHER} for c in calls] == [WEATHER, TIME]
    if item is None:
        assert output == calls
    else:
        shell = {"id": output[0]["id"], "type": "reasoning", "summary": []}
        assert output == [{**shell, **item, "status": "completed"}, *calls]
        added, done = sent[2], sent[first_call - 1]
        assert added["item"] == {**shell, **(announced or {}), "status": "in_progress"}
        assert done["item"] == output[0]
        assert added["output_index"] == done["output_index"] == 0
    if not show:
        assert b"Plotting" not in raw and b"quietly" not in raw
        assert "response.reasoning_text.delta" not in [e["type"] for e in sent]


# --- ResponsesWhole ------------------------------------------------------------------------

WHOLE_CALLS = [
    {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    },
    {
        "id": "call_b",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"tz":"CET"}'},
    },
]


@pytest.mark.parametrize(
    ("show", "sealer", "content", "kinds"),
    [
        (True, None, None, ["reasoning", "function_call", "function_call"]),
        (False, None, None, ["function_call", "function_call"]),
        (False, seal, "", ["reasoning", "function_call", "function_call"]),
        (True, None, "\n\n", ["reasoning", "function_call", "function_call"]),
        (True, None, "Calling both.", ["reasoning", "message", "function_call", "function_call"]),
    ],
    ids=["visible", "hidden", "hidden-sealed", "blank-text", "with-text"],
)
def test_a_whole_completion_with_tool_calls(
    show: bool, sealer: Sealer | None, content: str | None, kinds: list[str]
) -> None:
    body = completion(content, reasoning=THOUGHT, tool_calls=WHOLE_CALLS)
    body["choices"][0]["finish_reason"] = "tool_calls"
    done = ResponsesWhole(policy(show), ResponseMeta("m", {}, seal=sealer)).complete(body)
    assert done["status"] == "completed"
    output = done["output"]
    assert [item["type"] for item in output] == kinds
    calls = [item for item in output if item["type"] == "function_call"]
    for item, call in zip(calls, [WEATHER, TIME], strict=True):
        assert item == {"id": item["id"], "type": "function_call", "status": "completed", **call}
        assert item["id"].startswith("fc_")
    if "message" in kinds:
        assert output[1]["content"][0]["text"] == content
    if "reasoning" in kinds:
        shown, sealed = SHOWN if show else {}, SEALED if sealer else {}
        reasoning = {"id": output[0]["id"], "type": "reasoning", "summary": []}
        assert output[0] == {**reasoning, **shown, **sealed, "status": "completed"}
    if not show:
        assert b"Plotting" not in orjson.dumps(done)


def test_the_blank_line_before_a_call_opens_no_message() -> None:
    # R1 through the text splitter: "…</think>\n\n", then the calls; the "\n\n" says nothing
    relay = ResponsesStream(
        Policy.named("deepseek_r1", True, "reasoning_content"), ResponseMeta("m", {})
    )
    texts = [*REASONING, "</think>", "\n\n"]
    upstream = [
        *(chunk(content=text) for text in texts),
        *(chunk(tool_calls=calls) for calls in STREAMED_CALLS),
        chunk(finish="tool_calls"),
        Event(b"[DONE]"),
    ]
    raw = b"".join(relay.feed(event) for event in upstream) + relay.end()
    sent = [orjson.loads(event.data) for event in SSEParser().feed(raw)]
    assert not [e for e in sent if "output_text" in e["type"]]
    output = sent[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call", "function_call"]
    assert output[0]["content"][0]["text"] == THOUGHT
