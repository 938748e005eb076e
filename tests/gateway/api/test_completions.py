"""The legacy completions and the embeddings requests at the edge: the prompt and input shapes,
the bounds of ``n`` and ``max_tokens``, and what goes upstream."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.completions import (
    CompletionsRequest,
    parse_completions_request,
    parse_embeddings_request,
)
from gateway.errors import InvalidRequest

PROMPTS = ["Once upon", "", ["a", "b"], ["only"], [1, 2, 3], [7], [[1, 2], [3]], [[4]]]
NOT_PROMPTS = [..., None, 5, [], ["a", 1], [1, "a"], [[1], "a"], [[]], [[1], []], [True],
               [1.5], [[1, True]], {"text": "a"}, [["a"]]]  # fmt: skip


def body(**fields: Any) -> bytes:
    out = {"model": "m", "prompt": "hi", **fields}
    return orjson.dumps({k: v for k, v in out.items() if v is not ...})


def parsed(**fields: Any) -> CompletionsRequest:
    return parse_completions_request(body(**fields))


def sent(**fields: Any) -> dict[str, Any]:
    return orjson.loads(parsed(**fields).upstream_body)


def refused(raw: bytes, parse: Any = parse_completions_request) -> str | None:
    with pytest.raises(InvalidRequest) as info:
        parse(raw)
    assert info.value.status == 400
    return info.value.param


@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompt_shapes_are_accepted_and_sent_as_they_came(prompt: Any) -> None:
    call = parsed(prompt=prompt)
    assert call.prompt == prompt and sent(prompt=prompt)["prompt"] == prompt
    assert call.messages == [{"role": "prompt", "content": prompt}]
    assert "prompt" not in call.params and call.params["model"] == "m"


@pytest.mark.parametrize("prompt", NOT_PROMPTS)
def test_other_prompts_are_refused(prompt: Any) -> None:
    assert refused(body(prompt=prompt)) == "prompt"


@pytest.mark.parametrize(
    ("prompt", "text"),
    [("Q: <think>\n", "Q: <think>\n"), (["one"], "one"), (["a", "b"], None), ([1, 2], None),
     ([[1, 2]], None), ([7], None), ("", "")],
)  # fmt: skip
def test_prompt_text_is_the_one_string(prompt: Any, text: str | None) -> None:
    assert parsed(prompt=prompt).prompt_text == text


@pytest.mark.parametrize(("value", "n"), [(..., 1), (None, 1), (1, 1), (16, 16)])
def test_n_defaults_to_one_and_goes_to_sixteen(value: Any, n: int) -> None:
    assert parsed(n=value).n == n


@pytest.mark.parametrize(("name", "value"), [
    ("n", 0), ("n", 17), ("n", True), ("n", "2"), ("n", 2.0),
    ("max_tokens", 0), ("max_tokens", 1_000_001), ("max_tokens", 8.0), ("max_tokens", False),
    ("stream", "true"), ("stream", 1), ("include_reasoning", "no"), ("include_reasoning", 0),
    ("model", ""), ("model", 5), ("model", ...), ("model", "m" * 257),
])  # fmt: skip
def test_bad_fields_are_refused_by_name(name: str, value: Any) -> None:
    assert refused(body(**{name: value})) == name


@pytest.mark.parametrize(("value", "expected"), [(..., None), (1, 1), (1_000_000, 1_000_000)])
def test_max_tokens_is_optional_and_bounded(value: Any, expected: int | None) -> None:
    assert parsed(max_tokens=value).max_tokens == expected


@pytest.mark.parametrize("raw", [b"{", b'"prompt"', b"[]"])
def test_a_body_that_is_no_json_object_is_refused(raw: bytes) -> None:
    assert refused(raw) is None


def test_include_reasoning_lowers_visibility_and_is_not_sent() -> None:
    call = parsed(include_reasoning=False)
    assert not call.wants_reasoning and "include_reasoning" not in orjson.loads(call.upstream_body)
    assert "include_reasoning" not in call.params
    assert parsed().wants_reasoning and parsed(include_reasoning=True).wants_reasoning


@pytest.mark.parametrize(
    ("options", "asked", "upstream"),
    [
        (..., False, {"include_usage": True}),
        (None, False, {"include_usage": True}),
        ({"include_usage": False}, False, {"include_usage": True}),
        ({"include_usage": True}, True, {"include_usage": True}),
        ({"continuous_usage_stats": True}, False,
         {"continuous_usage_stats": True, "include_usage": True}),
        ("yes", False, {"include_usage": True}),
    ],
)  # fmt: skip
def test_a_stream_always_asks_for_usage_and_remembers_the_clients_wish(
    options: Any, asked: bool, upstream: dict[str, Any]
) -> None:
    call = parsed(stream=True, stream_options=options)
    assert call.stream and call.include_usage is asked
    assert orjson.loads(call.upstream_body)["stream_options"] == upstream
    assert call.params["stream_options"] == upstream


def test_a_whole_completion_leaves_stream_options_alone() -> None:
    call = parsed(stream_options={"include_usage": True})
    assert not call.stream and call.include_usage
    assert sent(stream_options={"include_usage": False})["stream_options"] == {
        "include_usage": False
    }
    assert "stream_options" not in sent() and not parsed(stream=None).stream


def test_every_other_field_passes_through_and_echo_is_read() -> None:
    extras = {"stop": ["\n"], "logprobs": 2, "suffix": "!", "echo": True, "min_p": 0.1,
              "max_tokens": 9, "n": 2, "temperature": 0}  # fmt: skip
    call = parsed(**extras)
    assert orjson.loads(call.upstream_body) == {"model": "m", "prompt": "hi", **extras}
    assert (call.echo, call.max_tokens, call.n, call.stream) == (True, 9, 2, False)
    assert not parsed(echo="yes").echo and not parsed().echo


@pytest.mark.parametrize(
    ("given", "inputs"),
    [("hello", 1), (["a", "b", "c"], 3), ([1, 2, 3], 1), ([[1, 2], [3]], 2), ([""], 1)],
)
def test_embeddings_inputs_are_counted_and_the_body_sent_as_it_came(
    given: Any, inputs: int
) -> None:
    raw = b'{"model": "e", "input": ' + orjson.dumps(given) + b', "encoding_format": "float"}'
    call = parse_embeddings_request(raw)
    assert (call.model, call.inputs, call.upstream_body) == ("e", inputs, raw)
    assert call.messages == [{"role": "input", "content": given}]
    assert call.params == {"model": "e", "encoding_format": "float"}
    assert (call.stream, call.n, call.max_tokens) == (False, 1, None)


@pytest.mark.parametrize("given", [..., "", [], None, 3, ["a", 1], [[1], []], [[]], {"a": 1}])
def test_other_embeddings_inputs_are_refused(given: Any) -> None:
    fields = {"model": "e"} | ({} if given is ... else {"input": given})
    assert refused(orjson.dumps(fields), parse_embeddings_request) == "input"
    assert refused(b'{"input": "x"}', parse_embeddings_request) == "model"
