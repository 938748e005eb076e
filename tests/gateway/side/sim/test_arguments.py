"""A call's arguments sampled from the tool's schema (``gateway.side.sim.arguments``): every sample
validates against its schema (checked with ``jsonschema``), hints land where the schema takes
them."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from gateway.side.sim.arguments import sample_arguments
from gateway.side.sim.fit import hints_for

HINTS = hints_for("list the files here")
TODOS = {  # Claude Code's TodoWrite
    "type": "object",
    "properties": {"todos": {"type": "array", "items": {
        "type": "object",
        "properties": {"content": {"type": "string", "minLength": 1},
                       "status": {"type": "string", "enum": ["pending", "in_progress"]},
                       "id": {"type": "string"}},
        "required": ["content", "status", "id"], "additionalProperties": False}}},
    "required": ["todos"],
    "additionalProperties": False,
    "$schema": "http://json-schema.org/draft-07/schema#",
}  # fmt: skip
PYDANTIC = {  # a pydantic model with a nested model and an optional field
    "$defs": {"Point": {"properties": {"x": {"type": "integer", "minimum": 5},
                                       "y": {"type": "number", "exclusiveMaximum": 0}},
                        "required": ["x", "y"], "type": "object"}},
    "properties": {"at": {"$ref": "#/$defs/Point"},
                   "label": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 2}]},
                   "when": {"type": "string", "format": "date-time"},
                   "site": {"type": "string", "format": "uri"}},
    "required": ["at", "label", "when", "site"],
    "type": "object",
}  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        pytest.param({}, {}, id="empty"),
        pytest.param({"type": "object", "properties": {"a": {"type": "string"}}}, {},
                     id="optional-left-out"),
        pytest.param({"properties": {"command": {"type": "string"}}, "required": ["command"]},
                     {"command": "ls"}, id="command-string"),
        pytest.param({"properties": {"command": {"type": "array", "items": {"type": "string"}}},
                      "required": ["command"]}, {"command": ["ls"]}, id="command-array"),
        pytest.param({"properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
                      "required": ["cmd"]}, {"cmd": "ls"}, id="cmd"),
        pytest.param({"properties": {"command": {"enum": ["start", "stop"]}},
                      "required": ["command"]}, {"command": "start"}, id="enum-beats-hint"),
        pytest.param({"properties": {"n": {"type": "integer", "minimum": 3, "maximum": 9},
                                     "m": {"type": "number", "exclusiveMinimum": 1}},
                      "required": ["n", "m"]}, {"n": 3, "m": 2}, id="bounds"),
        pytest.param({"properties": {"s": {"type": "string", "minLength": 5},
                                     "t": {"type": "string", "maxLength": 1}},
                      "required": ["s", "t"]}, {"s": "simmm", "t": "s"}, id="lengths"),
        pytest.param({"properties": {"k": {"const": 7}, "v": {"type": ["null", "boolean"]}},
                      "required": ["k", "v"]}, {"k": 7, "v": True}, id="const-and-type-list"),
        pytest.param({"properties": {"to": {"type": "string", "allOf": [
            {"pattern": "^[^\\n]*$"}, {"maxLength": 300}]}}, "required": ["to"]},
            {"to": "sim"}, id="all-of-keeps-the-type"),
        pytest.param({"properties": {"xs": {"type": "array", "minItems": 2,
                                            "items": {"type": "boolean"}}},
                      "required": ["xs"]}, {"xs": [True, True]}, id="min-items"),
        pytest.param(TODOS, {"todos": [{"content": "sim", "status": "pending", "id": "sim"}]},
                     id="todo-write"),
        pytest.param(PYDANTIC, {"at": {"x": 5, "y": -1}, "label": "si",
                                "when": "2025-01-01T00:00:00Z", "site": "https://example.com"},
                     id="pydantic"),
    ],
)  # fmt: skip
def test_samples_are_valid_and_take_the_hints(
    schema: dict[str, Any], expected: dict[str, Any]
) -> None:
    sampled = sample_arguments(schema, HINTS)
    assert sampled == expected
    jsonschema.validate(sampled, schema, format_checker=jsonschema.FormatChecker())


def test_a_recursive_schema_ends_in_null() -> None:
    sampled: Any = sample_arguments({"properties": {"me": {"$ref": "#"}}, "required": ["me"]}, {})
    depth = 0
    while sampled is not None:
        sampled, depth = sampled["me"], depth + 1
    assert depth == 9  # the arguments and eight levels below them


def test_a_hint_split_as_a_shell_splits_it() -> None:
    schema = {"properties": {"command": {"type": "array", "items": {"type": "string"}}},
              "required": ["command"]}  # fmt: skip
    assert sample_arguments(schema, {"command": "grep -rn 'a b' ."}) == {
        "command": ["grep", "-rn", "a b", "."]
    }
    assert sample_arguments(schema, {"command": "echo 'unclosed"}) == {
        "command": ["echo", "'unclosed"]
    }
    assert sample_arguments(schema, {"command": "cat README*"}) == {  # a glob needs a shell
        "command": ["bash", "-lc", "cat README*"]
    }
