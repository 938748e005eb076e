"""The chat stream as Responses events, and a whole chat completion as a response object."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.relay.apis.responses import ResponseMeta, ResponsesStream, ResponsesWhole
from gateway.relay.rewrite import Policy
from gateway.relay.sse import Event, SSEParser
from tests.gateway.relay.test_rewrite import chunk, completion, usage_chunk

R1 = ["Let", " me", " think", ".\n", "</think>", "\n\nBlue", "."]


def stream(show: bool) -> ResponsesStream:
    return ResponsesStream(Policy.named("deepseek_r1", show, "reasoning_content"),
                           ResponseMeta("m", {"metadata": {"k": "v"}}))  # fmt: skip


def events_of(relay: ResponsesStream, tokens: list[str], finish: str = "stop") -> list[Any]:
    last = len(tokens) - 1
    events = [chunk(role="assistant", content="")]
    events += [chunk(content=t, finish=finish if i == last else None) for i, t in enumerate(tokens)]
    raw = b"".join(relay.feed(e) for e in [*events, usage_chunk(len(tokens)), Event(b"[DONE]")])
    raw += relay.end()
    return [orjson.loads(e.data) for e in SSEParser().feed(raw)]


@pytest.mark.parametrize("show", [True, False], ids=["visible", "hidden"])
def test_the_event_sequence_of_a_stream(show: bool) -> None:
    sent = events_of(stream(show), R1)
    types = [e["type"] for e in sent]
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert types[:2] == ["response.created", "response.in_progress"]
    items = ["reasoning", "message"] if show else ["message"]
    expected: list[str] = []
    for kind in items:
        text = "reasoning_text" if kind == "reasoning" else "output_text"
        expected += ["response.output_item.added", "response.content_part.added"]
        expected += [f"response.{text}.delta"] * (4 if kind == "reasoning" else 2)
        expected += [f"response.{text}.done", "response.content_part.done",
                     "response.output_item.done"]  # fmt: skip
    assert types[2:-1] == expected
    final = sent[-1]
    assert final["type"] == "response.completed"
    output = final["response"]["output"]
    assert [item["type"] for item in output] == items
    assert output[-1]["content"][0]["text"] == "\n\nBlue."
    if show:
        assert output[0]["content"] == [{"type": "reasoning_text", "text": "Let me think.\n"}]
    else:
        assert b"think" not in orjson.dumps(sent)
    usage = final["response"]["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == 5  # one token per delta
    assert final["response"]["metadata"] == {"k": "v"}


def test_a_stream_cut_at_the_limit_is_incomplete() -> None:
    sent = events_of(stream(False), ["a", "</think>", "b"], finish="length")
    assert sent[-1]["type"] == "response.incomplete"
    assert sent[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_failed_stream_is_one_error_event_then_response_failed() -> None:
    relay = stream(True)
    raw = relay.feed(chunk(content="r"))
    error = {"error": {"message": "dropped", "type": "upstream_error", "param": None,
                       "code": "upstream_protocol_error"}}  # fmt: skip
    raw += relay.error_event(orjson.dumps(error)) + relay.end()
    sent = [orjson.loads(e.data) for e in SSEParser().feed(raw)]
    assert [e["type"] for e in sent][-2:] == ["error", "response.failed"]
    assert sent[-1]["response"]["error"]["code"] == "upstream_protocol_error"
    assert sent[-1]["response"]["status"] == "failed"
    (cut,) = sent[-1]["response"]["output"]
    assert cut["status"] == "incomplete" and cut["content"][0]["text"] == "r"


@pytest.mark.parametrize("show", [True, False], ids=["visible", "hidden"])
def test_a_whole_response_object(show: bool) -> None:
    whole = ResponsesWhole(Policy.named("deepseek_r1", show, "reasoning_content"),
                           ResponseMeta("m", {}))  # fmt: skip
    done = whole.complete(completion("r1 reasoning\n</think>\n\nAnswer"))
    assert done["object"] == "response" and done["status"] == "completed"
    kinds = [item["type"] for item in done["output"]]
    assert kinds == (["reasoning", "message"] if show else ["message"])
    assert done["output"][-1]["content"][0]["text"] == "\n\nAnswer"
    assert done["usage"]["output_tokens"] == 10
    assert done["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def accumulate(events: list[Any]) -> list[dict[str, Any]]:
    """The output as a client that accumulates events builds it (openai-node's and
    openai-python's ``responses.stream()``): an added item as it is announced, each added part
    appended to its content, each delta appended to the part it names."""
    output: dict[int, dict[str, Any]] = {}
    for event in events:
        kind, index = event["type"], event.get("output_index")
        if kind == "response.output_item.added":
            output[index] = orjson.loads(orjson.dumps(event["item"]))
        elif kind == "response.content_part.added":
            output[index]["content"].append(dict(event["part"]))
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            output[index]["content"][event["content_index"]]["text"] += event["delta"]
    return [output[i] for i in sorted(output)]


@pytest.mark.parametrize("show", [True, False], ids=["visible", "hidden"])
def test_an_accumulating_client_builds_the_output_the_response_completes_with(
    show: bool,
) -> None:
    """An item is announced with ``content: []`` and each part added once, by its own event
    (announcing the part inside the item too gave clients two parts, or none at the index
    a delta named: openai-node's "missing content at index 0")."""
    sent = events_of(stream(show), R1)
    added = [e["item"] for e in sent if e["type"] == "response.output_item.added"]
    assert all(item.get("content", []) == [] for item in added)
    built = accumulate(sent)
    final = sent[-1]["response"]["output"]
    assert [i["content"] for i in built] == [i["content"] for i in final]


def test_the_engines_cached_tokens_are_the_responses_cached_input() -> None:
    from gateway.relay.apis.responses import responses_usage

    usage = {"prompt_tokens": 405, "completion_tokens": 5, "total_tokens": 410,
             "prompt_tokens_details": {"cached_tokens": 384}}  # fmt: skip
    found = responses_usage(usage)
    assert found is not None
    assert found["input_tokens"] == 405
    assert found["input_tokens_details"] == {"cached_tokens": 384, "cache_write_tokens": 0}
    assert responses_usage({"prompt_tokens": 3})["input_tokens_details"]["cached_tokens"] == 0  # type: ignore[index]
