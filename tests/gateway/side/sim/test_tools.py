"""The simulator's tool calls (vLLM with ``--enable-auto-tool-choice``): which requests call,
with which arguments, and how the call travels, streamed and whole; an agent loop (question →
call, result → answer) through the sans-I/O request parser."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.side.sim.config import SimConfig
from gateway.side.sim.request import SimRequest, parse_chat_request
from gateway.side.sim.script import build_script, compose
from gateway.side.sim.turn import ToolResult
from tests.gateway.side.sim.clients import (
    PROMPT,
    chat,
    choices,
    deltas,
    in_process,
    question,
    stream_chunks,
    tag_seed,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {}},
    "required": ["city", "days"],
}
TIME = {"properties": {"tz": {"type": "string"}}, "required": ["tz"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
WEATHER_ARGS = {"city": "sim", "days": 1}
NAMED = {"type": "function", "function": {"name": "get_time"}}
WEATHER_QUESTION = "What is the weather in Paris?"  # the get_weather tool fits it
ASKED = [{"role": "user", "content": WEATHER_QUESTION}]
CALL = {
    "id": "chatcmpl-tool-1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'},
}
RESULT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "sunny"},
]
# (extra request fields, the function called, its arguments)
CALLS = [
    pytest.param({}, "get_weather", WEATHER_ARGS, id="default-auto"),
    pytest.param({"tool_choice": "auto"}, "get_weather", WEATHER_ARGS, id="auto"),
    pytest.param({"tool_choice": "required"}, "get_weather", WEATHER_ARGS, id="required"),
    pytest.param(
        {"tool_choice": "required", "messages": [{"role": "user", "content": "What time?"}]},
        "get_time",
        {"tz": "sim"},
        id="required-fitting",
    ),
    pytest.param(
        {"tool_choice": "required", "messages": [{"role": "user", "content": PROMPT}]},
        "get_weather",
        WEATHER_ARGS,
        id="required-nothing-fits-the-first",
    ),
    pytest.param({"tool_choice": NAMED}, "get_time", {"tz": "sim"}, id="named"),
    pytest.param(
        {"tool_choice": "required", "messages": RESULT},
        "get_weather",
        WEATHER_ARGS,
        id="required-after-result",
    ),
]


def ask(model: str = "deepseek-v3", **extra: Any) -> dict[str, Any]:
    """A chat body with ``TOOLS`` whose question the weather tool fits."""
    return chat(model, tools=TOOLS, **{"messages": ASKED, **extra})


def tool_chunks(chunks: list[Any]) -> list[Any]:
    """Each streamed ``tool_calls`` delta of choice 0, in order."""
    return [c["delta"]["tool_calls"] for c in choices(chunks) if "tool_calls" in c["delta"]]


def arguments(chunks: list[Any]) -> str:
    return "".join(calls[0]["function"]["arguments"] for calls in tool_chunks(chunks))


async def post(body: dict[str, Any]) -> Any:
    async with in_process() as (client, _):
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def stream(body: dict[str, Any]) -> list[Any]:
    async with in_process() as (client, _):
        return await stream_chunks(client, {**body, "stream": True})


@pytest.mark.parametrize(("extra", "name", "expected"), CALLS)
async def test_a_streamed_call_names_the_function_once_then_sends_arguments(
    extra: dict[str, Any], name: str, expected: dict[str, Any]
) -> None:
    chunks = await stream(ask(**extra))
    (opening,), *rest = tool_chunks(chunks)
    assert opening["id"].startswith("chatcmpl-tool-")
    assert (opening["type"], opening["index"], opening["function"]["name"]) == ("function", 0, name)
    assert rest, "the arguments come in several pieces"
    for calls in rest:
        assert calls == [{"index": 0, "function": {"arguments": calls[0]["function"]["arguments"]}}]
    assert orjson.loads(arguments(chunks)) == expected
    finishes = [c["finish_reason"] for c in choices(chunks) if c["finish_reason"]]
    assert finishes == ["tool_calls"]
    assert deltas(chunks) == ""  # nothing but the call: no answer text


@pytest.mark.parametrize(("extra", "name", "expected"), CALLS)
async def test_a_whole_response_carries_the_call_in_the_message(
    extra: dict[str, Any], name: str, expected: dict[str, Any]
) -> None:
    (choice,) = (await post(ask(**extra)))["choices"]
    message = choice["message"]
    (call,) = message["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-")
    assert (call["type"], call["function"]["name"]) == ("function", name)
    assert orjson.loads(call["function"]["arguments"]) == expected
    assert message["content"] is None  # nothing else was written
    assert choice["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream_it", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("extra", "result"),
    [
        pytest.param({"tool_choice": "none"}, None, id="none"),
        pytest.param({"messages": [{"role": "user", "content": PROMPT}]}, None,
                     id="auto-no-tool-fits"),
        pytest.param({"messages": RESULT}, ToolResult("get_weather", "sunny"),
                     id="auto-after-a-tool-result"),
    ],
)  # fmt: skip
async def test_no_call_means_an_answer_in_text(
    extra: dict[str, Any], result: ToolResult | None, stream_it: bool
) -> None:
    body = ask(seed=5, **extra)
    answer = compose(5, question(body), result).answer
    if stream_it:
        chunks = await stream(body)
        assert tool_chunks(chunks) == []
        assert deltas(chunks) == answer
        assert [c["finish_reason"] for c in choices(chunks) if c["finish_reason"]] == ["stop"]
    else:
        (choice,) = (await post(body))["choices"]
        assert not choice["message"].get("tool_calls")
        assert (choice["message"]["content"], choice["finish_reason"]) == (answer, "stop")


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        pytest.param(None, {}, id="no-schema"),
        pytest.param(
            {"type": "object", "properties": {"a": {"type": "string"}}}, {}, id="nothing-required"
        ),
        pytest.param(
            {
                "properties": {
                    "s": {"type": "string"},
                    "n": {"type": "number"},
                    "i": {"type": "integer"},
                    "b": {"type": "boolean"},
                    "o": {"type": "object"},
                    "a": {"type": "array", "items": {"type": "string"}},
                    "u": {},
                    "optional": {"type": "string"},
                },
                "required": ["s", "n", "i", "b", "o", "a", "u", "undeclared"],
            },
            {
                "s": "sim",
                "n": 1,
                "i": 1,
                "b": True,
                "o": {},
                "a": ["sim"],
                "u": None,
                "undeclared": None,
            },
            id="each-type",
        ),
    ],
)
async def test_arguments_fill_the_required_properties(
    parameters: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    function: dict[str, Any] = {"name": "f"}
    if parameters is not None:
        function["parameters"] = parameters
    tools = [{"type": "function", "function": function}]
    (choice,) = (await post(chat("deepseek-v3", tools=tools, tool_choice="required")))["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert orjson.loads(call["function"]["arguments"]) == expected


@pytest.mark.parametrize("stream_it", [False, True], ids=["whole", "streamed"])
async def test_sim_tool_arguments_replace_the_schema_sample(stream_it: bool) -> None:
    given = {"city": "Zürich", "days": [1, 2], "nested": {"ok": None}}
    body = ask(sim={"tool_arguments": given})
    if stream_it:
        sent = arguments(await stream(body))
    else:
        (choice,) = (await post(body))["choices"]
        sent = choice["message"]["tool_calls"][0]["function"]["arguments"]
    assert orjson.loads(sent) == given


@pytest.mark.parametrize("model", ["deepseek-r1", "qwq-32b", "deepseek-v3"])
async def test_usage_counts_every_argument_piece(model: str) -> None:
    # without a reasoning parser every token sends one non-empty delta
    options = {"include_usage": True}
    chunks = await stream(ask(model, stream_options=options))
    assert tool_chunks(chunks)
    usage = chunks[-1]["usage"]
    text = [c for c in choices(chunks) if c["delta"].get("content")]
    assert usage["completion_tokens"] == len(text) + len(tool_chunks(chunks))


async def test_merged_argument_pieces_still_count_as_tokens() -> None:
    options = {"include_usage": True}
    one, merged = [await stream(ask(stream_options=options, sim={"merge": m})) for m in (1, 3)]
    assert len(tool_chunks(merged)) < len(tool_chunks(one))
    assert arguments(merged) == arguments(one)
    tokens = len(tool_chunks(one))  # one piece per delta, as nothing is merged
    assert [c[-1]["usage"]["completion_tokens"] for c in (one, merged)] == [tokens, tokens]
    assert tool_chunks(merged)[0][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("model", "extra", "field", "before"),
    [
        ("deepseek-r1", {}, "content", "{r}\n</think>\n\n"),
        ("qwq-32b", {}, "content", "<think>\n{r}\n</think>\n\n"),
        ("deepseek-r1-parsed", {}, "reasoning", "{r}"),  # vLLM's parser ate the one-token tag
        ("deepseek-r1-parsed", {"chat_template_kwargs": {"thinking": False}}, "reasoning", ""),
    ],
    ids=["template", "tags", "separated", "separated-thinking-off"],
)
async def test_reasoning_comes_before_the_call(
    model: str, extra: dict[str, Any], field: str, before: str
) -> None:
    seed = tag_seed(one_token=True, tool=True)
    chunks = await stream(chat(model, tools=TOOLS, seed=seed, tool_choice="required", **extra))
    sent = choices(chunks)[1:]  # after the role chunk
    is_tool = ["tool_calls" in c["delta"] for c in sent]
    first_tool = is_tool.index(True)
    last_tool = len(is_tool) - 1 - is_tool[::-1].index(True)
    assert all(is_tool[first_tool : last_tool + 1]), "the call is one run of deltas"
    assert [c["finish_reason"] for c in sent[last_tool + 1 :]] == ["tool_calls"]
    assert deltas(chunks, field) == before.format(r=compose(seed, PROMPT).reasoning)
    other = "reasoning" if field == "content" else "content"
    assert deltas(chunks, other) == ""
    assert orjson.loads(arguments(chunks)) == WEATHER_ARGS


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": "get_weather"}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools"),
        ({"tools": [{"type": "function", "function": "f"}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "other", "function": {"name": "get_time"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": NAMED}, "tool_choice"),
        ({"tools": TOOLS, "sim": {"tool_arguments": [1]}}, "tool_arguments"),
    ],
)
async def test_malformed_tools_are_refused(extra: dict[str, Any], param: str) -> None:
    async with in_process() as (client, state):
        response = await client.post("/v1/chat/completions", json=chat(**extra))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", param, 400)
    assert state.requests_total == 0


async def test_a_tool_that_is_not_an_object_is_refused() -> None:
    async with in_process() as (client, _):
        response = await client.post("/v1/chat/completions", json=chat(tools=["get_weather"]))
    assert response.status_code == 400


async def test_received_keeps_the_last_64_bodies_as_sent() -> None:
    bodies = [ask(user=f"u{i}", max_tokens=1) for i in range(66)]
    async with in_process() as (client, state):
        for body in bodies:
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert list(state.received) == bodies[-64:]


async def test_a_tool_calls_end_is_counted_as_stop() -> None:
    async with in_process() as (client, state):
        body = ask()
        called = await client.post("/v1/chat/completions", json={**body, "n": 2})
        cut = await client.post("/v1/chat/completions", json={**body, "max_tokens": 2})
    assert [c["finish_reason"] for c in called.json()["choices"]] == ["tool_calls"] * 2
    assert cut.json()["choices"][0]["finish_reason"] == "length"
    assert state.finished == {"stop": 2, "length": 1, "abort": 0}
    assert state.completed == 2


async def test_a_call_a_stop_string_cut_is_no_tool_call() -> None:
    body = await post(ask(stop=["sim"]))
    (choice,) = body["choices"]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "sim")


async def test_each_choice_calls_under_its_own_id_and_scripted_chunks_call_nothing() -> None:
    body = await post(ask(n=3))
    ids = {c["message"]["tool_calls"][0]["id"] for c in body["choices"]}
    assert len(ids) == 3
    scripted = await post(ask(sim={"chunks": ["hi"]}))
    (choice,) = scripted["choices"]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]


REMINDER = "<system-reminder>\nToday's date is 2026-01-01. Keep answers short.\n</system-reminder>"
SHELL_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}},
                "required": ["command"]}  # fmt: skip
READ_SCHEMA = {"type": "object", "properties": {"file_path": {"type": "string"}},
               "required": ["file_path"]}  # fmt: skip
AGENT_TOOLS = [  # Read first: a rule that called the first tool would read, not list
    {"type": "function", "function": {"name": "Read", "parameters": READ_SCHEMA,
                                      "description": "Reads a file from the local filesystem."}},
    {"type": "function", "function": {"name": "Bash", "parameters": SHELL_SCHEMA,
                                      "description": "Executes a bash command."}},
]  # fmt: skip
LISTED = "README.md\nsrc\ntests"


def parse(body: dict[str, Any]) -> SimRequest:
    return parse_chat_request(orjson.dumps(body), SimConfig())


def agent_turns() -> tuple[list[Any], SimRequest, list[Any], SimRequest]:
    """A Claude-Code-shaped loop: the question among reminders, then the call's result with
    a reminder after it; both requests as the simulator parses them."""
    asked = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": [{"type": "text", "text": REMINDER},
                                     {"type": "text", "text": "list the files here"}]},
    ]  # fmt: skip
    first = parse(chat("deepseek-r1", messages=asked, tools=AGENT_TOOLS))
    assert first.tool is not None
    function = {"name": first.tool.call.name, "arguments": first.tool.arguments}
    call = {"id": first.tool.call.id, "type": "function", "function": function}
    answered = [
        *asked,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": LISTED},
        {"role": "user", "content": REMINDER},
    ]
    return asked, first, answered, parse(chat("deepseek-r1", messages=answered, tools=AGENT_TOOLS))


def test_an_agent_loop_calls_the_fitting_tool_then_answers_its_result() -> None:
    _, first, _, second = agent_turns()
    assert first.tool is not None and first.question == "list the files here"
    assert (first.tool.call.name, orjson.loads(first.tool.arguments)) == ("Bash", {"command": "ls"})
    assert second.tool is None  # a result is answered, never called again
    assert (second.question, second.result) == ("list the files here", ToolResult("Bash", LISTED))
    script = build_script(second.mode, second.seed, prompt_tokens=second.prompt_tokens,
                          question=second.question, result=second.result)  # fmt: skip
    assert script.finish_reason == "stop" and script.tool is None
    answer = "".join(p.text for p in script.pieces).split("</think>\n\n", 1)[1]
    assert answer.startswith("The Bash tool returned “README.md”. ")


async def test_an_agent_loop_over_http_ends_in_prose_about_the_result() -> None:
    asked, _, answered, _ = agent_turns()
    first = await post(chat("deepseek-v3", messages=asked, tools=AGENT_TOOLS))
    (call,) = first["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], first["choices"][0]["finish_reason"]) == (
        "Bash",
        "tool_calls",
    )
    answered[-3] = {"role": "assistant", "content": None, "tool_calls": [call]}
    answered[-2] = {**answered[-2], "tool_call_id": call["id"]}
    second = await post(chat("deepseek-v3", messages=answered, tools=AGENT_TOOLS, seed=9))
    (choice,) = second["choices"]
    assert choice["finish_reason"] == "stop" and not choice["message"].get("tool_calls")
    result = ToolResult("Bash", LISTED)
    assert choice["message"]["content"] == compose(9, "list the files here", result).answer


@pytest.mark.parametrize("choice", ["auto", "none"])
async def test_a_question_in_reminders_is_read_without_them(choice: str) -> None:
    content = f"{REMINDER}\nWhat is the weather in Paris?\n{REMINDER}"
    request = parse(chat("deepseek-v3", tools=TOOLS, tool_choice=choice,
                         messages=[{"role": "user", "content": content}]))  # fmt: skip
    assert request.question == "What is the weather in Paris?"
    assert (request.tool is not None) == (choice == "auto")
    text = compose(request.seed, request.question)
    assert "system-reminder" not in text.reasoning and "date" not in text.answer
