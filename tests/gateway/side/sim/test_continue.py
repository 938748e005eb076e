"""The simulator continues an assistant turn after its closed reasoning, as vLLM does with
``continue_final_message``: only what follows the close marker, as content."""

from __future__ import annotations

import orjson

from gateway.side.sim.config import SimConfig
from gateway.side.sim.pieces import Piece
from gateway.side.sim.request import parse_chat_request
from gateway.side.sim.script import after_reasoning, build_script


def test_only_what_follows_the_close_marker_is_written() -> None:
    pieces = [Piece("content", t) for t in ("plan", " more", "</th", "ink>", "\n\n", "Hi", "!")]
    assert after_reasoning(pieces, "</think>") == [Piece("content", "Hi"), Piece("content", "!")]
    inside = [Piece("content", "a</think>\n\nb"), Piece("content", "c")]
    assert after_reasoning(inside, "</think>") == [Piece("content", "\n\nb"), Piece("content", "c")]
    separated = [Piece("reasoning", "plan"), Piece("content", "Hi")]
    assert after_reasoning(separated, "</think>") == [Piece("content", "Hi")]


def request(**extra: object) -> bytes:
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "<think>\nplan\n</think>\n\n"}]  # fmt: skip
    return orjson.dumps({"model": "deepseek-r1-parsed", "messages": messages, **extra})


def test_a_continuation_is_recognised_only_after_a_closed_reasoning() -> None:
    config = SimConfig()
    assert parse_chat_request(request(continue_final_message=True), config).continuing
    assert not parse_chat_request(request(), config).continuing
    open_turn = orjson.loads(request(continue_final_message=True))
    open_turn["messages"][-1]["content"] = "<think>\nplan"
    assert not parse_chat_request(orjson.dumps(open_turn), config).continuing


def test_a_continued_separated_turn_is_all_content() -> None:
    script = build_script("separated", 7, prompt_tokens=5, continuing=True)
    assert script.pieces and {p.channel for p in script.pieces} == {"content"}
    assert script.finish_reason == "stop"
