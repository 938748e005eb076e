"""The field policy (``gateway.api.fields``) holds the parsers to it, field by field: every row of
each table is sent, and what reaches the engine's body is what the row says. ``ignored`` (and a
refused field's inert value): accepted and not sent on; ``refused``: a 400 naming it;
``honoured``: sent on as given (or, for a field the gateway consumes, consumed); ``mapped``:
what ``to`` names is there instead. A field no row names follows ``UNKNOWN_FIELDS``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.api.chat import parse_chat_request
from gateway.api.completions import parse_completions_request, parse_embeddings_request
from gateway.api.fields import CHAT, COMPLETIONS, EMBEDDINGS, TABLES, FieldRule, markdown_table
from gateway.api.screen import ignored_header, screen
from gateway.errors import InvalidRequest
from tools.fieldsdoc import document

Parse = Callable[..., Any]

BASES: dict[str, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "embeddings": {"model": "m", "input": "hi"},
}
PARSERS: dict[str, tuple[Parse, Mapping[str, FieldRule]]] = {
    "chat": (parse_chat_request, CHAT),
    "completions": (parse_completions_request, COMPLETIONS),
    "embeddings": (parse_embeddings_request, EMBEDDINGS),
}
# A value each validated field takes; every other field is sent the string "x" (the engine,
# not the gateway, judges those).
SAMPLES: dict[str, Any] = {
    "messages": [{"role": "user", "content": "hi"}], "model": "m", "prompt": "hi",
    "input": "hi", "frequency_penalty": 0.5, "presence_penalty": 0.5, "temperature": 0.5,
    "top_p": 0.5, "n": 2, "max_tokens": 8, "max_completion_tokens": 8, "seed": 3,
    "logprobs": True, "top_logprobs": 2, "stream": False, "stream_options": None,
    "include_reasoning": False, "reasoning": {"exclude": True, "effort": "low"},
    "reasoning_effort": "low", "thinking_token_budget": 64, "user": "u-1", "echo": False,
}  # fmt: skip
# Fields the gateway consumes itself (never sent on), and what stands in their place.
CONSUMED = {"include_reasoning": (), "reasoning": ("reasoning_effort",)}


def cases() -> list[Any]:
    return [pytest.param(api, name, rule, id=f"{api}.{name}")
            for api, (_, table) in PARSERS.items() for name, rule in table.items()]  # fmt: skip


def sent(api: str, body: dict[str, Any], unknown: str = "ignore") -> dict[str, Any]:
    parse, _ = PARSERS[api]
    parsed = orjson.loads(parse(orjson.dumps(body), unknown).upstream_body)
    assert isinstance(parsed, dict)
    return parsed


@pytest.mark.parametrize(("api", "name", "rule"), cases())
def test_every_field_is_treated_as_its_row_says(api: str, name: str, rule: FieldRule) -> None:
    value = SAMPLES.get(name, "x")
    body = {**BASES[api], name: value}
    if rule.policy == "refused":
        with pytest.raises(InvalidRequest) as refused:
            sent(api, body)
        assert refused.value.param == name and "not supported" in refused.value.message
        for inert in (None, *rule.inert):  # asks for nothing: accepted, not sent on
            assert name not in sent(api, {**BASES[api], name: inert})
        return
    forwarded = sent(api, body)
    if rule.policy == "ignored":
        assert name not in forwarded
    elif name in CONSUMED:
        assert name not in forwarded and all(k in forwarded for k in CONSUMED[name])
    else:  # honoured, or mapped to the engine's field of that name
        assert forwarded[name] == value or name in ("stream_options",)


@pytest.mark.parametrize("api", list(PARSERS))
def test_a_field_no_reference_names_is_forwarded_and_reported_or_refused(api: str) -> None:
    parse, _ = PARSERS[api]
    raw = orjson.dumps({**BASES[api], "x_vendor_flag": {"a": 1}})
    accepted = parse(raw, "ignore")
    assert accepted.unknown == ("x_vendor_flag",)
    assert orjson.loads(accepted.upstream_body)["x_vendor_flag"] == {"a": 1}
    with pytest.raises(InvalidRequest) as refused:
        parse(raw, "refuse")
    assert refused.value.param == "x_vendor_flag" and "Unknown parameter" in refused.value.message


def test_the_header_names_unknown_fields_bounded_and_printable() -> None:
    body = {f"f{i}\n": i for i in range(40)} | {"é" * 100: 1}
    names = screen(body, {}, "ignore").unknown
    assert len(names) == 16 and all(n.isprintable() for n in names)
    assert ignored_header(()) == ()
    [(header, value)] = ignored_header(("a", "é"))
    assert header == "x-thinkgate-ignored" and value == "a, \\xe9" and value.isascii()


@pytest.mark.parametrize("path", list(TABLES))
def test_each_table_renders_as_the_docs_show_it(path: str) -> None:
    table = markdown_table(TABLES[path])
    for name, rule in TABLES[path].items():
        assert f"`{name}`" in table and rule.policy in table


def test_the_docs_page_is_the_tables() -> None:
    """docs/fields.md is rendered from the tables (``python -m tools.fieldsdoc``)."""
    page = (Path(__file__).parents[3] / "docs" / "fields.md").read_text()
    assert page == document(), "docs/fields.md is stale: python -m tools.fieldsdoc"
