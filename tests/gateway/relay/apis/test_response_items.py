"""Responses output items beyond plain text (``gateway.relay.apis.response_items``, driven by
``gateway.relay.apis.responses``): reasoning summaries, custom tool calls, namespaced function calls
and output_text logprobs, streamed and whole. Every stream is also accumulated by a client as
strict as openai-node's ``responses.stream()``, which must build the output the response
completes with."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import orjson
import pytest

from gateway.names.tools import ClientTool, ToolMap
from gateway.relay.apis.response_items import answer_logprobs, logprobs_of
from gateway.relay.apis.responses import ResponseMeta, ResponsesStream, ResponsesWhole
from gateway.relay.rewrite import Policy
from gateway.relay.sse import Event, SSEParser
from tests.gateway.relay.test_responses_tools import more, opening
from tests.gateway.relay.test_rewrite import chunk, completion, usage_chunk

R1 = ["Let", " me", " think", ".\n", "</think>", "\n\nBlue", "."]
THOUGHT = "Let me think.\n"
TOOLS = ToolMap(MappingProxyType({
    "apply": ClientTool("apply", None, "custom"),
    "crm__lookup": ClientTool("lookup", "crm"),
    "crm__note": ClientTool("note", "crm", "custom"),
}))  # fmt: skip


def seal(text: str) -> str:
    return f"SEALED:{len(text)}"


def meta(**fields: Any) -> ResponseMeta:
    return ResponseMeta("m", {}, tools=TOOLS, **fields)


def run(relay: ResponsesStream, upstream: list[Event]) -> tuple[bytes, list[dict[str, Any]]]:
    raw = b"".join(relay.feed(e) for e in [*upstream, Event(b"[DONE]")]) + relay.end()
    sent = [orjson.loads(e.data) for e in SSEParser().feed(raw)]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    return raw, sent


def r1_stream(show: bool, **fields: Any) -> tuple[bytes, list[dict[str, Any]]]:
    relay = ResponsesStream(Policy.named("deepseek_r1", show, "reasoning_content"), meta(**fields))
    last = len(R1) - 1
    upstream = [chunk(content=t, finish="stop" if i == last else None) for i, t in enumerate(R1)]
    return run(relay, [*upstream, usage_chunk(len(R1))])


def calls_stream(calls: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    relay = ResponsesStream(Policy.named("deepseek_r1", True, "reasoning_content",
                                         source="upstream"), meta())  # fmt: skip
    upstream = [chunk(tool_calls=pieces) for pieces in calls]
    return run(relay, [*upstream, chunk(finish="tool_calls")])[1]


def _append(item: dict[str, Any], key: str, index: int, part: dict[str, Any]) -> None:
    assert index == len(item[key])
    item[key].append(orjson.loads(orjson.dumps(part)))  # a copy: deltas must not touch events


def _grow(item: dict[str, Any], event: dict[str, Any]) -> None:
    kind, delta = event["type"], event.get("delta")
    if kind in ("response.output_text.delta", "response.reasoning_text.delta"):
        item["content"][event["content_index"]]["text"] += delta
    elif kind == "response.reasoning_summary_text.delta":
        item["summary"][event["summary_index"]]["text"] += delta
    elif kind == "response.custom_tool_call_input.delta":
        item["input"] += delta
    elif kind == "response.function_call_arguments.delta":
        item["arguments"] += delta


def accumulate(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output as openai-node's ``responses.stream()`` builds it, as strictly: an item is
    appended at its announced index; a part, or a summary part, only at the next index of its
    list; a delta only to an item (of the event's ``item_id``) and a part that exist;
    ``output_item.done`` replaces the item it names."""
    output: list[dict[str, Any]] = []
    for event in events:
        kind, index = event["type"], event.get("output_index")
        if kind == "response.output_item.added":
            _append({"output": output}, "output", event["output_index"], event["item"])
        elif index is not None:
            item = output[index]
            assert event.get("item_id", item["id"]) == item["id"]
            if kind == "response.output_item.done":
                assert (event["item"]["type"], event["item"]["id"]) == (item["type"], item["id"])
                output[index] = event["item"]
            elif kind == "response.content_part.added":
                _append(item, "content", event["content_index"], event["part"])
            elif kind == "response.reasoning_summary_part.added":
                _append(item, "summary", event["summary_index"], event["part"])
            else:
                _grow(item, event)
    return output


def completed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    final = events[-1]
    assert final["type"] == "response.completed"
    output: list[dict[str, Any]] = final["response"]["output"]
    assert accumulate(events) == output
    return output


# --- reasoning summaries -----------------------------------------------------------------------

SUMMARY_EVENTS = [
    "response.output_item.added",
    "response.reasoning_summary_part.added",
    *["response.reasoning_summary_text.delta"] * 4,
    "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.done",
    "response.output_item.done",
]


def test_a_summary_streams_the_trace_as_summary_text_once() -> None:
    _, sent = r1_stream(True, summary=True)
    types = [e["type"] for e in sent]
    assert types[2 : 2 + len(SUMMARY_EVENTS)] == SUMMARY_EVENTS
    assert not [t for t in types if "reasoning_text" in t]  # the text goes out once
    deltas = [e for e in sent if e["type"] == "response.reasoning_summary_text.delta"]
    assert "".join(e["delta"] for e in deltas) == THOUGHT
    assert {(e["summary_index"], e["output_index"]) for e in deltas} == {(0, 0)}
    added = sent[2]["item"]
    assert added["summary"] == [] and "content" not in added  # no part is added to content
    part_done = sent[2 + len(SUMMARY_EVENTS) - 2]
    assert part_done["part"] == {"type": "summary_text", "text": THOUGHT}
    reasoning, message = completed(sent)
    assert reasoning["summary"] == [{"type": "summary_text", "text": THOUGHT}]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert message["content"][0]["text"] == "\n\nBlue."


@pytest.mark.parametrize("sealer", [None, seal], ids=["hidden", "hidden-sealed"])
def test_a_hidden_key_gets_no_summary(sealer: Any) -> None:
    raw, sent = r1_stream(False, summary=True, seal=sealer)
    assert b"think" not in raw and b"summary_text" not in raw
    output = completed(sent)
    if sealer is None:
        assert [i["type"] for i in output] == ["message"]
    else:
        assert output[0]["summary"] == [] and output[0]["encrypted_content"] == seal(THOUGHT)
        assert "content" not in output[0]


def test_without_a_summary_the_trace_streams_as_reasoning_text() -> None:
    _, sent = r1_stream(True)
    assert not [e for e in sent if "summary" in e["type"]]
    reasoning, _ = completed(sent)
    assert reasoning["summary"] == []


@pytest.mark.parametrize(("show", "summary"), [(True, True), (True, False), (False, True)])
def test_a_whole_responses_reasoning_item(show: bool, summary: bool) -> None:
    whole = ResponsesWhole(Policy.named("deepseek_r1", show, "reasoning_content"),
                           meta(summary=summary, seal=seal))  # fmt: skip
    done = whole.complete(completion("Let me think.\n</think>\n\nBlue."))
    item = done["output"][0]
    assert item["encrypted_content"] == seal(THOUGHT)
    expected = [{"type": "summary_text", "text": THOUGHT}] if show and summary else []
    assert item["summary"] == expected
    assert ("content" in item) is show
    if not show:
        assert b"think" not in orjson.dumps(done)


# --- custom tool calls and namespaces ----------------------------------------------------------

CUSTOM_PIECES = [
    [opening(0, "call_a", "apply")],
    [more(0, '{"input": "*** Begin')],
    [more(0, ' Patch\\n+x = \\"')],
    [more(0, '1\\""}')],
]
PATCH = '*** Begin Patch\n+x = "1"'


def test_a_custom_tool_call_streams_its_input() -> None:
    sent = calls_stream(CUSTOM_PIECES)
    events = sent[2:-1]
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        *["response.custom_tool_call_input.delta"] * 3,
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]
    item_id = events[0]["item"]["id"]
    assert item_id.startswith("ctc_")
    assert events[0]["item"] == {"id": item_id, "type": "custom_tool_call", "call_id": "call_a",
                                 "name": "apply", "input": ""}  # fmt: skip
    assert "".join(e["delta"] for e in events[1:4]) == events[4]["input"] == PATCH
    (item,) = completed(sent)
    assert item == {**events[0]["item"], "input": PATCH}


def test_a_namespaced_call_carries_its_name_and_namespace() -> None:
    sent = calls_stream([
        [opening(0, "call_a", "crm__lookup", '{"id":')], [more(0, " 7}")],
        [opening(1, "call_b", "crm__note", '{"input":"hi"}')],
        [opening(2, "call_c", "unknown_tool", "{}")],
    ])  # fmt: skip
    lookup, note, unknown = completed(sent)
    assert (lookup["type"], lookup["name"], lookup["namespace"]) == ("function_call", "lookup",
                                                                     "crm")  # fmt: skip
    assert lookup["arguments"] == '{"id": 7}'
    assert (note["type"], note["name"], note["namespace"], note["input"]) == (
        "custom_tool_call", "note", "crm", "hi")  # fmt: skip
    assert unknown["name"] == "unknown_tool" and "namespace" not in unknown
    done = [e for e in sent if e["type"] == "response.function_call_arguments.done"]
    assert [e["name"] for e in done] == ["lookup", "unknown_tool"]


def test_whole_calls_are_named_as_the_client_named_them() -> None:
    calls = [{"id": "call_a", "type": "function",
              "function": {"name": "apply", "arguments": '{"input": "p\\u00e9"}'}},
             {"id": "call_b", "type": "function",
              "function": {"name": "crm__lookup", "arguments": "{}"}}]  # fmt: skip
    body = completion(None, tool_calls=calls)
    whole = ResponsesWhole(Policy.named("deepseek_r1", True, "reasoning_content",
                                        source="upstream"), meta())  # fmt: skip
    custom, lookup = whole.complete(body)["output"]
    assert custom == {"id": custom["id"], "type": "custom_tool_call", "call_id": "call_a",
                      "name": "apply", "input": "pé"}  # fmt: skip
    assert (lookup["name"], lookup["namespace"], lookup["status"]) == ("lookup", "crm",
                                                                       "completed")  # fmt: skip


# --- logprobs ----------------------------------------------------------------------------------


def lp(token: str) -> dict[str, Any]:
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}


def with_logprobs(content: str | None = None, finish: str | None = None,
                  **delta: Any) -> Event:  # fmt: skip
    text = content if content is not None else next(iter(delta.values()))
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "logprobs": {"content": [lp(text)]},
              "finish_reason": finish}  # fmt: skip
    return Event(orjson.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice]}))


@pytest.mark.parametrize("asked", [True, False])
def test_a_stream_gives_the_logprobs_of_answer_text_only(asked: bool) -> None:
    relay = ResponsesStream(Policy.named("deepseek_r1", False, "reasoning_content",
                                         source="upstream"), meta(logprobs=asked))  # fmt: skip
    upstream = [
        with_logprobs(reasoning="secret"),
        with_logprobs(reasoning=" plan"),
        with_logprobs("\n\n"),
        with_logprobs("Blue"),
        with_logprobs(".", finish="stop"),
    ]
    raw, sent = run(relay, upstream)
    assert b"secret" not in raw and b"plan" not in raw
    deltas = [e for e in sent if e["type"] == "response.output_text.delta"]
    (message,) = completed(sent)
    if not asked:
        assert all(e["logprobs"] == [] for e in deltas) and message["content"][0]["logprobs"] == []
        return
    assert [[p["token"] for p in e["logprobs"]] for e in deltas] == [["\n\n", "Blue"], ["."]]
    assert [p["token"] for p in message["content"][0]["logprobs"]] == ["\n\n", "Blue", "."]


def test_a_whole_answer_gets_the_logprobs_that_spell_it() -> None:
    body = completion("think</think>\n\nBlue.")
    body["choices"][0]["logprobs"] = {
        "content": [lp(t) for t in ["think", "</think>", "\n\n", "Blue", "."]]
    }
    whole = ResponsesWhole(Policy.named("deepseek_r1", False, "reasoning_content"),
                           meta(logprobs=True))  # fmt: skip
    done = whole.complete(body)
    (message,) = done["output"]
    assert [p["token"] for p in message["content"][0]["logprobs"]] == ["\n\n", "Blue", "."]
    assert b"think" not in orjson.dumps(done)


@pytest.mark.parametrize(
    ("tokens", "answer", "spelled"),
    [
        (["r", "</think>", "A", "B"], "AB", ["A", "B"]),
        (["r", "xA", "B"], "AB", []),  # a token across the boundary: none rather than wrong
        (["A"], "", []),
        ([], "A", []),
    ],
)
def test_answer_logprobs(tokens: list[str], answer: str, spelled: list[str]) -> None:
    entries = [lp(t) for t in tokens]
    assert [e["token"] for e in answer_logprobs(entries, answer)] == spelled


@pytest.mark.parametrize("malformed", [None, [], {"content": None}, {"content": ["x"]}])
def test_malformed_logprobs_are_none(malformed: Any) -> None:
    assert logprobs_of(malformed) == []
