"""What the simulated model thinks and answers: prose about the question asked (sans-I/O).

``compose_text(rng, question, result=None) -> Composition`` (the untokenised reasoning and
answer).

Rules:

- The question is the user's last question (``gateway.side.sim.turn``), a template's special tokens
  (``<think>``, ``<｜User｜>``: anything in angle brackets without spaces) removed. Its subjects
  are its words
  minus function words (``what``, ``is``, ``the`` ...), in order, each once (case-insensitive),
  at most six, a noun keeping the article before it (``"Why is the sky blue?"`` → ``the sky``,
  ``blue``). A question with no such word (``"hi"``, an empty prompt) gets a topic from a small
  built-in list instead, drawn from the seed.
- The reasoning reads like an R1 monologue: it quotes the question (whitespace collapsed, cut
  at 120 characters), then ``Let me think. First,`` an opening step, one to four further steps,
  a doubt (``Wait, ...``) and ``So the answer is ...``. The answer is ``<Subject>: in short,
  <conclusion>.`` (naming the first two subjects) and one or two closing sentences. Those
  markers are fixed, so tests can cut at them (stop strings, budgets).
- After a tool result (``result``: the function's name and its output, ``gateway.side.sim.turn``)
  the reasoning opens with ``the NAME tool returned “FIRST LINE”, and the user asks: ...`` and
  the answer with ``The NAME tool returned “FIRST LINE”.`` (the output's first line with text,
  whitespace collapsed, cut at 120 characters; past an ``Output:`` line if there is one, as
  Codex's ``exec_command`` heads the command's output with its own lines; ``nothing`` for an
  empty output); a question with no subjects takes the first line's. The rest is as without a
  result.
- No sentence repeats: steps, connectors, doubts and closing sentences are drawn without
  replacement, and the subjects they name rotate through the question's.
- Determinism: every draw comes from ``rng`` (seeded by the caller); the same seed and question
  give the same text in every process.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from gateway.side.sim.turn import ToolResult

__all__ = ["FUNCTION_WORDS", "Composition", "compose_text", "subjects"]


@dataclass(frozen=True, slots=True)
class Composition:
    """The untokenised texts a seed produces."""

    reasoning: str
    answer: str


FUNCTION_WORDS = frozenset(
    """a an the and or but if then so of to in on at by for with from about into over under as
    is are was were be been being am do does did doing have has had having can could shall should
    will would may might must what why how when where which who whom whose that this these those
    there here it its it's i me my we our you your he she they them their his her please tell
    explain describe define compare summarise summarize give show us let lets let's not no yes
    hi hello hey thanks thank just some any very much many more most also really
    actually""".split()  # noqa: SIM905 (a word list reads best as text)
)
_ARTICLES = frozenset(("the", "a", "an"))
_WORDS = re.compile(r"[A-Za-z0-9][A-Za-z0-9'+#-]*")
_MARKUP = re.compile(r"<[^<>\s]{1,40}>")  # a template's special tokens: <think>, <｜User｜>
_MAX_SUBJECTS = 6
_QUOTE_CHARS = 120
_OTHER = "the context"

_TOPICS = (
    "prime numbers",
    "the speed of light",
    "binary search",
    "photosynthesis",
    "the Pythagorean theorem",
    "compound interest",
    "TCP handshakes",
    "black holes",
)
_OPENINGS = (
    "I should pin down what {a} means here",
    "the question is really about {a}",
    "I need to recall the basics of {a}",
)
_STEPS = (
    "the question turns on {a}, so that is where to start",
    "{a} and {b} are connected, and the connection is the real question",
    "a concrete case with {a} would make this easier to see",
    "I should separate what is known about {a} from what is only assumed",
    "the usual explanation of {a} starts from one simple mechanism",
    "if {b} were different, the answer would change with it",
    "there may be a common misconception about {a} worth addressing",
    "the user probably wants the reason, not only the fact",
    "a short answer should name the cause and give one example",
    "the finer details of {b} matter less than the main idea",
)
_CONNECTORS = ("Then,", "Also,", "Next,", "Hmm,", "Now,", "Besides,", "Right,")
_DOUBTS = (
    "is that right? Let me check it against what I know about {a}",
    "maybe I misread the question; no, it is about {a}",
    "that seems too simple, but for {a} it holds",
    "I should not overcomplicate {b}",
)
_CONCLUSIONS = (
    "that {a} comes down to one clear cause, with {b} as its visible result",
    "a short explanation of {a} and {b}, followed by an example",
    "that {a} follows from a simple rule once {b} is stated carefully",
    "that {b} is best understood through {a}",
)
_CLOSINGS = (
    "The main idea is what {a} does; the rest follows from it.",
    "An everyday example with {b} shows the same effect.",
    "In practice, that is usually enough to go on.",
    "If you want, I can go deeper into {b}.",
    "A quick check with {a} confirms it.",
)


def subjects(question: str) -> list[str]:
    """The question's content words in order, each once, a noun keeping its article."""
    found: list[str] = []
    seen: set[str] = set()
    previous = ""
    for word in _WORDS.findall(question):
        lower = word.lower()
        if lower not in FUNCTION_WORDS and lower not in seen and not lower.isdigit():
            seen.add(lower)
            found.append(f"{previous} {word}" if previous in _ARTICLES else word)
            if len(found) == _MAX_SUBJECTS:
                break
        previous = lower
    return found


def compose_text(
    rng: random.Random, question: str = "", result: ToolResult | None = None
) -> Composition:
    """The reasoning and answer for ``question``, after ``result`` if the model answers a tool
    result (rules in the module docstring)."""
    found, asks = _framing(rng, question, result)
    names = _Rotation(found)
    count = rng.randint(1, 4)
    steps = [
        f"{connector} {names.fill(step)}."
        for connector, step in zip(
            rng.sample(_CONNECTORS, count), rng.sample(_STEPS, count), strict=True
        )
    ]
    paragraph_break = "\n\n" if rng.random() < 0.5 else " "
    conclusion = _Rotation(found).fill(rng.choice(_CONCLUSIONS))  # the first two subjects
    reasoning = (
        f"Okay, {asks} Let me think. First, {names.fill(rng.choice(_OPENINGS))}. "
        + " ".join(steps)
        + f"{paragraph_break}Wait, {names.fill(rng.choice(_DOUBTS))}. "
        + f"So the answer is {conclusion}."
    )
    closings = " ".join(names.fill(c) for c in rng.sample(_CLOSINGS, rng.randint(1, 2)))
    subject = found[0]
    answer = f"{subject[0].upper()}{subject[1:]}: in short, {_plain(conclusion)}. {closings}"
    if result is not None:
        reported = _reported(result)
        answer = f"{reported[0].upper()}{reported[1:]}. {answer}"
    return Composition(reasoning, answer)


def _framing(rng: random.Random, question: str, result: ToolResult | None) -> tuple[list[str], str]:
    """The subjects, and how the reasoning states what it was asked."""
    question = " ".join(_MARKUP.sub(" ", question).split())
    found = subjects(question)
    told = subjects(_first_line(result.text)) if result is not None else []
    if found:
        asks = f"the user asks: {_quoted(question)}"
    elif told:
        found, asks = told, "the user wants to know what it means."
    else:
        topic = rng.choice(_TOPICS)
        found, asks = [topic], f"the user asks about {topic}."
    if result is not None:
        asks = f"{_reported(result)}, and {asks}"
    return found, asks


def _quoted(text: str) -> str:
    """``text`` in quotes, cut at ``_QUOTE_CHARS``, a full stop after it unless it has one."""
    if len(text) > _QUOTE_CHARS:
        text = text[: _QUOTE_CHARS - 1].rstrip() + "…"
    return f"“{text}”" + ("" if text[-1] in ".?!…" else ".")


def _reported(result: ToolResult) -> str:
    """``the NAME tool returned “FIRST LINE”`` (``nothing`` for an empty result)."""
    line = _first_line(result.text)
    if len(line) > _QUOTE_CHARS:
        line = line[: _QUOTE_CHARS - 1].rstrip() + "…"
    return f"the {result.name} tool returned " + (f"“{line}”" if line else "nothing")


def _first_line(text: str) -> str:
    """The first line with text, whitespace collapsed; past an ``Output:`` line if there is
    one (Codex's ``exec_command`` puts its own header before the command's output)."""
    lines = text.splitlines()
    marker = next((i for i, line in enumerate(lines) if line.strip().lower() == "output:"), -1)
    return next((" ".join(line.split()) for line in lines[marker + 1 :] if line.strip()), "")


def _plain(conclusion: str) -> str:
    """A conclusion as the answer states it (``that x ...`` → ``x ...``)."""
    return conclusion.removeprefix("that ")


class _Rotation:
    """Fills ``{a}`` and ``{b}`` with the next subjects in turn, so sentences name different
    ones (with one subject, ``{b}`` is ``the context``)."""

    def __init__(self, names: list[str]) -> None:
        self._names = names
        self._at = 0

    def fill(self, template: str) -> str:
        a = self._names[self._at % len(self._names)]
        b = self._names[(self._at + 1) % len(self._names)] if len(self._names) > 1 else _OTHER
        self._at += 1
        return template.format(a=a, b=b)
