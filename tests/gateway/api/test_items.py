"""Responses input items as chat messages (``gateway.api.items``), and the Responses request's
tools, formats, refusals and final build (``gateway.api.responses``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.items import MAX_TOKEN_CHARS, SealedReasoning, chat_messages
from gateway.api.responses import ResponsesRequest, parse_responses_request
from gateway.errors import InvalidRequest


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


def test_a_summary_is_accepted_and_not_sent() -> None:
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}
    assert chat_messages([item, said("a")]).with_reasoning({}) == [assistant("a")]


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


# --- the Responses request: tools ------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}
FUNCTION = {"type": "function", "name": "f", "description": "d", "parameters": SCHEMA,
            "strict": True}  # fmt: skip


def test_function_tools_become_chat_tools_and_are_echoed_as_given() -> None:
    tools = [FUNCTION, {"type": "function", "name": "g"}]
    call = parse(tools=tools)
    assert sent(call)["tools"] == [
        {"type": "function",
         "function": {"name": "f", "description": "d", "parameters": SCHEMA, "strict": True}},
        {"type": "function", "function": {"name": "g"}},
    ]  # fmt: skip
    assert call.echo["tools"] == tools
    assert (call.echo["tool_choice"], call.echo["parallel_tool_calls"]) == ("auto", True)
    assert "tool_choice" not in sent(call) and "parallel_tool_calls" not in sent(call)


def test_no_tools_no_tool_fields() -> None:
    call = parse()
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(sent(call))
    assert call.echo["tools"] == []


@pytest.mark.parametrize(
    "kind",
    ["web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
     "image_generation", "mcp", "local_shell", "shell", "custom", "apply_patch"],
)  # fmt: skip
def test_built_in_tools_are_refused_naming_the_tool(kind: str) -> None:
    refused = refusal(parse, tools=[FUNCTION, {"type": kind}])
    assert refused.param == "tools[1].type" and f"'{kind}'" in refused.message


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"type": "function", "name": "f"}, "tools"),
        (["f"], "tools[0].type"),
        ([{"name": "f"}], "tools[0].type"),
        ([FUNCTION, {"type": "plugin", "name": "g"}], "tools[1].type"),
        ([{"type": "function"}], "tools[0].name"),
        ([{"type": "function", "name": ""}], "tools[0].name"),
        ([{"type": "function", "name": "f", "strict": "yes"}], "tools[0].strict"),
    ],
)
def test_malformed_tools_are_refused(tools: Any, param: str) -> None:
    assert refusal(parse, tools=tools).param == param


@pytest.mark.parametrize(
    ("choice", "chat"),
    [
        ("none", "none"),
        ("auto", "auto"),
        ("required", "required"),
        ({"type": "function", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice_is_mapped_to_chat_and_echoed(choice: Any, chat: Any) -> None:
    call = parse(tools=[FUNCTION], tool_choice=choice)
    assert (sent(call)["tool_choice"], call.echo["tool_choice"]) == (chat, choice)


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (None, "required", "tool_choice"),
        ([FUNCTION], {"type": "function", "name": "g"}, "tool_choice.name"),
        ([FUNCTION], {"type": "function"}, "tool_choice.name"),
        (None, {"type": "function", "name": "f"}, "tool_choice.name"),
        ([FUNCTION], "any", "tool_choice"),
        ([FUNCTION], {"type": "allowed_tools", "tools": [{"type": "function", "name": "f"}]},
         "tool_choice"),
        ([FUNCTION], {"type": "web_search"}, "tool_choice"),
        ([FUNCTION], 1, "tool_choice"),
    ],
)  # fmt: skip
def test_a_tool_choice_that_cannot_be_honoured_is_refused(
    tools: Any, choice: Any, param: str
) -> None:
    assert refusal(parse, tools=tools, tool_choice=choice).param == param


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [{"type": ["function"], "name": "f"}]},
        {"tools": [FUNCTION], "tool_choice": {"type": "function", "name": ["f"]}},
    ],
)
def test_an_unhashable_tool_type_or_name_is_a_400(fields: dict[str, Any]) -> None:
    refusal(parse, **fields)


@pytest.mark.parametrize("value", [True, False])
def test_parallel_tool_calls_passes_through_and_is_echoed(value: bool) -> None:
    call = parse(tools=[FUNCTION], parallel_tool_calls=value)
    assert (sent(call)["parallel_tool_calls"], call.echo["parallel_tool_calls"]) == (value, value)


def test_parallel_tool_calls_must_be_a_boolean() -> None:
    assert refusal(parse, parallel_tool_calls="no").param == "parallel_tool_calls"


# --- text.format, include, truncation, unknown fields ---------------------------------------


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
    ("include", "encrypted"), [(None, False), ([], False), (["reasoning.encrypted_content"], True)]
)
def test_include_asks_for_sealed_reasoning(include: Any, encrypted: bool) -> None:
    assert parse(include=include).include_encrypted is encrypted


@pytest.mark.parametrize(
    "include",
    ["reasoning.encrypted_content", [1], ["message.output_text.logprobs"],
     ["reasoning.encrypted_content", "file_search_call.results"]],
)  # fmt: skip
def test_include_refuses_anything_else(include: Any) -> None:
    assert refusal(parse, include=include).param == "include"


def test_truncation_disabled_is_the_only_one() -> None:
    assert parse(truncation="disabled").echo["truncation"] == "disabled"
    assert parse().echo["truncation"] == "disabled"
    assert refusal(parse, truncation="auto").param == "truncation"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"zeta": 1, "alpha": 2}, "alpha"),
        ({"messages": []}, "messages"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ],
)
def test_unknown_and_unsupported_fields_are_refused(fields: dict[str, Any], param: str) -> None:
    assert refusal(parse, **fields).param == param


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
    ("reasoning", "echo"),
    [
        (None, {"effort": None, "summary": None}),
        ({"summary": "auto"}, {"effort": None, "summary": "auto"}),
        ({"effort": "low", "summary": "detailed"}, {"effort": "low", "summary": "detailed"}),
    ],
)
def test_reasoning_summary_is_echoed_not_sent(reasoning: Any, echo: dict[str, Any]) -> None:
    call = parse(reasoning=reasoning)
    assert call.echo["reasoning"] == echo
    assert "summary" not in orjson.dumps(sent(call)).decode()


def test_an_unknown_reasoning_summary_is_refused() -> None:
    assert refusal(parse, reasoning={"summary": "verbose"}).param == "reasoning.summary"


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
