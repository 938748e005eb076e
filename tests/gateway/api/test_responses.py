"""The Responses request, translated to the chat body sent upstream; what is refused."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.responses import parse_responses_request
from gateway.errors import InvalidRequest


def parse(**fields: Any) -> Any:
    return parse_responses_request(orjson.dumps({"model": "m", **fields}))


def test_input_and_instructions_become_chat_messages() -> None:
    call = parse(
        input=[{"role": "developer", "content": "be terse"},
               {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "a"},
                            {"type": "input_text", "text": "b"}]},
               {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]}],
        instructions="sys", max_output_tokens=50, temperature=0.5, reasoning={"effort": "none"},
        stream=True, metadata={"x": "y"},
    )  # fmt: skip
    sent = orjson.loads(call.upstream_body)
    assert sent["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "system", "content": "be terse"},
        {"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"},
    ]  # fmt: skip
    assert (sent["max_tokens"], sent["temperature"], sent["reasoning_effort"]) == (50, 0.5, "none")
    assert sent["stream_options"] == {"include_usage": True}
    assert "metadata" not in sent and call.echo["metadata"] == {"x": "y"}
    assert call.params_for_thinking == {"reasoning_effort": "none"}


def test_vllms_own_responses_fields_reach_the_engine_and_its_queue_order_does_not() -> None:
    extras = {"seed": 7, "ignore_eos": True, "repetition_penalty": 1.1, "stop_token_ids": [2],
              "vllm_xargs": {"pace_s": 0.1}, "cache_salt": "s"}  # fmt: skip
    call = parse(input="x", priority=-5, kv_transfer_params={"x": 1}, **extras)
    sent = orjson.loads(call.upstream_body)
    assert {name: sent.get(name) for name in extras} == extras
    assert "priority" not in sent and "kv_transfer_params" not in sent
    assert call.unknown == ()  # named by the table, so not reported as unknown


def test_a_string_input_is_one_user_message() -> None:
    assert orjson.loads(parse(input="hi").upstream_body)["messages"] == [
        {"role": "user", "content": "hi"}
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "stream": "yes"}, "stream"),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0]"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"input": "x", "instructions": 3}, "instructions"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse(**fields)
    assert refused.value.param == param
