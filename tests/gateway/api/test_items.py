"""Responses input items as chat messages (``gateway.api.items``), and the Responses request's
tools, formats, refusals and final build (``gateway.api.responses``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.items import (
    MAX_TOKEN_CHARS,
    Reference,
    SealedReasoning,
    chat_messages,
    references,
    resolved,
)
from gateway.api.responses import ResponsesRequest, parse_responses_request
from gateway.errors import InvalidRequest
from gateway.names.ids import item_id, new_response_id, response_of


def parse(**fields: Any) -> ResponsesRequest:
    return parse_responses_request(orjson.dumps({"model": "m", "input": "hi", **fields}))


def sent(call: ResponsesRequest) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(call.upstream_body)
    return body


def refusal(fn: Any, *args: Any, **kwargs: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        fn(*args, **kwargs)
    assert refused.value.status == 400
    return refused.value


# Items, as a client (or the Responses API itself) writes them.
def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def said(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}  # fmt: skip


def thought(text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def sealed(token: Any) -> dict[str, Any]:
    return {"type": "reasoning", "summary": [], "encrypted_content": token}


def call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": '{"x":1}'}


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": f"out {call_id}"}


# ... and the chat messages they become.
def tool_call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}


def assistant(content: str | None, *calls: str, reasoning: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [tool_call(c) for c in calls]
    if reasoning is not None:
        message["reasoning"] = reasoning
    return message


def tool(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": f"out {call_id}"}


# --- items -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "messages"),
    [
        pytest.param([thought("r"), said("a"), call("c1"), call("c2"), output("c1"), output("c2")],
                     [assistant("a", "c1", "c2", reasoning="r"), tool("c1"), tool("c2")],
                     id="reasoning-text-calls-are-one-turn"),
        pytest.param([thought("r1"), thought("r2"), said("a")],
                     [assistant("a", reasoning="r1r2")], id="reasoning-before-an-answer-joins"),
        pytest.param([thought("r1"), call("c1"), thought("r2"), said("a")],
                     [assistant(None, "c1", reasoning="r1"), assistant("a", reasoning="r2")],
                     id="reasoning-after-a-call-starts-a-turn"),
        pytest.param([thought("r1"), said("a"), thought("r2"), said("b")],
                     [assistant("a", reasoning="r1"), assistant("b", reasoning="r2")],
                     id="reasoning-after-text-starts-a-turn"),
        pytest.param([call("c1"), said("a")], [assistant(None, "c1"), assistant("a")],
                     id="text-after-a-call-starts-a-turn"),
        pytest.param([said("a"), said("b"), call("c1")], [assistant("ab", "c1")],
                     id="text-after-text-joins"),
        pytest.param([call("c1"), output("c1"), call("c2")],
                     [assistant(None, "c1"), tool("c1"), assistant(None, "c2")],
                     id="an-output-ends-the-turn"),
        pytest.param([said("a"), user("u"), said("b")],
                     [assistant("a"), {"role": "user", "content": "u"}, assistant("b")],
                     id="a-user-message-ends-the-turn"),
        pytest.param([thought("r")], [assistant("", reasoning="r")], id="reasoning-alone"),
        pytest.param([thought("r"), user("u")],
                     [assistant("", reasoning="r"), {"role": "user", "content": "u"}],
                     id="reasoning-alone-then-user"),
    ],
)  # fmt: skip
def test_assistant_turns_are_grouped_as_the_docstring_says(
    items: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> None:
    assert chat_messages(items).with_reasoning({}) == messages


def test_reasoning_is_kept_apart_by_message_index_until_placed() -> None:
    history = chat_messages([user("q"), thought("r1"), said("a"), user("q2"), thought("r2")])
    assert history.reasoning == {1: ["r1"], 3: ["r2"]}
    assert all("reasoning" not in m for m in history.messages)
    placed = history.with_reasoning({})
    assert (placed[1]["reasoning"], placed[3]["reasoning"]) == ("r1", "r2")
    assert all("reasoning" not in m for m in history.messages)  # placing copies
    assert history.sealed == []


def test_sealed_reasoning_is_kept_with_its_param_and_placed_once_opened() -> None:
    history = chat_messages([user("q"), thought("plain "), sealed("tok-1"), said("a"),
                             sealed("tok-2"), call("c1")])  # fmt: skip
    assert history.sealed == [
        SealedReasoning("tok-1", "input[2].encrypted_content"),
        SealedReasoning("tok-2", "input[4].encrypted_content"),
    ]
    placed = history.with_reasoning({"tok-1": "opened", "tok-2": "second"})
    assert placed == [{"role": "user", "content": "q"},
                      assistant("a", reasoning="plain opened"),
                      assistant(None, "c1", reasoning="second")]  # fmt: skip


def test_encrypted_content_wins_over_content_in_one_item() -> None:
    item = {**thought("visible"), "encrypted_content": "tok"}
    history = chat_messages([item])
    assert history.sealed == [SealedReasoning("tok", "input[0].encrypted_content")]
    assert history.with_reasoning({"tok": "hidden"}) == [assistant("", reasoning="hidden")]


def test_a_summary_is_the_reasoning_only_when_the_item_has_no_other() -> None:
    """thinkgate's summary is the model's trace: a client that kept only it (the AI SDK with
    ``store: false``) hands the trace back so; content or a sealed token wins over it."""
    summary = [{"type": "summary_text", "text": "s"}]
    alone = {"type": "reasoning", "summary": summary}
    assert chat_messages([alone, said("a")]).with_reasoning({}) == [assistant("a", reasoning="s")]
    with_content = {**thought("t"), "summary": summary}
    assert chat_messages([with_content, said("a")]).with_reasoning({}) == [
        assistant("a", reasoning="t")
    ]
    with_token = {**sealed("tok"), "summary": summary}
    assert chat_messages([with_token]).with_reasoning({"tok": "o"}) == [
        assistant("", reasoning="o")
    ]
    bad = {"type": "reasoning", "summary": [{"type": "summary_text", "text": 5}]}
    assert refusal(chat_messages, [bad]).param == "input[0].summary[0].text"


def test_custom_tool_calls_and_outputs_are_carried_as_the_function_that_carries_them() -> None:
    custom = {"type": "custom_tool_call", "call_id": "c1", "name": "apply", "input": 'x "y"'}
    result = {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"}
    messages = chat_messages([user("q"), custom, result]).messages
    assert messages[1:] == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "apply", "arguments": '{"input":"x \\"y\\""}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]  # fmt: skip
    arguments = messages[1]["tool_calls"][0]["function"]["arguments"]
    assert orjson.loads(arguments) == {"input": 'x "y"'}


@pytest.mark.parametrize(
    ("item", "flat"),
    [
        ({"namespace": "crm"}, "crm__f"),
        ({"namespace": "mcp__docs__"}, "mcp__docs__f"),
        ({"namespace": None}, "f"),
    ],
)
def test_a_namespaced_call_is_sent_under_its_flat_name(item: dict[str, Any], flat: str) -> None:
    (message,) = chat_messages([{**call("c1"), **item}]).messages
    assert message["tool_calls"][0]["function"]["name"] == flat


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({**call("c"), "namespace": 5}, "input[0].namespace"),
        ({"type": "custom_tool_call", "call_id": "c", "name": "a"}, "input[0].input"),
        ({"type": "custom_tool_call", "call_id": "c", "name": "a", "input": {}}, "input[0].input"),
        ({"type": "custom_tool_call", "name": "a", "input": "x"}, "input[0].call_id"),
        ({"type": "custom_tool_call_output", "call_id": "c", "output": 5}, "input[0].output"),
    ],
)  # fmt: skip
def test_a_malformed_tool_item_is_refused_naming_it(item: dict[str, Any], param: str) -> None:
    assert refusal(chat_messages, [item]).param == param


# --- item references and item ids ------------------------------------------------------------


def test_references_are_found_checked_and_replaced() -> None:
    items = [user("q"), {"type": "item_reference", "id": "msg_1"}, {"id": "rs_2"}, said("a")]
    assert references(items) == [Reference("msg_1", "input[1].id"),
                                 Reference("rs_2", "input[2].id")]  # fmt: skip
    found = {"msg_1": said("x"), "rs_2": thought("r")}
    assert resolved(items, found) == [user("q"), said("x"), thought("r"), said("a")]
    history = chat_messages(items, skip_references=True)
    assert history.with_reasoning({}) == [{"role": "user", "content": "q"}, assistant("a")]
    assert references("a string") == []


@pytest.mark.parametrize("ref", [{"type": "item_reference"}, {"type": "item_reference", "id": 5},
                                 {"type": "item_reference", "id": "x" * 257}])  # fmt: skip
def test_a_reference_without_a_usable_id_is_refused(ref: dict[str, Any]) -> None:
    assert refusal(references, [user("q"), ref]).param == "input[1].id"


def test_an_item_id_names_its_response() -> None:
    response = new_response_id()
    made = item_id("reasoning", response)
    assert made.startswith("rs_") and made != item_id("reasoning", response)
    assert response_of(made) == response
    assert item_id("custom_tool_call", response).startswith("ctc_")
    for foreign in ("msg_1", "rs_" + "g" * 40, "msg", "", "fc_" + "a" * 39):
        assert response_of(foreign) is None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"role": "user", "content": "x"}, {"role": "user", "content": "x"}),
        ({"role": "system", "content": "x"}, {"role": "system", "content": "x"}),
        ({"type": "message", "role": "developer", "content": "x"},
         {"role": "system", "content": "x"}),
        ({"role": "user", "content": [{"type": "input_text", "text": "a"},
                                      {"type": "input_text", "text": "b"}]},
         {"role": "user", "content": "ab"}),
        ({"role": "assistant", "content": [{"type": "output_text", "text": "a"},
                                           {"type": "refusal", "refusal": "no"}]},
         {"role": "assistant", "content": "ano"}),
        ({"type": "function_call_output", "call_id": "c",
          "output": [{"type": "input_text", "text": "o1"}, {"type": "output_text", "text": "o2"}]},
         {"role": "tool", "tool_call_id": "c", "content": "o1o2"}),
    ],
)  # fmt: skip
def test_messages_and_text_parts(item: dict[str, Any], message: dict[str, Any]) -> None:
    assert chat_messages([item]).messages == [message]


def test_a_string_is_one_user_message_and_where_names_the_field() -> None:
    assert chat_messages("hi").messages == [{"role": "user", "content": "hi"}]
    assert refusal(chat_messages, [user("q"), 7], where="stored").param == "stored[1]"


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ("a string", "input[1]"),
        (["a", "list"], "input[1]"),
        ({"role": "tool", "content": "x"}, "input[1].role"),
        ({"content": "x"}, "input[1].role"),
        ({"role": "user"}, "input[1].content"),
        ({"role": "user", "content": 5}, "input[1].content"),
        ({"role": "user", "content": ["x"]}, "input[1].content[0]"),
        ({"role": "user", "content": [{"type": "input_text", "text": 5}]},
         "input[1].content[0].text"),
        ({"role": "user", "content": [{"type": "input_text", "text": "a"},
                                      {"type": "input_image", "image_url": "https://x/y.png"}]},
         "input[1].content[1]"),
        ({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
         "input[1].content[0]"),
        ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
         "input[1].content[0]"),
        ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[1].call_id"),
        ({"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"},
         "input[1].call_id"),
        ({"type": "function_call", "call_id": "c", "arguments": "{}"}, "input[1].name"),
        ({"type": "function_call", "call_id": "c", "name": "f"}, "input[1].arguments"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": {"x": 1}},
         "input[1].arguments"),
        ({"type": "function_call_output", "output": "o"}, "input[1].call_id"),
        ({"type": "function_call_output", "call_id": "c", "output": 5}, "input[1].output"),
        ({"type": "function_call_output", "call_id": "c",
          "output": [{"type": "input_image", "image_url": "https://x/y.png"}]},
         "input[1].output[0]"),
        ({"type": "reasoning", "content": "text"}, "input[1].content"),
        ({"type": "reasoning", "content": [{"type": "output_text", "text": "t"}]},
         "input[1].content[0]"),
        ({"type": "reasoning", "content": [{"type": "reasoning_text", "text": None}]},
         "input[1].content[0].text"),
        ({"type": "reasoning", "summary": "s"}, "input[1].summary"),
        ({"type": "item_reference", "id": "msg_1"}, "input[1].type"),
        ({"type": "web_search_call", "id": "ws_1"}, "input[1].type"),
        ({"type": "computer_call_output", "call_id": "c"}, "input[1].type"),
    ],
)  # fmt: skip
def test_a_malformed_item_is_refused_naming_it(item: Any, param: str) -> None:
    refused = refusal(chat_messages, [user("q"), item])
    assert (refused.param, refused.code) == (param, "invalid_request")


@pytest.mark.parametrize("token", ["", 5, ["tok"], "t" * (MAX_TOKEN_CHARS + 1)])
def test_an_impossible_encrypted_content_is_invalid_encrypted_content(token: Any) -> None:
    refused = refusal(chat_messages, [user("q"), said("a"), sealed(token)])
    assert (refused.param, refused.code) == ("input[2].encrypted_content",
                                             "invalid_encrypted_content")  # fmt: skip


@pytest.mark.parametrize("items", [None, [], {"role": "user", "content": "x"}, 5])
def test_input_must_be_a_string_or_a_list_of_items(items: Any) -> None:
    assert refusal(chat_messages, items).param == "input"


@pytest.mark.parametrize(
    "item",
    [
        {"role": ["user"], "content": "x"},
        {"role": "user", "content": [{"type": ["input_text"], "text": "x"}]},
        {"type": "reasoning", "content": [{"type": {}, "text": "x"}]},
    ],
)
def test_an_unhashable_value_where_a_name_goes_is_a_400(item: dict[str, Any]) -> None:
    refusal(chat_messages, [item])


# --- text.format, include, truncation, unknown fields ---------------------------------------

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}
FUNCTION = {"type": "function", "name": "f", "description": "d", "parameters": SCHEMA,
            "strict": True}  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "response_format"),
    [
        ({"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": True},
         {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}),
        ({"type": "json_schema", "name": "n", "schema": SCHEMA},
         {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}),
        ({"type": "json_object"}, {"type": "json_object"}),
        ({"type": "text"}, None),
    ],
)  # fmt: skip
def test_text_format_becomes_response_format(fmt: dict[str, Any], response_format: Any) -> None:
    call = parse(text={"format": fmt})
    assert sent(call).get("response_format") == response_format
    assert call.echo["text"] == {"format": fmt}


@pytest.mark.parametrize("text", [None, {}, {"format": None}])
def test_no_format_is_plain_text(text: Any) -> None:
    call = parse(text=text)
    assert "response_format" not in sent(call)
    assert call.echo["text"] == {"format": {"type": "text"}}


@pytest.mark.parametrize(
    ("text", "param"),
    [
        ("json", "text.format"),
        ({"format": "json_object"}, "text.format"),
        ({"format": {"type": "yaml"}}, "text.format"),
        ({"format": {"type": "json_schema", "schema": SCHEMA}}, "text.format"),
        ({"format": {"type": "json_schema", "name": "n", "schema": "{}"}}, "text.format"),
        ({"format": {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": 1}},
         "text.format.strict"),
    ],
)  # fmt: skip
def test_a_malformed_text_format_is_refused(text: Any, param: str) -> None:
    assert refusal(parse, text=text).param == param


@pytest.mark.parametrize(
    ("include", "encrypted"),
    [(None, False), ([], False), (["reasoning.encrypted_content"], True),
     (["file_search_call.results", "web_search_call.action.sources"], False)],
)  # fmt: skip
def test_include_asks_for_sealed_reasoning(include: Any, encrypted: bool) -> None:
    call = parse(include=include)
    assert call.include_encrypted is encrypted and not call.logprobs
    assert "include" not in sent(call)


@pytest.mark.parametrize(
    ("fields", "top"),
    [({"include": ["message.output_text.logprobs"]}, None), ({"top_logprobs": 3}, 3),
     ({"include": ["message.output_text.logprobs"], "top_logprobs": 2}, 2)],
)  # fmt: skip
def test_logprobs_are_asked_of_the_engine(fields: dict[str, Any], top: int | None) -> None:
    call = parse(**fields)
    body = sent(call)
    assert call.logprobs and body["logprobs"] is True and body.get("top_logprobs") == top


@pytest.mark.parametrize(
    ("include", "param"),
    [("reasoning.encrypted_content", "include"), ([1], "include"),
     (["reasoning.encrypted_content", "file_search_call.everything"], "include")],
)  # fmt: skip
def test_include_refuses_what_the_reference_does_not_list(include: Any, param: str) -> None:
    assert refusal(parse, include=include).param == param


@pytest.mark.parametrize("top", [-1, 21, 2.5, True])
def test_top_logprobs_is_zero_to_twenty(top: Any) -> None:
    assert refusal(parse, top_logprobs=top).param == "top_logprobs"


@pytest.mark.parametrize(("truncation", "echoed"), [("disabled", "disabled"), ("auto", "auto"),
                                                   (None, "disabled")])  # fmt: skip
def test_truncation_is_kept_for_the_route_and_echoed(truncation: Any, echoed: str) -> None:
    call = parse(truncation=truncation)
    assert call.echo["truncation"] == call.truncation == echoed
    assert "truncation" not in sent(call)  # the route cuts, the engine is never asked to


def test_a_truncation_no_reference_names_is_refused() -> None:
    assert refusal(parse, truncation="middle").param == "truncation"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"n": 2}, "n"),
        ({"moderation": {"policy": "block"}}, "moderation"),
    ],
)
def test_fields_whose_loss_would_change_the_answer_are_refused(
    fields: dict[str, Any], param: str
) -> None:
    assert refusal(parse, **fields).param == param


def test_fields_no_reference_names_are_dropped_and_named_or_refused() -> None:
    call = parse(frobnicate=1, messages=[])
    assert call.unknown == ("frobnicate", "messages")
    body = sent(call)
    assert "frobnicate" not in body and body["messages"] == [{"role": "user", "content": "hi"}]
    raw = orjson.dumps({"model": "m", "input": "hi", "zeta": 1, "alpha": 2})
    with pytest.raises(InvalidRequest) as refused:
        parse_responses_request(raw, "refuse")
    assert refused.value.param == "zeta" and "Unknown parameter" in refused.value.message


def test_codex_clis_fields_are_accepted_without_effect() -> None:
    call = parse(client_metadata={"traceparent": "00-x"}, prompt_cache_key="k", n=1,
                 safety_identifier="s", service_tier="auto", max_tool_calls=3,
                 stream_options={"include_obfuscation": False}, store=False, user="u")  # fmt: skip
    body = sent(call)
    assert set(body) == {"model", "messages"} and call.unknown == ()
    assert call.echo["user"] == "u"


def test_background_false_is_accepted() -> None:
    assert sent(parse(background=False))["messages"] == [{"role": "user", "content": "hi"}]


# --- the echo and the final build -----------------------------------------------------------


@pytest.mark.parametrize(("store", "kept"), [(None, True), (True, True), (False, False)])
def test_store_defaults_to_true(store: bool | None, kept: bool) -> None:
    call = parse(store=store)
    assert (call.store, call.echo["store"]) == (kept, kept)


def test_store_must_be_a_boolean() -> None:
    assert refusal(parse, store="no").param == "store"


@pytest.mark.parametrize(
    ("reasoning", "echo", "summary"),
    [
        (None, {"effort": None, "summary": None}, False),
        ({"summary": "auto"}, {"effort": None, "summary": "auto"}, True),
        ({"effort": "low", "summary": "detailed"}, {"effort": "low", "summary": "detailed"}, True),
        ({"generate_summary": "concise"}, {"effort": None, "summary": "concise"}, True),
        ({"context": "all_turns", "mode": "pro"},
         {"effort": None, "summary": None, "context": "all_turns"}, False),
    ],
)  # fmt: skip
def test_reasoning_summary_is_asked_and_echoed_not_sent(
    reasoning: Any, echo: dict[str, Any], summary: bool
) -> None:
    call = parse(reasoning=reasoning)
    assert call.echo["reasoning"] == echo and call.summary is summary
    assert set(sent(call)) <= {"model", "messages", "reasoning_effort"}


@pytest.mark.parametrize(
    ("reasoning", "param"),
    [({"summary": "verbose"}, "reasoning.summary"),
     ({"generate_summary": "long"}, "reasoning.generate_summary"),
     ({"context": "yesterday"}, "reasoning.context"), ("high", "reasoning")],
)  # fmt: skip
def test_a_reasoning_value_the_reference_does_not_list_is_refused(
    reasoning: Any, param: str
) -> None:
    assert refusal(parse, reasoning=reasoning).param == param


@pytest.mark.parametrize(
    ("context", "rule", "kept"),
    [(None, "all", ["old", "thought"]), (None, "tool_turns", ["thought"]),
     ("auto", "tool_turns", ["thought"]), ("all_turns", "tool_turns", ["old", "thought"]),
     ("current_turn", "all", ["thought"])],
)  # fmt: skip
def test_reasoning_context_picks_the_turns_that_keep_their_reasoning(
    context: str | None, rule: str, kept: list[str]
) -> None:
    """``current_turn``: only the turns after the last user message; ``all_turns``: every
    turn; ``auto`` or none: the model's rule (``rule``)."""
    call = parse(reasoning={"context": context}, input=[user("q"), sealed("tok"), said("a")])
    built = call.build({"tok": "thought"}, "reasoning", EARLIER, turns=rule)
    assert [m["reasoning"] for m in sent(built)["messages"] if "reasoning" in m] == kept


EARLIER = [
    {"role": "user", "content": "e"},
    {"role": "assistant", "content": "x", "reasoning": "old"},
]


def sealed_call() -> ResponsesRequest:
    return parse(instructions="sys", temperature=0.5, tools=[FUNCTION],
                 input=[user("q"), sealed("tok"), said("a")])  # fmt: skip


def test_sealed_reasoning_leaves_the_body_for_build() -> None:
    call = sealed_call()
    assert call.upstream_body == b"" and call.messages == []
    assert call.history.sealed == [SealedReasoning("tok", "input[1].encrypted_content")]


@pytest.mark.parametrize(
    ("history_field", "placed"),
    [
        ("reasoning", lambda text: {"reasoning": text}),
        ("reasoning_content", lambda text: {"reasoning_content": text}),
        ("drop", lambda text: {}),
    ],
)
def test_build_places_the_opened_reasoning_per_the_history_rule(
    history_field: str, placed: Any
) -> None:
    call = sealed_call()
    built = call.build({"tok": "thought"}, history_field, EARLIER)
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "e"},
        {"role": "assistant", "content": "x", **placed("old")},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", **placed("thought")},
    ]
    body = sent(built)
    assert body["messages"] == built.messages == messages
    assert {k: v for k, v in body.items() if k != "messages"} == call.chat
    assert (body["model"], body["temperature"], len(body["tools"])) == ("m", 0.5, 1)
    assert call.upstream_body == b"" and EARLIER[1]["reasoning"] == "old"  # nothing mutated


def test_without_sealed_reasoning_the_body_is_final_at_parse() -> None:
    call = parse(instructions="sys", input=[user("q"), thought("r"), said("a")])
    assert sent(call)["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning": "r"},
    ]


def test_a_previous_response_id_leaves_the_body_for_build() -> None:
    call = parse(previous_response_id="resp_1")
    assert (call.previous_response_id, call.upstream_body) == ("resp_1", b"")
    assert call.echo["previous_response_id"] == "resp_1"
    built = call.build({}, "reasoning_content", EARLIER)
    assert sent(built)["messages"] == [
        {"role": "user", "content": "e"},
        {"role": "assistant", "content": "x", "reasoning_content": "old"},
        {"role": "user", "content": "hi"},
    ]
