"""The simulated model's text is about the question asked and reads like prose
(``gateway.side.sim.prose``): built from the question's words, no sentence twice, deterministic."""

from __future__ import annotations

import random
import re

import pytest

from gateway.side.sim.prose import compose_text, subjects
from gateway.side.sim.script import compose
from gateway.side.sim.turn import ToolResult

QUESTIONS = [
    "Why is the sky blue?",
    "Explain TCP handshakes",
    "How do I sort a list in Python?",
    "What is the boiling point of water at altitude?",
    "Compare Rust and Go for a network service.",
]


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.?!”])\s+", text.strip()) if s]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("Why is the sky blue?", ["the sky", "blue"]),
        ("Explain TCP handshakes", ["TCP", "handshakes"]),
        ("How do I sort a list in Python?", ["sort", "a list", "Python"]),
        ("What is 6 times 7?", ["times"]),
        ("Define entropy, please", ["entropy"]),
        ("hi", []),
        ("", []),
        ("the THE The sky sky", ["the sky"]),
    ],
)
def test_subjects_are_the_questions_content_words(question: str, expected: list[str]) -> None:
    assert subjects(question) == expected


def test_the_reasoning_and_the_answer_are_about_the_question() -> None:
    text = compose_text(random.Random(7), "Why is the sky blue?")
    assert text.reasoning.startswith("Okay, the user asks: “Why is the sky blue?” Let me think.")
    for word in ("the sky", "blue"):
        assert word in text.reasoning and word in text.answer
    assert text.answer.startswith("The sky: in short, ")
    for topic in ("binary search", "prime numbers", "photosynthesis"):  # the old fixed topics
        assert topic not in text.reasoning + text.answer


@pytest.mark.parametrize("question", QUESTIONS)
def test_no_sentence_is_said_twice(question: str) -> None:
    for seed in range(200):
        text = compose_text(random.Random(seed), question)
        said = sentences(text.reasoning) + sentences(text.answer.split(": in short, ", 1)[1])
        assert len(said) == len(set(said)), (seed, said)


@pytest.mark.parametrize("question", QUESTIONS)
def test_the_markers_tests_cut_at_come_in_order(question: str) -> None:
    for seed in range(50):
        reasoning = compose(seed, question).reasoning
        at = [reasoning.index(m) for m in ("Let me think.", "First,", "Wait,", "So the answer is")]
        assert at == sorted(at), (seed, reasoning)
        assert ": in short, " in compose(seed, question).answer


def test_same_seed_and_question_same_text_otherwise_not() -> None:
    assert compose(3, "Why is the sky blue?") == compose(3, "Why is the sky blue?")
    assert compose(3, "Why is the sky blue?") != compose(4, "Why is the sky blue?")
    assert compose(3, "Why is the sky blue?") != compose(3, "Why is the sea salty?")


def test_template_tokens_are_not_quoted_or_talked_about() -> None:
    text = compose(1, "<｜User｜>What is 6 times 7?<｜Assistant｜><think>\n")
    assert "“What is 6 times 7?”" in text.reasoning
    assert "<" not in text.reasoning + text.answer and "User" not in text.reasoning


def test_a_question_without_content_words_gets_a_topic_of_its_own() -> None:
    text = compose(5, "hi")
    assert re.match(r"Okay, the user asks about [\w ]+\. Let me think\.", text.reasoning)
    assert "“" not in text.reasoning


def test_a_long_question_is_quoted_cut() -> None:
    question = "Please summarise " + "the history of the Roman republic " * 20
    text = compose(2, question)
    quoted = text.reasoning.split("“", 1)[1].split("”", 1)[0]
    assert len(quoted) <= 120 and quoted.endswith("…")
    assert "\n" not in quoted


def test_after_a_tool_result_both_texts_report_its_first_line() -> None:
    result = ToolResult("Bash", "\n  README.md   src\ntests\n")
    text = compose(3, "list the files here", result)
    assert text.reasoning.startswith(
        "Okay, the Bash tool returned “README.md src”, and the user asks: “list the files here”."
        " Let me think."
    )
    assert text.answer.startswith("The Bash tool returned “README.md src”. ")
    plain = compose(3, "list the files here")
    assert text.answer.endswith(plain.answer)  # the rest as without a result
    assert "tests" not in text.answer  # the first line only


def test_codexs_command_header_is_skipped() -> None:
    output = "Chunk ID: 430a3f\nWall time: 0.0000 seconds\nProcess exited with code 0\n"
    output += "Output:\nhello.txt\n"
    answer = compose(1, "list the files here", ToolResult("exec_command", output)).answer
    assert answer.startswith("The exec_command tool returned “hello.txt”. ")


def test_an_empty_result_returned_nothing_and_a_long_one_is_cut() -> None:
    assert compose(1, "go on", ToolResult("Read", "  \n")).answer.startswith(
        "The Read tool returned nothing. "
    )
    long = compose(1, "go on", ToolResult("Read", "x" * 500)).answer
    assert long.startswith(f"The Read tool returned “{'x' * 119}…”. ")


def test_a_question_without_subjects_talks_about_the_result() -> None:
    text = compose(2, "hi", ToolResult("get_weather", "Sunny in Paris"))
    assert text.answer.startswith("The get_weather tool returned “Sunny in Paris”. Sunny: in short")
    for topic in ("binary search", "prime numbers", "photosynthesis"):  # no topic drawn
        assert topic not in text.reasoning + text.answer
