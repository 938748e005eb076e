"""The real OpenAI Agents SDK running an agent with a function tool through thinkgate over the
Responses API, against the simulator: (a) ``store=False`` with encrypted reasoning, (b)
``store=True`` chained with ``previous_response_id``. The simulator records what it received:
on the tool turn the engine must get the earlier reasoning back, and a hidden key's client
must never have seen it."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from gateway.side.sim.app import SimApp
from tests.e2e.conftest import RecordingSink, Stack

calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"It is sunny in {city}."


def agent_for(client: openai.AsyncOpenAI, settings: ModelSettings) -> Agent[Any]:
    model = OpenAIResponsesModel(model="deepseek-r1", openai_client=client)
    return Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather],
                 model=model, model_settings=settings)  # fmt: skip


@pytest.fixture
async def stack(stack_factory: Any) -> tuple[Stack, RecordingSink]:
    set_tracing_disabled(True)  # no export to OpenAI's tracing service
    calls.clear()
    sink = RecordingSink()
    return await stack_factory(sink=sink), sink


def received(stack: Stack) -> list[dict[str, Any]]:
    assert isinstance(stack.sim, SimApp)
    return list(stack.sim.sim.received)


@pytest.mark.parametrize(
    ("key", "settings", "chained"),
    [
        pytest.param("hidden", ModelSettings(store=False, include_usage=True,
                     response_include=["reasoning.encrypted_content"]), False,
                     id="store-false-encrypted-hidden"),
        pytest.param("visible", ModelSettings(store=False,
                     response_include=["reasoning.encrypted_content"]), False,
                     id="store-false-encrypted-visible"),
        pytest.param("hidden", ModelSettings(store=True), True, id="store-true-previous-id"),
    ],
)  # fmt: skip
async def test_an_agent_calls_its_tool_and_the_engine_gets_its_reasoning_back(
    stack: tuple[Stack, RecordingSink], key: str, settings: ModelSettings, chained: bool
) -> None:
    gateway, sink = stack
    async with openai.AsyncOpenAI(
        base_url=gateway.url, api_key=gateway.keys[key], max_retries=0
    ) as client:
        result = await Runner.run(
            agent_for(client, settings), "What is the weather in Paris?",
            auto_previous_response_id=chained, run_config=RunConfig(tracing_disabled=True),
        )  # fmt: skip
    assert calls == ["sim"]  # the simulator's arguments for a required string
    assert result.final_output
    first, second = await sink.wait_for(2)
    assert first.tool_calls and first.tool_calls[0][0]["name"] == "get_weather"
    trace = first.reasoning[0]
    assert len(trace) > 40
    tool_turn = received(gateway)[-1]["messages"]
    assistant = next(m for m in tool_turn if m["role"] == "assistant")
    assert assistant["reasoning"] == trace  # the engine got its reasoning back
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    assert tool_turn[-1] == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                             "content": "It is sunny in sim."}  # fmt: skip
    if chained:  # the second request sent only the new items
        assert second.params.get("previous_response_id")
    seen = str([i.model_dump() for r in result.raw_responses for i in r.output])
    seen += str(result.to_input_list())
    assert (trace[:40] in seen) == (key == "visible")
