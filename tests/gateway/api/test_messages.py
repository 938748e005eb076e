"""The Anthropic Messages request at the edge: what is refused (with its ``param``), and the chat
body that goes upstream, the reasoning that came back sealed placed once opened."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.messages.request import MessagesRequest, parse_messages_request
from gateway.errors import InvalidRequest

HI = {"role": "user", "content": "hi"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}
TOOL = {"name": "lookup", "description": "Look up", "input_schema": {"type": "object"}}


def body(**fields: Any) -> bytes:
    return orjson.dumps({"model": "m", "max_tokens": 64, "messages": [HI], **fields})


def parsed(**fields: Any) -> MessagesRequest:
    return parse_messages_request(body(**fields))


def sent(**fields: Any) -> dict[str, Any]:
    return orjson.loads(parsed(**fields).upstream_body)


def refused(raw: bytes) -> str | None:
    with pytest.raises(InvalidRequest) as info:
        parse_messages_request(raw)
    assert info.value.status == 400
    return info.value.param


def turns(*messages: Any) -> bytes:
    return body(messages=list(messages))


def test_a_minimal_request_is_a_minimal_chat_body() -> None:
    call = parsed()
    assert orjson.loads(call.upstream_body) == {"model": "m", "max_tokens": 64, "messages": [HI]}
    assert (call.stream, call.max_tokens, call.show_thinking, call.n) == (False, 64, False, 1)
    assert call.messages == [HI] and call.signed == []


def test_a_stream_always_asks_for_usage() -> None:
    chat = sent(stream=True)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


def test_sampling_stops_and_engine_extras_pass_through_fields_without_effect_do_not() -> None:
    call = parsed(temperature=0.5, top_p=1, top_k=3, stop_sequences=["END", "##"],
                  metadata={"user_id": "u-7"}, service_tier="auto", seed=1, min_p=0.1,
                  chat_template_kwargs={"x": 1})  # fmt: skip
    chat = orjson.loads(call.upstream_body)
    assert {k: v for k, v in chat.items() if k != "messages"} == {
        "model": "m", "max_tokens": 64, "temperature": 0.5, "top_p": 1, "top_k": 3,
        "stop": ["END", "##"], "seed": 1, "min_p": 0.1, "chat_template_kwargs": {"x": 1},
    }  # fmt: skip
    assert call.stop_sequences == ("END", "##")
    # MESSAGES: metadata and service_tier are ignored, neither sent on nor kept
    assert not {"metadata", "service_tier"} & set(call.params)


@pytest.mark.parametrize("value", [..., 0, -1, True, 1_000_001, 1.5, "8"])
def test_max_tokens_is_a_bounded_integer(value: Any) -> None:
    fields = {"model": "m", "messages": [HI]} | ({} if value is ... else {"max_tokens": value})
    assert refused(orjson.dumps(fields)) == "max_tokens"


def test_max_tokens_bounds_are_inclusive() -> None:
    assert parsed(max_tokens=1).max_tokens == 1
    assert sent(max_tokens=1_000_000)["max_tokens"] == 1_000_000


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
        ({"compaction": {"instructions": "sum up"}}, "compaction"),
        ({"thread": {"id": "t"}}, "thread"),
        ({"context_management": []}, "context_management"),
        ({"model": ""}, "model"),
        ({"stream": "yes"}, "stream"),
        ({"temperature": True}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"system": 5}, "system"),
        ({"system": [{"type": "text", "text": "a"}, {"type": "image"}]}, "system[1]"),
        ({"system": [{"type": "text"}]}, "system[0].text"),
    ],
)
def test_top_level_fields_are_refused_by_name(fields: dict[str, Any], param: str) -> None:
    assert refused(body(**fields)) == param


@pytest.mark.parametrize("raw", [b"{", b"[1]"])
def test_a_body_that_is_no_json_object_is_refused(raw: bytes) -> None:
    assert refused(raw) is None


def test_system_as_a_string_and_as_text_blocks() -> None:
    assert sent(system="Be brief.")["messages"][0] == {"role": "system", "content": "Be brief."}
    blocks = [{"type": "text", "text": "One."},
              {"type": "text", "text": "Two.", "cache_control": {"type": "ephemeral"}}]  # fmt: skip
    assert sent(system=blocks)["messages"] == [{"role": "system", "content": "One.\nTwo."}, HI]


def test_tools_become_function_tools_and_server_tools_are_dropped_or_refused_when_strict() -> None:
    tools = [TOOL, {"type": "custom", "name": "bare", "input_schema": {}}]
    assert sent(tools=tools)["tools"] == [
        {"type": "function", "function": {"name": "lookup", "description": "Look up",
                                          "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "bare", "parameters": {}}},
    ]  # fmt: skip
    server = {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}
    bash = {"type": "bash_20250124\n", "name": "bash"}
    call = parsed(tools=[TOOL, server, bash, server])
    assert [t["function"]["name"] for t in orjson.loads(call.upstream_body)["tools"]] == [
        "lookup"]  # fmt: skip
    assert call.dropped == ("web_search_20250305", "bash_20250124?")
    with pytest.raises(InvalidRequest) as strict:
        parse_messages_request(body(tools=[TOOL, server]), "refuse")
    assert strict.value.param == "tools[1].type"
    assert refused(body(tools=[TOOL, server], tool_choice={"type": "tool", "name": "web_search"})
                   ) == "tool_choice.name"  # fmt: skip
    assert refused(body(tools=[{"name": "f"}])) == "tools[0].input_schema"
    assert refused(body(tools=[{"input_schema": {}}])) == "tools[0].name"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "lookup"}, {"type": "function", "function": {"name": "lookup"}}),
    ],
)
def test_tool_choice_mapping(choice: dict[str, Any], expected: Any) -> None:
    chat = sent(tools=[TOOL], tool_choice=choice)
    assert chat["tool_choice"] == expected and "parallel_tool_calls" not in chat
    serial = sent(tools=[TOOL], tool_choice={**choice, "disable_parallel_tool_use": True})
    assert serial["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        ("auto", "tool_choice.type"),
        ({"type": "function"}, "tool_choice.type"),
        ({"type": "tool", "name": "other"}, "tool_choice.name"),
        ({"type": "tool", "name": ["lookup"]}, "tool_choice.name"),  # not a name at all
    ],
)
def test_a_bad_tool_choice_is_refused(choice: Any, param: str) -> None:
    assert refused(body(tools=[TOOL], tool_choice=choice)) == param


def test_thinking_settings() -> None:
    enabled = parsed(thinking={"type": "enabled", "budget_tokens": 63})
    assert enabled.chat["thinking_token_budget"] == 63 and enabled.show_thinking
    assert enabled.params_for_thinking == {}
    disabled = parsed(thinking={"type": "disabled"})
    assert disabled.chat["reasoning_effort"] == "none" and not disabled.show_thinking
    assert disabled.params_for_thinking == {"reasoning_effort": "none"}
    adaptive = parsed(thinking={"type": "adaptive"})
    assert adaptive.show_thinking
    assert not {"thinking_token_budget", "reasoning_effort"} & set(adaptive.chat)


@pytest.mark.parametrize(
    ("thinking", "param"),
    [
        ({"type": "enabled", "budget_tokens": 64}, "thinking.budget_tokens"),  # == max_tokens
        ({"type": "enabled"}, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": True}, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": -1}, "thinking.budget_tokens"),
        ({"type": "on"}, "thinking.type"),
        ("enabled", "thinking.type"),
    ],
)
def test_a_bad_thinking_setting_is_refused(thinking: Any, param: str) -> None:
    assert refused(body(thinking=thinking)) == param


@pytest.mark.parametrize(
    ("block", "param"),
    [
        ({"type": "text"}, "messages[0].content[0].text"),
        ({"type": "image", "source": {}}, "messages[0].content[0]"),
        ({"type": "document", "source": {}}, "messages[0].content[0]"),
        ({"type": "tool_result", "content": "x"}, "messages[0].content[0].tool_use_id"),
        ({"type": "thinking", "thinking": "t", "signature": "s"}, "messages[0].content[0].type"),
        ({"type": "video"}, "messages[0].content[0].type"),
        ("text", "messages[0].content[0].type"),
    ],
)
def test_malformed_user_blocks(block: Any, param: str) -> None:
    assert refused(turns({"role": "user", "content": [block]})) == param


@pytest.mark.parametrize(
    ("block", "param"),
    [
        ({"type": "text", "text": 1}, "messages[1].content[0].text"),
        ({**CALL, "id": ""}, "messages[1].content[0]"),
        ({"type": "tool_use", "id": "toolu_1", "input": {}}, "messages[1].content[0]"),
        ({**CALL, "input": "{}"}, "messages[1].content[0].input"),
        ({"type": "thinking", "thinking": "t"}, "messages[1].content[0].signature"),
        ({"type": "thinking", "signature": "s"}, "messages[1].content[0].signature"),
        ({"type": "redacted_thinking"}, "messages[1].content[0].data"),
        ({"type": "image", "source": {}}, "messages[1].content[0].type"),
        ({"type": "tool_result", "tool_use_id": "t"}, "messages[1].content[0].type"),
    ],
)
def test_malformed_assistant_blocks(block: Any, param: str) -> None:
    assert refused(turns(HI, {"role": "assistant", "content": [block]})) == param


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ([{"role": "system", "content": "x"}], "messages"),
        ([{"role": "developer", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        (
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}],
            "messages[0].content",
        ),
        (
            [
                HI,
                {"role": "assistant", "content": [CALL]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "x"}],
                },
            ],
            "messages[2].content",
        ),
        (
            [
                HI,
                {"role": "assistant", "content": "no call"},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
            ],
            "messages[2].content",
        ),
    ],
)
def test_bad_turns_and_results_that_answer_no_call(messages: Any, param: str) -> None:
    assert refused(body(messages=messages)) == param


def test_a_tool_loop_becomes_tool_calls_then_tool_messages_before_the_text() -> None:
    results = [
        {"type": "text", "text": "Thanks."},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
         "content": [{"type": "text", "text": "boom"}, {"type": "text", "text": "again"}]},
        {"type": "text", "text": "Go on."},
    ]  # fmt: skip
    second = {**CALL, "id": "toolu_2", "input": {}}
    assistant = {"role": "assistant", "content": [{"type": "text", "text": "Let "},
                 {"type": "text", "text": "me look."}, CALL, second]}  # fmt: skip
    chat = orjson.loads(parse_messages_request(turns(HI, assistant,
                        {"role": "user", "content": results})).upstream_body)  # fmt: skip
    assert chat["messages"][1:] == [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "lookup", "arguments": '{"q":"x"}'}},
            {"id": "toolu_2", "type": "function",
             "function": {"name": "lookup", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "[tool error] boom\nagain"},
        {"role": "user", "content": "Thanks.\nGo on."},
    ]  # fmt: skip
    only_calls = orjson.loads(parse_messages_request(
        turns(HI, {"role": "assistant", "content": [CALL]})).upstream_body)  # fmt: skip
    assert only_calls["messages"][1]["content"] is None


SEALED = [
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "first thought", "signature": "S1"},
        {"type": "redacted_thinking", "data": "R1"},
        {"type": "text", "text": "a1"}]},
    {"role": "user", "content": "q2"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "second", "signature": "S2"}, CALL]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
]  # fmt: skip
OPENED = {"S1": "first thought", "R1": " hidden", "S2": "second"}


def test_sealed_reasoning_waits_for_build_and_names_its_fields() -> None:
    call = parse_messages_request(body(system="sys", messages=SEALED))
    assert call.upstream_body == b"" and call.messages == []
    assert [(s.token, s.param) for s in call.history.sealed] == [
        ("S1", "messages[1].content[0].signature"),
        ("R1", "messages[1].content[1].data"),
        ("S2", "messages[3].content[0].signature"),
    ]
    assert [(s.token, s.param, text) for s, text in call.signed] == [
        ("S1", "messages[1].content[0].signature", "first thought"),
        ("S2", "messages[3].content[0].signature", "second"),
    ]


@pytest.mark.parametrize(
    ("field", "rule", "first", "last"),
    [
        ("reasoning_content", "all", {"reasoning_content": "first thought hidden"},
         {"reasoning_content": "second"}),
        ("reasoning", "tool_turns", {}, {"reasoning": "second"}),
        ("drop", "all", {}, {}),
    ],
)  # fmt: skip
def test_build_places_the_opened_reasoning_per_the_history_rule(
    field: str, rule: str, first: dict[str, str], last: dict[str, str]
) -> None:
    call = parse_messages_request(body(system="sys", messages=SEALED)).build(OPENED, field, rule)
    chat = orjson.loads(call.upstream_body)
    assert chat["messages"] == call.messages and chat["max_tokens"] == 64
    assert [m["role"] for m in call.messages] == [
        "system", "user", "assistant", "user", "assistant", "tool"]  # fmt: skip
    assert call.messages[2] == {"role": "assistant", "content": "a1", **first}
    assert call.messages[4] == {"role": "assistant", "content": None, **last,
                                "tool_calls": call.messages[4]["tool_calls"]}  # fmt: skip
    assert call.messages[5] == {"role": "tool", "tool_call_id": "toolu_1", "content": ""}
