"""``truncated`` (``gateway.api.room``, ``truncation: "auto"``): the oldest turns dropped, whole,
until the prompt estimate leaves the reserve; instructions and the last message always kept."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.api.room import truncated


def turn(role: str, text: str, **more: Any) -> dict[str, Any]:
    return {"role": role, "content": text, **more}


SYSTEM = turn("system", "Be brief.")
LONG = "x" * 4000  # about 1,000 tokens


def conversation() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [SYSTEM, turn("user", LONG), turn("assistant", LONG),
            turn("user", "q2"), turn("assistant", "", tool_calls=[call]),
            turn("tool", LONG, tool_call_id="c1"), turn("assistant", "a2"),
            turn("user", "last")]  # fmt: skip


def test_a_prompt_that_fits_is_left_whole() -> None:
    messages = conversation()
    assert truncated(messages, 100, context=100_000, reserve=1000) == (messages, 0)


def test_the_oldest_turns_go_until_the_reserve_is_left() -> None:
    messages = conversation()
    kept, dropped = truncated(messages, 100, context=2_000, reserve=500)
    assert dropped == 2 and kept == [SYSTEM, *messages[3:]]  # the first user turn and its answer
    assert len(orjson.dumps(kept)) // 4 + 25 <= 2_000 - 500


def test_a_tool_result_never_stays_without_its_call_and_the_rest_starts_with_a_user() -> None:
    messages = conversation()
    kept, dropped = truncated(messages, 100, context=1_000, reserve=500)
    assert kept == [SYSTEM, turn("user", "last")] and dropped == 6


def test_the_instructions_and_the_last_message_stay_even_when_nothing_fits() -> None:
    messages = [SYSTEM, turn("user", LONG), turn("user", LONG)]
    kept, dropped = truncated(messages, 100, context=500, reserve=400)
    assert kept == [SYSTEM, messages[-1]] and dropped == 1
