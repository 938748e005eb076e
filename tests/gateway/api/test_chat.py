"""The chat request at the edge: what is forwarded, and thinking-off forwarded as decided."""

from __future__ import annotations

import orjson

from gateway.api.chat import parse_chat_request


def body(**fields: object) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_gateway_directives_are_not_forwarded_and_usage_is_always_asked_for() -> None:
    chat = parse_chat_request(body(stream=True, include_reasoning=False, top_k=5))
    sent = orjson.loads(chat.upstream_body)
    assert "include_reasoning" not in sent and sent["top_k"] == 5
    assert sent["stream_options"] == {"include_usage": True}
    assert not chat.wants_reasoning and not chat.include_usage


def test_thinking_off_reaches_the_engine_with_every_switch_false() -> None:
    chat = parse_chat_request(
        body(reasoning_effort="none", chat_template_kwargs={"custom": 1, "thinking": None})
    )
    off = chat.without_thinking(("thinking", "enable_thinking"))
    sent = orjson.loads(off.upstream_body)
    assert sent["chat_template_kwargs"] == {
        "custom": 1,
        "thinking": False,
        "enable_thinking": False,
    }
    assert sent["messages"] == chat.messages and sent["reasoning_effort"] == "none"
    assert off.params["chat_template_kwargs"] == sent["chat_template_kwargs"]  # the record's
    assert chat.without_thinking(()) is chat  # a format without switches: nothing to forward
