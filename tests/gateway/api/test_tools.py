"""Responses tools as chat tools and back (``gateway.api.tools``), through the Responses
request's parse: functions, namespaces flattened, custom tools as one-string functions,
built-in tools dropped with a notice or refused, and the tool choice."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.responses import ResponsesRequest, parse_responses_request
from gateway.api.tools import (
    ClientTool,
    ToolMap,
    custom_arguments,
    dropped_header,
    flat_name,
    translate_tools,
)
from gateway.errors import InvalidRequest

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}
FUNCTION = {"type": "function", "name": "f", "description": "d", "parameters": SCHEMA,
            "strict": True}  # fmt: skip
CUSTOM = {"type": "custom", "name": "apply", "description": "Edits files."}
NAMESPACE = {"type": "namespace", "name": "crm", "description": "The CRM.",
             "tools": [{"type": "function", "name": "lookup", "parameters": SCHEMA},
                       {"type": "custom", "name": "note"}]}  # fmt: skip
INPUT = {"type": "object", "properties": {"input": {"type": "string"}}}


def parse(unknown: Any = "ignore", **fields: Any) -> ResponsesRequest:
    raw = orjson.dumps({"model": "m", "input": "hi", **fields})
    return parse_responses_request(raw, unknown)


def sent(call: ResponsesRequest) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(call.upstream_body)
    return body


def refusal(**fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        parse(**fields)
    assert refused.value.status == 400
    return refused.value


def function(sent_tool: dict[str, Any]) -> dict[str, Any]:
    assert sent_tool["type"] == "function"
    result: dict[str, Any] = sent_tool["function"]
    return result


# --- functions ---------------------------------------------------------------------------------


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
    assert call.tools.client("f") == ClientTool("f")


def test_no_tools_no_tool_fields() -> None:
    call = parse()
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(sent(call))
    assert call.echo["tools"] == [] and call.dropped == ()


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
        ([{"type": "custom"}], "tools[0].name"),
        ([{"type": "namespace", "name": "crm"}], "tools[0].tools"),
        ([{"type": "namespace", "name": "crm", "tools": []}], "tools[0].tools"),
        ([{"type": "namespace", "tools": [FUNCTION]}], "tools[0].name"),
        ([{"type": "namespace", "name": "crm", "tools": [{"type": "web_search"}]}],
         "tools[0].tools[0].type"),
        ([{"type": "namespace", "name": "crm", "tools": [{"type": "function"}]}],
         "tools[0].tools[0].name"),
        ([FUNCTION, {**FUNCTION, "description": "again"}], "tools[1].name"),
        ([{"type": "function", "name": "crm__lookup"}, NAMESPACE], "tools[1].tools[0].name"),
        ([{"type": ["function"], "name": "f"}], "tools[0].type"),
    ],
)  # fmt: skip
def test_malformed_tools_are_refused_naming_the_tool(tools: Any, param: str) -> None:
    assert refusal(tools=tools).param == param


# --- namespaces and custom tools ---------------------------------------------------------------


def test_a_namespace_is_flattened_and_mapped_back() -> None:
    call = parse(tools=[NAMESPACE, FUNCTION])
    lookup, note, f = (function(t) for t in sent(call)["tools"])
    assert lookup == {"name": "crm__lookup", "parameters": SCHEMA, "description": "The CRM."}
    assert note["name"] == "crm__note" and note["parameters"]["properties"].keys() == {"input"}
    assert f["name"] == "f"
    assert call.tools.client("crm__lookup") == ClientTool("lookup", "crm")
    assert call.tools.client("crm__note") == ClientTool("note", "crm", "custom")
    assert call.echo["tools"] == [NAMESPACE, FUNCTION]


@pytest.mark.parametrize(
    ("namespace", "name", "flat"),
    [(None, "f", "f"), ("crm", "lookup", "crm__lookup"),
     ("mcp__github__", "get_issue", "mcp__github__get_issue")],
)  # fmt: skip
def test_flat_names(namespace: str | None, name: str, flat: str) -> None:
    assert flat_name(namespace, name) == flat


def test_an_inner_tool_keeps_its_description_after_the_namespaces() -> None:
    namespace = {**NAMESPACE, "tools": [{"type": "function", "name": "lookup",
                                         "description": "Finds a customer."}]}  # fmt: skip
    (tool,) = sent(parse(tools=[namespace]))["tools"]
    assert function(tool)["description"] == "The CRM.\n\nFinds a customer."


def test_a_custom_tool_is_a_function_of_one_string() -> None:
    call = parse(tools=[CUSTOM])
    (tool,) = sent(call)["tools"]
    carried = function(tool)
    assert carried["name"] == "apply" and carried["description"] == "Edits files."
    parameters = carried["parameters"]
    assert parameters["required"] == ["input"] and parameters["additionalProperties"] is False
    assert parameters["properties"]["input"]["type"] == "string"
    assert call.tools.client("apply") == ClientTool("apply", None, "custom")
    assert orjson.loads(custom_arguments('a "quoted"\nline')) == {"input": 'a "quoted"\nline'}


def test_a_custom_tools_grammar_is_told_to_the_model() -> None:
    grammar = {"type": "grammar", "syntax": "lark", "definition": 'start: "x"+'}
    (tool,) = sent(parse(tools=[{**CUSTOM, "format": grammar}]))["tools"]
    description = function(tool)["description"]
    assert description.startswith("Edits files.") and 'start: "x"+' in description
    assert "lark grammar" in description
    (plain,) = sent(parse(tools=[{**CUSTOM, "format": {"type": "text"}}]))["tools"]
    assert function(plain)["description"] == "Edits files."


def test_a_name_the_engine_made_up_is_a_function_of_that_name() -> None:
    assert ToolMap().client("invented") == ClientTool("invented")


# --- built-in tools ----------------------------------------------------------------------------

DROPPED = ["web_search", "web_search_preview", "file_search", "code_interpreter",
           "computer_use_preview", "computer", "image_generation", "tool_search",
           "programmatic_tool_calling"]  # fmt: skip


@pytest.mark.parametrize("kind", DROPPED)
def test_a_built_in_tool_is_dropped_with_a_notice(kind: str) -> None:
    call = parse(tools=[{"type": kind}, FUNCTION, {"type": kind, "x": 1}])
    assert [function(t)["name"] for t in sent(call)["tools"]] == ["f"]
    assert call.dropped == (kind,)  # named once
    assert call.echo["tools"] == [FUNCTION]
    assert dropped_header(call.dropped) == (("x-thinkgate-dropped-tools", kind),)


@pytest.mark.parametrize("kind", DROPPED)
def test_a_built_in_tool_is_refused_when_strict(kind: str) -> None:
    refused = refusal(unknown="refuse", tools=[FUNCTION, {"type": kind}])
    assert refused.param == "tools[1].type" and f"'{kind}'" in refused.message


@pytest.mark.parametrize("kind", ["mcp", "local_shell", "shell", "apply_patch"])
def test_tools_whose_calls_cannot_be_made_are_refused(kind: str) -> None:
    refused = refusal(tools=[FUNCTION, {"type": kind}])
    assert refused.param == "tools[1].type" and f"'{kind}'" in refused.message


def test_codex_clis_tools_are_accepted() -> None:
    """Codex CLI's default tool list (0.17x): functions, a custom apply_patch with a grammar,
    a namespace of MCP tools, web search and image generation."""
    tools = [
        {"type": "function", "name": "exec_command", "description": "Runs a command.",
         "strict": False, "parameters": {"type": "object", "properties": {}}},
        {"type": "custom", "name": "apply_patch", "description": "Patches files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}},
        {"type": "namespace", "name": "mcp__docs__", "description": "Tools in the docs MCP.",
         "tools": [{"type": "function", "name": "search", "description": "Searches.",
                    "strict": False, "parameters": {"type": "object", "properties": {}}}]},
        {"type": "web_search", "external_web_access": False},
        {"type": "image_generation", "output_format": "png"},
    ]  # fmt: skip
    call = parse(tools=tools, tool_choice="auto", parallel_tool_calls=False)
    names = [function(t)["name"] for t in sent(call)["tools"]]
    assert names == ["exec_command", "apply_patch", "mcp__docs__search"]
    assert call.dropped == ("web_search", "image_generation")


# --- tool choice -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("choice", "chat"),
    [
        ("none", "none"),
        ("auto", "auto"),
        ("required", "required"),
        ({"type": "function", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
        ({"type": "custom", "name": "apply"}, {"type": "function", "function": {"name": "apply"}}),
    ],
)  # fmt: skip
def test_tool_choice_is_mapped_to_chat_and_echoed(choice: Any, chat: Any) -> None:
    call = parse(tools=[FUNCTION, CUSTOM], tool_choice=choice)
    assert (sent(call)["tool_choice"], call.echo["tool_choice"]) == (chat, choice)


def test_allowed_tools_offers_only_those_with_its_mode() -> None:
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "custom", "name": "apply"}, {"type": "web_search"}]}  # fmt: skip
    call = parse(tools=[FUNCTION, CUSTOM, {"type": "web_search"}], tool_choice=choice)
    body = sent(call)
    assert [function(t)["name"] for t in body["tools"]] == ["apply"]
    assert body["tool_choice"] == "required" and call.echo["tool_choice"] == choice


def test_allowed_tools_that_all_were_dropped_offer_none() -> None:
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "web_search"}]}
    body = sent(parse(tools=[FUNCTION, {"type": "web_search"}], tool_choice=choice))
    assert "tools" not in body and "tool_choice" not in body
    required = {**choice, "mode": "required"}
    refused = refusal(tools=[FUNCTION, {"type": "web_search"}], tool_choice=required)
    assert refused.param == "tool_choice.tools"


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (None, "required", "tool_choice"),
        ([FUNCTION], {"type": "function", "name": "g"}, "tool_choice.name"),
        ([FUNCTION], {"type": "function"}, "tool_choice.name"),
        (None, {"type": "function", "name": "f"}, "tool_choice.name"),
        ([FUNCTION], {"type": "custom", "name": "f"}, "tool_choice.name"),
        ([NAMESPACE], {"type": "function", "name": "lookup"}, "tool_choice.name"),
        ([FUNCTION], "any", "tool_choice"),
        ([FUNCTION], {"type": "allowed_tools", "tools": [{"type": "function", "name": "f"}]},
         "tool_choice.mode"),
        ([FUNCTION], {"type": "allowed_tools", "mode": "auto"}, "tool_choice.tools"),
        ([FUNCTION], {"type": "allowed_tools", "mode": "auto",
                      "tools": [{"type": "function", "name": "g"}]}, "tool_choice.tools[0].name"),
        ([FUNCTION], {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "plugin"}]},
         "tool_choice.tools[0]"),
        ([FUNCTION], {"type": "web_search"}, "tool_choice"),
        ([FUNCTION], {"type": "mcp", "server_label": "s"}, "tool_choice"),
        ([FUNCTION], 1, "tool_choice"),
        ([FUNCTION], {"type": "function", "name": ["f"]}, "tool_choice.name"),
    ],
)  # fmt: skip
def test_a_tool_choice_that_cannot_be_honoured_is_refused(
    tools: Any, choice: Any, param: str
) -> None:
    assert refusal(tools=tools, tool_choice=choice).param == param


@pytest.mark.parametrize("value", [True, False])
def test_parallel_tool_calls_passes_through_and_is_echoed(value: bool) -> None:
    call = parse(tools=[FUNCTION], parallel_tool_calls=value)
    assert (sent(call)["parallel_tool_calls"], call.echo["parallel_tool_calls"]) == (value, value)


def test_parallel_tool_calls_must_be_a_boolean() -> None:
    assert refusal(parallel_tool_calls="no").param == "parallel_tool_calls"


def test_translating_none_is_no_tools() -> None:
    tools = translate_tools(None)
    assert (tools.chat, tools.dropped, tools.echo) == ([], (), [])
