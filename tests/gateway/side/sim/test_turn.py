"""Where a conversation stands (``gateway.side.sim.turn``): the user's question without the context
agent clients wrap around it, and whether the model answers a question or a tool result."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.side.sim.turn import NextTurn, ToolResult, read_turn, strip_wrappers

REMINDER = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:"
    "\n# important-instruction-reminders\nDo what has been asked; nothing more, nothing less.\n"
    "</system-reminder>"
)
ENVIRONMENT = (
    "<environment_context>\n  <cwd>/home/me/project</cwd>\n  <shell>bash</shell>\n"
    "</environment_context>"
)
CALL = {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def text(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(f"{REMINDER}\nlist the files here", "list the files here", id="before"),
        pytest.param(f"Why is the sky blue?\n\n{REMINDER}\n", "Why is the sky blue?", id="after"),
        pytest.param(f"{ENVIRONMENT}\n{REMINDER}\nhi", "hi", id="two-blocks"),
        pytest.param(
            "<permissions instructions>\nread-only\n</permissions instructions>\nok",
            "ok",
            id="a-tag-with-a-space",
        ),
        pytest.param(
            "<user_instructions>\n<INSTRUCTIONS>\nbe brief\n</INSTRUCTIONS>\n</user_instructions>",
            "",
            id="nested-only-wrappers",
        ),
        pytest.param(
            "What does <code>zip</code> do?", "What does <code>zip</code> do?", id="inline-tag"
        ),
        pytest.param("<system-reminder>never closed\nhi", "<system-reminder>never closed\nhi",
                     id="unclosed"),
    ],
)  # fmt: skip
def test_wrapper_blocks_are_removed_and_inline_tags_kept(given: str, expected: str) -> None:
    assert strip_wrappers(given) == expected


def test_claude_codes_first_turn_asks_the_question_after_its_reminder() -> None:
    # the shape Claude Code sends: reminder parts around the prompt, a system message last
    messages = [
        {"role": "system", "content": "You are Claude Code."},
        user([text(REMINDER), text("list the files here"), text(REMINDER)]),
        {"role": "system", "content": "# Environment\n - Platform: linux"},
    ]
    assert read_turn(messages) == NextTurn("list the files here", asks=True)


def test_codexs_context_messages_are_not_the_question() -> None:
    instructions = "<user_instructions>\nbe terse\n</user_instructions>"
    messages = [
        {"role": "developer", "content": "You are a coding agent running in the Codex CLI."},
        user([{"type": "input_text", "text": instructions}]),
        user([{"type": "input_text", "text": ENVIRONMENT}]),
        user([{"type": "input_text", "text": "Why is the sky blue?"}]),
    ]  # fmt: skip
    assert read_turn(messages) == NextTurn("Why is the sky blue?", asks=True)


@pytest.mark.parametrize(
    "after",
    [
        pytest.param([], id="result-last"),
        pytest.param([user(REMINDER)], id="reminder-only-user-message-after-it"),
        pytest.param([user([text(REMINDER)]), {"role": "system", "content": "s"}],
                     id="reminder-and-system-after-it"),
    ],
)  # fmt: skip
def test_a_tool_result_is_answered_named_after_its_call(after: list[Any]) -> None:
    messages = [
        user(f"{REMINDER}\nlist the files here"),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "toolu_1",
         "content": f"README.md\nsrc\n{REMINDER}"},
        *after,
    ]  # fmt: skip
    result = ToolResult("Bash", "README.md\nsrc")
    assert read_turn(messages) == NextTurn("list the files here", asks=False, result=result)


def test_the_latest_result_of_several_and_its_parts() -> None:
    second = {**CALL, "id": "toolu_2", "function": {"name": "Read", "arguments": "{}"}}
    messages = [
        user("go"),
        {"role": "assistant", "content": None, "tool_calls": [CALL, second]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "first"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": [text("line 1"), text("line 2")]},
    ]
    assert read_turn(messages).result == ToolResult("Read", "line 1\nline 2")


def test_a_result_that_is_all_wrapper_keeps_its_text() -> None:
    error = "<tool_use_error>File does not exist.</tool_use_error>"
    messages = [user("go"), {"role": "tool", "tool_call_id": "x", "content": error}]
    assert read_turn(messages).result == ToolResult("tool", "File does not exist.")


def test_a_result_of_no_known_call_is_the_tools() -> None:
    messages = [user("go"), {"role": "tool", "tool_call_id": "x", "content": "ok"}]
    assert read_turn(messages).result == ToolResult("tool", "ok")


def test_a_new_question_after_a_result_is_asked() -> None:
    messages = [
        user("list the files here"),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "README.md"},
        user([text(REMINDER), text("now read it")]),
    ]
    assert read_turn(messages) == NextTurn("now read it", asks=True)


def test_an_assistant_message_last_is_no_question() -> None:
    messages = [user("Why?"), {"role": "assistant", "content": "Because"}]
    assert read_turn(messages) == NextTurn("Why?", asks=False)


def test_no_user_text_at_all() -> None:
    assert read_turn([{"role": "system", "content": "s"}, user(REMINDER)]) == NextTurn("")
