"""The field policy holds the Messages parsers to it, row by row, as ``test_fields`` does for chat,
completions and embeddings: every row of ``MESSAGES`` and ``COUNT_TOKENS`` is sent, and what
reaches the engine's chat body (or the prompt counted) is what the row says. ``ignored`` (and a
refused field's inert value): accepted, neither sent on nor kept; ``refused``: a 400 naming
it; ``honoured``: sent on under its name; ``mapped``: what ``to`` names is there instead (one
expectation per mapped row, so a new row cannot go unchecked). A field no row names follows
``UNKNOWN_FIELDS``: on these translated APIs it is dropped, never forwarded."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
import pytest

from gateway.api.fields import COUNT_TOKENS, MESSAGES, FieldRule
from gateway.api.messages.request import (
    MessagesRequest,
    parse_count_tokens_request,
    parse_messages_request,
)
from gateway.errors import InvalidRequest

HI = {"role": "user", "content": "hi"}
BASE: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [HI]}
TOOL = {"name": "f", "input_schema": {"type": "object"}}
SCHEMA = {"type": "json_schema", "schema": {"type": "object"}}
EDITS = {"edits": [{"type": "clear_tool_uses_20250919"}]}
# A valid value of each field the parser reads; every other field is sent the string "x".
SAMPLES: dict[str, Any] = {
    "max_tokens": 64, "messages": [HI, {"role": "system", "content": "late"}], "model": "m",
    "metadata": {"user_id": "u-1"}, "output_config": {"effort": "high", "format": SCHEMA},
    "stop_sequences": ["END"], "stream": True, "system": "S.",
    "thinking": {"type": "enabled", "budget_tokens": 16}, "tool_choice": {"type": "auto"},
    "tools": [TOOL], "context_management": EDITS, "mcp_servers": [{"type": "url", "url": "u"}],
    "compaction": {"instructions": "sum up"}, "thread": {"id": "t"}, "temperature": 0.5,
    "top_p": 0.5, "top_k": 3, "output_format": SCHEMA, "seed": 1, "min_p": 0.1,
    "repetition_penalty": 1.1, "logit_bias": {"1": 1}, "structured_outputs": {"json": {}},
    "chat_template_kwargs": {"enable_thinking": True},
}  # fmt: skip
Check = Callable[[dict[str, Any], MessagesRequest], bool]
# What each mapped row becomes, on the chat body sent (or the request's own report).
MAPPED: dict[str, Check] = {
    "messages": lambda chat, _: chat["messages"][0] == {"role": "system", "content": "late"},
    "output_config": lambda chat, _: chat["reasoning_effort"] == "high"
    and chat["response_format"]["json_schema"]["schema"] == SCHEMA["schema"],
    "stop_sequences": lambda chat, _: chat["stop"] == ["END"],
    "system": lambda chat, _: chat["messages"][0] == {"role": "system", "content": "S."},
    "thinking": lambda chat, call: chat["thinking_token_budget"] == 16 and call.show_thinking,
    "tool_choice": lambda chat, _: chat["tool_choice"] == "auto",
    "tools": lambda chat, _: chat["tools"][0]["function"] == {"name": "f",
                                                              "parameters": TOOL["input_schema"]},
    "context_management": lambda _, call: call.context_management == {"applied_edits": []},
    "output_format": lambda chat, _: chat["response_format"]["type"] == "json_schema",
}  # fmt: skip
# What each mapped row of count_tokens becomes: the prompt counted (messages and tools).
COUNTED: dict[str, Check] = {
    "messages": lambda _, call: call.messages[0] == {"role": "system", "content": "late"},
    "system": lambda _, call: call.messages[0] == {"role": "system", "content": "S."},
    "tools": lambda _, call: call.chat["tools"][0]["function"]["name"] == "f",
    "context_management": lambda _, call: call.context_management == {"applied_edits": []},
}
HONOURED_AS = {"stream": True}  # honoured fields the chat body carries in its own spelling


def cases(table: Mapping[str, FieldRule]) -> list[Any]:
    return [pytest.param(name, rule, id=name) for name, rule in table.items()]


def parse(table: Mapping[str, FieldRule], body: dict[str, Any], unknown: str = "ignore") -> Any:
    parser = parse_messages_request if table is MESSAGES else parse_count_tokens_request
    return parser(orjson.dumps(body), unknown)  # type: ignore[arg-type]


def check_row(
    table: Mapping[str, FieldRule], name: str, rule: FieldRule, mapped: dict[str, Check]
) -> None:
    value = SAMPLES.get(name, "x")
    if rule.policy == "refused":
        with pytest.raises(InvalidRequest) as refused:
            parse(table, {**BASE, name: value})
        assert refused.value.param == name and "not supported" in refused.value.message
        for inert in (None, *rule.inert):  # asks for nothing: accepted, not sent on
            call = parse(table, {**BASE, name: inert})
            assert name not in orjson.loads(call.upstream_body) and name not in call.params
        return
    call = parse(table, {**BASE, name: value})
    chat = orjson.loads(call.upstream_body)
    sent = chat if table is MESSAGES else {}  # count_tokens sends only the prompt to count
    assert call.unknown == ()
    if rule.policy == "ignored":
        assert name not in sent and name not in call.params
        assert call == parse(table, BASE)  # no effect at all
    elif rule.policy == "mapped":
        assert mapped[name](chat, call), name
        assert name not in sent or name in rule.to
    else:
        assert chat[name] == HONOURED_AS.get(name, value)


@pytest.mark.parametrize(("name", "rule"), cases(MESSAGES))
def test_every_messages_field_is_treated_as_its_row_says(name: str, rule: FieldRule) -> None:
    check_row(MESSAGES, name, rule, MAPPED)


@pytest.mark.parametrize(("name", "rule"), cases(COUNT_TOKENS))
def test_every_count_tokens_field_is_treated_as_its_row_says(name: str, rule: FieldRule) -> None:
    check_row(COUNT_TOKENS, name, rule, COUNTED)


@pytest.mark.parametrize("table", [MESSAGES, COUNT_TOKENS], ids=["messages", "count_tokens"])
def test_a_field_no_reference_names_is_dropped_and_reported_or_refused(
    table: Mapping[str, FieldRule],
) -> None:
    body = {**BASE, "x_vendor_flag": {"a": 1}}
    accepted = parse(table, body)
    assert accepted.unknown == ("x_vendor_flag",)
    assert "x_vendor_flag" not in orjson.loads(accepted.upstream_body)
    assert "x_vendor_flag" not in accepted.params
    with pytest.raises(InvalidRequest) as refused:
        parse(table, body, "refuse")
    assert refused.value.param == "x_vendor_flag" and "Unknown parameter" in refused.value.message
