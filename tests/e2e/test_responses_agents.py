"""``POST /v1/responses`` as agent clients speak it, through the real ``openai`` SDK (its
``responses.stream()`` accumulates every event, as openai-node's does) against the simulator:
Codex CLI's fields and tools (notices for what has no effect), reasoning summaries, custom
(free-form) tools, namespace tools, and second turns that send stored items back by
``item_reference`` (the AI SDK's default)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.side.sim.app import SimApp
from tests.e2e.conftest import RecordingSink, Stack
from tests.e2e.test_responses import sdk

MODEL = "deepseek-r1"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CUSTOM: Any = {"type": "custom", "name": "apply_patch", "description": "Edits files with a patch.",
          "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}  # fmt: skip
NAMESPACE: Any = {"type": "namespace", "name": "weather", "description": "Weather tools.",
             "tools": [{"type": "function", "name": "get_forecast",
                        "description": "The weather forecast for a city.",
                        "parameters": CITY, "strict": False}]}  # fmt: skip


@pytest.fixture
async def agents(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    sink = RecordingSink()
    return await stack_factory(sink=sink), sink


def received(stack: Stack) -> dict[str, Any]:
    """The last body the engine received."""
    assert isinstance(stack.sim, SimApp)
    return stack.sim.sim.received[-1]


def replayed(output: list[Any]) -> list[Any]:
    """Output items as a client sends them back."""
    return [item.model_dump(exclude_none=True) for item in output]


async def post(stack: Stack, body: dict[str, Any], key: str = "visible") -> httpx.Response:
    headers = {"authorization": f"Bearer {stack.keys[key]}"}
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(f"{stack.url}/responses", json=body, headers=headers)


def codex_request() -> dict[str, Any]:
    """A request shaped as Codex CLI (0.17x) sends its first turn to a custom provider."""
    return {
        "model": MODEL, "instructions": "You are Codex.", "stream": True, "store": False,
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions>ask</permissions>"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Why is the sky blue?"}]},
        ],
        "tools": [
            {"type": "function", "name": "exec_command", "description": "Runs a command.",
             "strict": False, "parameters": {"type": "object", "properties": {
                 "cmd": {"type": "string"}}, "required": ["cmd"]}},
            CUSTOM, NAMESPACE,
            {"type": "web_search", "external_web_access": False},
            {"type": "image_generation", "output_format": "png"},
        ],
        "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "019a-thread",
        "client_metadata": {"traceparent": TRACEPARENT},
        "text": {"verbosity": "medium"}, "service_tier": "auto",
    }  # fmt: skip


async def test_codex_clis_first_request_is_answered_with_a_notice_of_the_dropped_tools(
    agents: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = agents
    reply = await post(stack, codex_request())
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-thinkgate-dropped-tools"] == "web_search,image_generation"
    assert "x-thinkgate-ignored" not in reply.headers  # every field is one a reference names
    names = [line[7:] for line in reply.text.splitlines() if line.startswith("event: ")]
    assert names[-1] == "response.completed" and "response.reasoning_summary_text.delta" in names
    engine = received(stack)
    assert [t["function"]["name"] for t in engine["tools"]] == [
        "exec_command", "apply_patch", "weather__get_forecast"]  # fmt: skip
    assert not {"client_metadata", "prompt_cache_key", "service_tier", "include", "text"} & set(
        engine
    )


async def test_strict_mode_refuses_the_built_in_tool_and_unknown_fields(stack_factory: Any) -> None:
    stack = await stack_factory(unknown_fields="refuse")
    reply = await post(stack, codex_request())
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools[3].type"
    body = {"model": MODEL, "input": "Why?", "x_vendor_flag": 1}
    refused = await post(stack, body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "x_vendor_flag"


async def test_an_unknown_field_is_named_in_a_header(agents: tuple[Stack, RecordingSink]) -> None:
    stack, _ = agents
    reply = await post(stack, {"model": MODEL, "input": "Why?", "x_vendor_flag": {"a": 1}})
    assert reply.status_code == 200 and reply.headers["x-thinkgate-ignored"] == "x_vendor_flag"
    assert "x_vendor_flag" not in received(stack)


# --- reasoning summaries -----------------------------------------------------------------------


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_a_summary_accumulates_in_the_sdks_stream_for_a_visible_key_only(
    agents: tuple[Stack, RecordingSink], key: str
) -> None:
    stack, sink = agents
    async with (
        sdk(stack, key) as client,
        client.responses.stream(
            model=MODEL, input="Why is the sky blue?", reasoning={"summary": "auto"}
        ) as stream,  # fmt: skip
    ):
        events = [event async for event in stream]
        final = await stream.get_final_response()
    (record,) = await sink.wait_for(1)
    trace = record.reasoning[0]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert final.reasoning is not None and final.reasoning.summary == "auto"
    if key == "hidden":
        wire = "".join(e.model_dump_json(warnings=False) for e in events)
        assert deltas == "" and trace[:30] not in wire
        assert [item.type for item in final.output] == ["message"]
        return
    reasoning = final.output[0]
    assert reasoning.type == "reasoning"
    assert [(s.type, s.text) for s in reasoning.summary] == [("summary_text", trace)]
    assert deltas == trace  # the summary is the model's own trace, whole
    assert not [e for e in events if e.type == "response.reasoning_text.delta"]
    assert final.output_text == record.content[0]


# --- custom tools ------------------------------------------------------------------------------


async def test_a_custom_tool_call_streams_and_its_output_is_fed_back(
    agents: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = agents
    question: list[Any] = [{"role": "user", "content": "Fix the typo in main.py."}]
    async with sdk(stack, "visible") as client:
        async with client.responses.stream(
            model=MODEL, input=question, tools=[CUSTOM],
            tool_choice={"type": "custom", "name": "apply_patch"}, store=False,
        ) as stream:  # fmt: skip
            events = [event async for event in stream]
            first = await stream.get_final_response()
        call = first.output[-1]
        assert call.type == "custom_tool_call" and call.name == "apply_patch"
        streamed = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
        (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
        assert "".join(streamed) == done.input == call.input and call.input
        engine = received(stack)
        (tool,) = engine["tools"]
        assert tool["function"]["parameters"]["required"] == ["input"]
        assert engine["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
        result: Any = {
            "type": "custom_tool_call_output",
            "call_id": call.call_id,
            "output": "patched",
        }
        second = await client.responses.create(
            model=MODEL, input=[*question, *replayed(first.output), result],
            tools=[CUSTOM], store=False,
        )  # fmt: skip
    assert second.output_text
    messages = received(stack)["messages"]
    (sent_call,) = messages[1]["tool_calls"]
    assert sent_call["function"]["name"] == "apply_patch"
    assert orjson.loads(sent_call["function"]["arguments"]) == {"input": call.input}
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "patched"}


# --- namespace tools ---------------------------------------------------------------------------


async def test_a_namespaced_call_comes_back_with_its_namespace(
    agents: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = agents
    question: list[Any] = [{"role": "user", "content": "What is the weather forecast in Paris?"}]
    async with sdk(stack, "visible") as client:
        async with client.responses.stream(
            model=MODEL, input=question, tools=[NAMESPACE],
            tool_choice="required", store=False,
        ) as stream:  # fmt: skip
            first = await stream.get_final_response()
        call = first.output[-1]
        assert call.type == "function_call"
        assert (call.name, call.namespace) == ("get_forecast", "weather")
        assert [t["function"]["name"] for t in received(stack)["tools"]] == [
            "weather__get_forecast"]  # fmt: skip
        result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        second = await client.responses.create(
            model=MODEL, input=[*question, *replayed(first.output), result],
            tools=[NAMESPACE], store=False,
        )  # fmt: skip
    assert second.output_text
    (sent_call,) = received(stack)["messages"][1]["tool_calls"]
    assert sent_call["function"] == {"name": "weather__get_forecast", "arguments": call.arguments}


# --- item references ---------------------------------------------------------------------------


def references(output: list[Any]) -> list[Any]:
    return [{"type": "item_reference", "id": item.id} for item in output]


@pytest.mark.parametrize("key", ["visible", "hidden"])
async def test_a_second_turn_references_the_stored_items(
    agents: tuple[Stack, RecordingSink], key: str
) -> None:
    """The AI SDK's default (``store: true``): the first turn's items come back as
    ``item_reference``; the engine gets them, the reasoning text included, and a hidden key
    (which holds its reasoning only sealed) never reads it."""
    stack, sink = agents
    include: Any = ["reasoning.encrypted_content"] if key == "hidden" else []
    async with sdk(stack, key) as client:
        first = await client.responses.create(model=MODEL, input="Why is the sky blue?",
                                              include=include)  # fmt: skip
        assert [item.type for item in first.output] == ["reasoning", "message"]
        asked: Any = [
            {"role": "user", "content": "Why is the sky blue?"},
            *references(first.output),
            {"role": "user", "content": "And at sunset?"},
        ]
        async with client.responses.stream(model=MODEL, input=asked,
                                           include=include) as stream:  # fmt: skip
            second = await stream.get_final_response()
        listed = await client.responses.input_items.list(second.id, order="asc")
    (record, _) = await sink.wait_for(2)
    assert received(stack)["messages"] == [
        {"role": "user", "content": "Why is the sky blue?"},
        {"role": "assistant", "content": record.content[0], "reasoning": record.reasoning[0]},
        {"role": "user", "content": "And at sunset?"},
    ]
    assert second.output_text
    assert [item.id for item in listed.data[1:3]] == [item.id for item in first.output]
    if key == "hidden":
        seen = second.model_dump_json() + listed.model_dump_json()
        assert record.reasoning[0][:30] not in seen


async def test_a_reference_not_found_is_a_400_naming_it_whoever_stored_it(
    agents: tuple[Stack, RecordingSink],
) -> None:
    stack, _ = agents
    async with sdk(stack, "other") as client:  # another tenant
        theirs = await client.responses.create(model=MODEL, input="Why?")
    message_id = theirs.output[-1].id
    assert isinstance(message_id, str)
    unknown = message_id[:-8] + ("0" * 8 if not message_id.endswith("0" * 8) else "1" * 8)
    errors = []
    for item_id in (message_id, unknown, "msg_not_ours"):
        body: dict[str, Any] = {"model": MODEL, "input": [{"role": "user", "content": "q"},
                                          {"type": "item_reference", "id": item_id}]}  # fmt: skip
        reply = await post(stack, body)
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["param"] == "input[1].id"
        errors.append(error["message"].replace(item_id, "ID"))
    assert len(set(errors)) == 1  # another tenant's id reads exactly as an unknown one
    async with sdk(stack, "other") as client:  # the owner still resolves it
        await client.responses.create(model=MODEL, input=[
            {"role": "user", "content": "Why?"}, {"type": "item_reference", "id": message_id},
            {"role": "user", "content": "More?"}])  # fmt: skip
    with pytest.raises(openai.BadRequestError):
        async with sdk(stack, "visible") as client:
            await client.responses.create(model=MODEL, input=[
                {"type": "item_reference", "id": message_id}])  # fmt: skip
