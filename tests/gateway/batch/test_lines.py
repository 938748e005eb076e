"""Batch input read line by line (``gateway.batch.lines``): the first bad line named, with
what is wrong; OpenAI's files and Anthropic's ``requests``."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.batch.lines import BadLine, anthropic_lines, check_jsonl, decode_line, encode_lines
from gateway.batch.lines import openai_lines as read_lines

CHAT = "/v1/chat/completions"


def line(custom_id: str = "a", **changes: Any) -> bytes:
    item = {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": "m", "messages": []}, **changes}  # fmt: skip
    return orjson.dumps(item)


def test_a_good_file_is_counted_skipping_blank_lines() -> None:
    assert check_jsonl(line("a") + b"\n\n" + line("b") + b"\n") == 2
    found = read_lines(line("a") + b"\n" + line("b"), CHAT, 10)
    assert [x.custom_id for x in found] == ["a", "b"]
    assert [decode_line(raw) for raw in encode_lines(found)] == found


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        (b"{nope", None),
        (b"[1]", None),
        (line(""), "custom_id"),
        (line(method="GET"), "method"),
        (line(url="/v1/images"), "url"),
        (line(body="x"), "body"),
        (line(body={"model": "m", "stream": True}), "body.stream"),
        (line(body={"model": "m", "background": True}), "body.background"),
    ],
)  # fmt: skip
def test_the_first_bad_line_is_named(bad: bytes, param: str | None) -> None:
    with pytest.raises(BadLine) as found:
        check_jsonl(line("a") + b"\n" + bad + b"\n" + line("c"))
    assert (found.value.line, found.value.param) == (2, param)
    assert str(found.value).startswith("Line 2: ")


def test_a_batch_needs_one_endpoint_unique_ids_and_a_bound() -> None:
    with pytest.raises(BadLine) as other:
        read_lines(line("a") + b"\n" + line("b", url="/v1/embeddings"), CHAT, 10)
    assert (other.value.line, other.value.param) == (2, "url")
    with pytest.raises(BadLine) as twice:
        read_lines(line("a") + b"\n" + line("a"), CHAT, 10)
    assert (twice.value.line, twice.value.param) == (2, "custom_id")
    with pytest.raises(BadLine):
        read_lines(b"\n".join(line(str(i)) for i in range(3)), CHAT, 2)
    with pytest.raises(BadLine):
        check_jsonl(b"  \n")
    with pytest.raises(BadLine):
        check_jsonl(b"\xff\xfe")


def test_message_batch_requests() -> None:
    good = {"custom_id": "a-1_B", "params": {"model": "m", "max_tokens": 1, "messages": []}}
    [found] = anthropic_lines([good], 10)
    assert (found.custom_id, found.url) == ("a-1_B", "/v1/messages")
    for bad, param in [
        ([], "requests"),
        ([{**good, "custom_id": "has space"}], "requests.0.custom_id"),
        ([{**good, "custom_id": "x" * 65}], "requests.0.custom_id"),
        ([good, good], "requests.1.custom_id"),
        ([{"custom_id": "a"}], "requests.0.params"),
        ([{**good, "params": {"stream": True}}], "requests.0.params.stream"),
    ]:  # fmt: skip
        with pytest.raises(BadLine) as refused:
            anthropic_lines(bad, 10)
        assert refused.value.param == param, bad
