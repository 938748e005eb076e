"""Which tool fits a question (``gateway.side.sim.fit``), against tool sets shaped as the agent
clients send them (names, descriptions and required properties as Claude Code 2.1 and Codex
CLI 0.1xx declare them), and the arguments the question suggests."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.side.sim.arguments import sample_arguments
from gateway.side.sim.fit import Tool, fit_tool, hints_for


def tool(name: str, about: str, **required: Any) -> Tool:
    """A tool described by ``about``, requiring ``required`` (name → property schema)."""
    return Tool(name, about, {"type": "object", "properties": required,
                              "required": list(required)})  # fmt: skip


STRING = {"type": "string"}
CLAUDE_CODE = [
    tool("Agent", "Launch a new agent to handle complex, multi-step tasks. Each agent ...",
         description=STRING, prompt=STRING),
    tool("Bash", "Executes a bash command and returns its output.\n\n- `cd` carries ...",
         command=STRING),
    tool("CronList", "List all cron jobs scheduled via CronCreate, both durable and session."),
    tool("Edit", "Performs exact string replacement in a file.\n\n- You must Read the file",
         file_path=STRING, old_string=STRING, new_string=STRING),
    tool("ListAgents", "Lists agents you can SendMessage to — in-process subagents ..."),
    tool("Read", "Reads a file from the local filesystem.\n\n- `file_path` must be absolute.",
         file_path=STRING),
    tool("WebFetch", "Fetches a URL, converts the page to markdown, and answers `prompt`.",
         url=STRING, prompt=STRING),
    tool("WebSearch", "Search the web. Returns result blocks with titles and URLs.",
         query=STRING),
    tool("Write", "Writes a file to the local filesystem, overwriting if one exists.",
         file_path=STRING, content=STRING),
]  # fmt: skip
WITH_LS = [*CLAUDE_CODE, tool("Glob", "- Fast file pattern matching tool", pattern=STRING),
           tool("LS", "Lists files and directories in a given path.", path=STRING)]  # fmt: skip
CODEX = [
    tool("exec_command", "Runs a command in a PTY, returning output or a session ID.",
         cmd=STRING),
    tool("write_stdin", "Writes characters to an existing unified exec session.",
         session_id={"type": "number"}),
    tool("view_image", "View a local image file from the filesystem.", path=STRING),
]  # fmt: skip
OLD_CODEX = [
    tool("shell", "Runs a shell command and returns its output.",
         command={"type": "array", "items": STRING}),
    tool("update_plan", "Updates the task plan.", plan={"type": "array", "items": STRING}),
]  # fmt: skip
WEATHER = [
    tool("get_time", "The time in a time zone.", tz=STRING),
    tool("get_weather", "The weather in a city.", city=STRING),
]


def called(question: str, tools: list[Tool]) -> tuple[str, dict[str, Any]] | None:
    found = fit_tool(question, tools)
    if found is None:
        return None
    return found.name, sample_arguments(found.parameters, hints_for(question))


@pytest.mark.parametrize(
    ("question", "tools", "expected"),
    [
        ("list the files here", CLAUDE_CODE, ("Bash", {"command": "ls"})),
        ("What files are in this project?", CLAUDE_CODE, ("Bash", {"command": "ls"})),
        ("list the files here", WITH_LS, ("LS", {"path": "sim"})),
        ("list the files here", CODEX, ("exec_command", {"cmd": "ls"})),
        ("list the files here", OLD_CODEX, ("shell", {"command": ["ls"]})),
        ("Read the README.", CLAUDE_CODE, ("Read", {"file_path": "sim"})),
        ("read the README", CODEX, ("exec_command", {"cmd": "cat README*"})),
        ("read the README", OLD_CODEX, ("shell", {"command": ["bash", "-lc", "cat README*"]})),
        ("What does gateway/app.py do?", OLD_CODEX,
         ("shell", {"command": ["cat", "gateway/app.py"]})),
        ('search for "parse_chat_request"', CODEX,
         ("exec_command", {"cmd": "grep -rn parse_chat_request ."})),
        ("find TODO in the code", CLAUDE_CODE, ("Bash", {"command": "grep -rn TODO ."})),
        ("search the web for llamas", CLAUDE_CODE, ("WebSearch", {"query": "llamas"})),
        ("Summarise https://example.org/a.html", CLAUDE_CODE,
         ("WebFetch", {"url": "https://example.org/a.html",
                       "prompt": "Summarise https://example.org/a.html"})),
        ("please run `make test`", CLAUDE_CODE, ("Bash", {"command": "make test"})),
        ("What is the weather in Paris?", WEATHER, ("get_weather", {"city": "sim"})),
        ("What time is it in Tokyo?", WEATHER, ("get_time", {"tz": "sim"})),
        ("What is the weather in Paris?", [*CLAUDE_CODE, *WEATHER],
         ("get_weather", {"city": "sim"})),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)  # fmt: skip
def test_the_tool_that_fits_and_its_arguments(
    question: str, tools: list[Tool], expected: tuple[str, dict[str, Any]]
) -> None:
    assert called(question, tools) == expected


@pytest.mark.parametrize(
    "question",
    [
        "Why is the sky blue?",
        "What is a prime number?",
        "hi",
        "",
        "How do I sort a list in Python?",  # "list" is a verb here, not CronList's
        "Write a poem about the sea",  # no Write call for a poem
        "What is a file descriptor?",  # one file, no listing verb
        "What time is it in Tokyo?",  # "time" is in a description only once: chance
    ],
)
@pytest.mark.parametrize("tools", [CLAUDE_CODE, CODEX], ids=["claude-code", "codex"])
def test_nothing_fits_a_question_no_tool_serves(question: str, tools: list[Tool]) -> None:
    assert fit_tool(question, tools) is None


def test_a_url_wants_a_fetch_tool_never_a_shell() -> None:
    assert fit_tool("fetch https://example.org", CODEX) is None


def test_no_tools_no_fit() -> None:
    assert fit_tool("list the files here", []) is None


def test_the_earlier_tool_wins_a_tie() -> None:
    twins = [tool("weather_now", "Now."), tool("weather_later", "Later.")]
    assert called("weather?", twins) == ("weather_now", {})
    assert called("weather?", twins[::-1]) == ("weather_later", {})


def test_hints_without_an_intent() -> None:
    assert hints_for("Why is the sky blue?") == {
        "command": "ls", "cmd": "ls", "pattern": "*", "url": "https://example.com",
        "query": "Why is the sky blue?", "prompt": "Why is the sky blue?",
    }  # fmt: skip
