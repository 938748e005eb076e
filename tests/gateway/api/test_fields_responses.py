"""The Responses field policy (``gateway.api.fields.RESPONSES``) holds its parser to it, row
by row, as ``test_fields`` does for chat, completions and embeddings. Responses is translated
to chat, so a row is held to its effect: ``ignored`` (and a refused field's inert value):
accepted and nothing of it in the engine's body; ``refused``: a 400 naming it; ``honoured``
and ``mapped``: what the row says shows in the parsed request or the engine's body
(``RESPONSES_EFFECTS``, which a new honoured row must join). A field no row names follows
``UNKNOWN_FIELDS``: dropped and named, or refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from gateway.api.fields import RESPONSES, FieldRule
from gateway.api.responses import ResponsesRequest, parse_responses_request
from gateway.errors import InvalidRequest

RESPONSES_BASE: dict[str, Any] = {"model": "m", "input": "hi"}
FUNCTION_TOOL = {"type": "function", "name": "f"}
# For each honoured or mapped row: a value, other fields it needs, and what must show its
# effect on the parsed request (``call``) and the chat body the engine gets (``body``).
Effect = Callable[[ResponsesRequest, dict[str, Any]], bool]
RESPONSES_EFFECTS: dict[str, tuple[Any, dict[str, Any], Effect]] = {
    "model": ("m", {}, lambda c, b: b["model"] == "m"),
    "input": ([{"role": "user", "content": "hello"}], {},
              lambda c, b: b["messages"] == [{"role": "user", "content": "hello"}]),
    "instructions": ("sys", {}, lambda c, b: b["messages"][0] == {"role": "system",
                                                                  "content": "sys"}),
    "max_output_tokens": (8, {}, lambda c, b: b["max_tokens"] == 8),
    "metadata": ({"k": "v"}, {}, lambda c, b: c.echo["metadata"] == {"k": "v"}
                 and "metadata" not in b),
    "parallel_tool_calls": (False, {"tools": [FUNCTION_TOOL]},
                            lambda c, b: b["parallel_tool_calls"] is False),
    "previous_response_id": ("resp_1", {}, lambda c, b: c.previous_response_id == "resp_1"),
    "reasoning": ({"effort": "low", "summary": "auto"}, {},
                  lambda c, b: b["reasoning_effort"] == "low" and c.summary),
    "store": (False, {}, lambda c, b: c.store is False),
    "stream": (True, {}, lambda c, b: b["stream"] is True),
    "temperature": (0.5, {}, lambda c, b: b["temperature"] == 0.5),
    "top_p": (0.5, {}, lambda c, b: b["top_p"] == 0.5),
    "text": ({"format": {"type": "json_object"}}, {},
             lambda c, b: b["response_format"] == {"type": "json_object"}),
    "tool_choice": ("required", {"tools": [FUNCTION_TOOL]},
                    lambda c, b: b["tool_choice"] == "required"),
    "tools": ([FUNCTION_TOOL, {"type": "web_search"}], {},
              lambda c, b: b["tools"] == [{"type": "function", "function": {"name": "f"}}]
              and c.dropped == ("web_search",)),
    "top_logprobs": (2, {}, lambda c, b: b["logprobs"] is True and b["top_logprobs"] == 2),
    "conversation": ({"id": "conv_1"}, {}, lambda c, b: c.conversation_id == "conv_1"
                     and "conversation" not in b and c.echo["conversation"] == {"id": "conv_1"}),
    "truncation": ("auto", {}, lambda c, b: c.truncation == "auto" and "truncation" not in b
                   and c.echo["truncation"] == "auto"),
    "background": (True, {}, lambda c, b: c.background and b["stream"] is True
                   and b["stream_options"] == {"include_usage": True} and not c.stream),
    "include": (["reasoning.encrypted_content", "file_search_call.results"], {},
                lambda c, b: c.include_encrypted and "include" not in b),
    # vLLM's own Responses fields, passed on to the engine as given
    "seed": (7, {}, lambda c, b: b["seed"] == 7),
    "ignore_eos": (True, {}, lambda c, b: b["ignore_eos"] is True),
    "repetition_penalty": (1.1, {}, lambda c, b: b["repetition_penalty"] == 1.1),
    "stop_token_ids": ([2], {}, lambda c, b: b["stop_token_ids"] == [2]),
    "vllm_xargs": ({"a": 1}, {}, lambda c, b: b["vllm_xargs"] == {"a": 1}),
    "cache_salt": ("s", {}, lambda c, b: b["cache_salt"] == "s"),
}  # fmt: skip


def engine_body(call: ResponsesRequest) -> dict[str, Any]:
    """The chat body the engine gets (built as the route builds it, when the parse left the
    body for ``build``)."""
    raw = call.upstream_body or call.build({}, "reasoning").upstream_body
    body = orjson.loads(raw)
    assert isinstance(body, dict)
    return body


def responses_cases() -> list[Any]:
    return [pytest.param(name, rule, id=f"responses.{name}") for name, rule in RESPONSES.items()]


@pytest.mark.parametrize(("name", "rule"), responses_cases())
def test_every_responses_field_is_treated_as_its_row_says(name: str, rule: FieldRule) -> None:
    if rule.policy == "refused":
        with pytest.raises(InvalidRequest) as refused:
            parse_responses_request(orjson.dumps({**RESPONSES_BASE, name: "x"}))
        assert refused.value.param == name and "not supported" in refused.value.message
        for inert in (None, *rule.inert):
            raw = orjson.dumps({**RESPONSES_BASE, name: inert})
            assert name not in engine_body(parse_responses_request(raw))
        return
    if rule.policy == "ignored":
        call = parse_responses_request(orjson.dumps({**RESPONSES_BASE, name: "x"}))
        body = engine_body(call)
        assert name not in body and name not in call.params and call.unknown == ()
        return
    value, needs, effect = RESPONSES_EFFECTS[name]  # a new honoured row needs its effect here
    call = parse_responses_request(orjson.dumps({**RESPONSES_BASE, **needs, name: value}))
    assert effect(call, engine_body(call))


def test_a_responses_field_no_reference_names_is_dropped_and_reported_or_refused() -> None:
    raw = orjson.dumps({**RESPONSES_BASE, "x_vendor_flag": {"a": 1}})
    accepted = parse_responses_request(raw, "ignore")
    assert accepted.unknown == ("x_vendor_flag",)
    assert "x_vendor_flag" not in engine_body(accepted)  # a translated API: nothing to pass on
    with pytest.raises(InvalidRequest) as refused:
        parse_responses_request(raw, "refuse")
    assert refused.value.param == "x_vendor_flag" and "Unknown parameter" in refused.value.message
