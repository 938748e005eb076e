"""What the simulated model says: a deterministic plan of tokens (sans-I/O).

``build_script(mode, seed, prompt_tokens=..., max_tokens=...)`` returns a ``Script``: a tuple of
``Piece(channel, text)``, one piece per token, plus the token counts and the finish reason.

Rules:

- Determinism: everything is drawn from one ``random.Random(seed)``: first the texts (an R1-style
  reasoning monologue and an answer, from small built-in word lists), then the tokenisation. The
  same seed always gives the same pieces; the process-global ``random`` is never touched.
- Modes (how the raw model output reaches the client, per vLLM)::

    template   content: reasoning + "\\n</think>\\n\\n" + answer    (R1: the template opened it)
    tags       content: "<think>\\n" + reasoning + "\\n</think>\\n\\n" + answer
    separated  reasoning: reasoning; content: answer   (vLLM --reasoning-parser deepseek_r1:
               the tags and the newlines around them produce no delta)
    none       content: answer

- Tokenisation: text is cut into words with their leading space (``" the"``), then into pieces
  of 1-6 characters. A tag is a special token: one piece half the time, otherwise cut at one or
  two random points (``"</th" "ink>"``, ``"<" "/think" ">"``), so splitters see both shapes.
- ``max_tokens``: at most that many pieces are kept; if pieces were cut (possibly inside the
  reasoning) ``finish_reason`` is ``"length"``, else ``"stop"``.
- Scripted chunks (tests) replace the generated pieces verbatim, one chunk per token.
- Prompt tokens are ``max(1, characters // 4)``; the default seed is a stable hash of the
  prompt text (``blake2b``, not ``hash()``, which is salted per process).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

SimMode = Literal["template", "tags", "separated", "none"]
Channel = Literal["content", "reasoning"]
FinishReason = Literal["stop", "length"]

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"

_TOPICS = (
    "prime numbers",
    "the speed of light",
    "binary search",
    "photosynthesis",
    "the Pythagorean theorem",
    "compound interest",
    "the boiling point of water",
    "TCP handshakes",
    "black holes",
    "sorting a list",
)
_STEPS = (
    "I should recall the basic definition",
    "the key quantity here is the rate of change",
    "we can break the problem into smaller parts",
    "the simplest case is worth checking by hand",
    "the units have to match on both sides",
    "compare the two values: if a < b, keep a",
    "there are about 3 cases to consider",
    "an example with 12 items makes it concrete",
    "the textbook formula applies directly",
    "the edge case with zero needs care",
)
_CONNECTORS = ("Then,", "Also,", "Next,", "Hmm,", "Alternatively,", "Now,")
_DOUBTS = (
    "is that right? Let me double-check",
    "maybe I misread the question",
    "that seems too simple, but it holds",
    "the sign could be wrong here",
)
_CONCLUSIONS = (
    "straightforward once the definition is clear",
    "that it follows from the basic rule",
    "about 42 in the usual units",
    "a short chain of simple steps",
)
_ANSWER_TAILS = (
    "The key idea is to start from the definition.",
    "A quick example confirms it.",
    "In practice this is usually enough.",
    "Let me know if you want more detail.",
)
_WORD = re.compile(r" ?\w+| ?[^\w\s]+|\s+")


@dataclass(frozen=True, slots=True)
class Piece:
    """One token of output and the delta field it travels in."""

    channel: Channel
    text: str


@dataclass(frozen=True, slots=True)
class Composition:
    """The untokenised texts a seed produces."""

    reasoning: str
    answer: str


@dataclass(frozen=True, slots=True)
class Script:
    """Everything one choice will emit, in order; one piece is one completion token."""

    pieces: tuple[Piece, ...]
    prompt_tokens: int
    finish_reason: FinishReason

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)

    @property
    def reasoning_tokens(self) -> int:
        return sum(1 for piece in self.pieces if piece.channel == "reasoning")

    def text(self, channel: Channel) -> str | None:
        """The joined text of one channel, or ``None`` if it has no piece at all."""
        parts = [piece.text for piece in self.pieces if piece.channel == channel]
        return "".join(parts) if parts else None


@dataclass(frozen=True, slots=True)
class Emission:
    """One streamed event of a response: a token of choice ``index`` at decode ``step``.

    ``piece`` is ``None`` only for a choice without any token (it still needs its finish
    chunk). The first emission of a step (``opens_step``) carries ``step_tokens``, the number
    of tokens decoded in that step (0 on the others): there the simulated clock and the KV
    cache move.
    """

    step: int
    index: int
    piece: Piece | None
    finish_reason: FinishReason | None
    opens_step: bool
    step_tokens: int


def interleave(scripts: Sequence[Script]) -> tuple[Emission, ...]:
    """Round-robin the choices token by token, as vLLM decodes ``n`` sequences in lockstep."""
    longest = max((len(script.pieces) for script in scripts), default=0)
    emissions: list[Emission] = []
    for step in range(max(longest, 1)):
        row = [(i, s) for i, s in enumerate(scripts) if step < max(len(s.pieces), 1)]
        tokens = sum(1 for _, script in row if script.pieces)
        for position, (index, script) in enumerate(row):
            piece = script.pieces[step] if script.pieces else None
            last = step >= len(script.pieces) - 1
            finish = script.finish_reason if last else None
            opens = position == 0
            emissions.append(Emission(step, index, piece, finish, opens, tokens if opens else 0))
    return tuple(emissions)


def count_prompt_tokens(text: str) -> int:
    """The simulator's tokenizer for prompts: four characters per token, at least one."""
    return max(1, len(text) // 4)


def derive_seed(text: str) -> int:
    """A stable 64-bit seed from the prompt text, equal across processes."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def compose(seed: int) -> Composition:
    """The reasoning and answer texts for ``seed`` (the first draws ``build_script`` makes)."""
    return _compose(random.Random(seed))


def build_script(
    mode: SimMode,
    seed: int,
    *,
    prompt_tokens: int,
    max_tokens: int | None = None,
    chunks: Sequence[Piece] | None = None,
) -> Script:
    """Plan one choice: scripted ``chunks`` verbatim, else text generated from ``seed``."""
    if chunks is not None:
        pieces = list(chunks)
    else:
        rng = random.Random(seed)
        pieces = _render(mode, _compose(rng), rng)
    if max_tokens is not None and len(pieces) > max_tokens:
        return Script(tuple(pieces[:max_tokens]), prompt_tokens, "length")
    return Script(tuple(pieces), prompt_tokens, "stop")


def _compose(rng: random.Random) -> Composition:
    topic = rng.choice(_TOPICS)
    conclusion = rng.choice(_CONCLUSIONS)
    steps = [f"{rng.choice(_CONNECTORS)} {rng.choice(_STEPS)}." for _ in range(rng.randint(2, 8))]
    paragraph_break = "\n\n" if rng.random() < 0.5 else " "
    reasoning = (
        f"Okay, the user asks about {topic}. Let me think. First, {rng.choice(_STEPS)}. "
        + " ".join(steps)
        + f"{paragraph_break}Wait, {rng.choice(_DOUBTS)}. So the answer is {conclusion}."
    )
    tails = " ".join(rng.choice(_ANSWER_TAILS) for _ in range(rng.randint(1, 3)))
    answer = f"{topic[0].upper()}{topic[1:]}: in short, it is {conclusion}. {tails}"
    return Composition(reasoning, answer)


def _render(mode: SimMode, text: Composition, rng: random.Random) -> list[Piece]:
    """Tokenise the texts in the order and channels ``mode`` prescribes."""
    reasoning = list(_tokenize(text.reasoning, rng))
    answer = list(_tokenize(text.answer, rng))
    if mode == "separated":
        return _on("reasoning", reasoning) + _on("content", answer)
    if mode == "none":
        return _on("content", answer)
    closing = ["\n", *_split_tag(CLOSE_TAG, rng), "\n\n"]
    opening = [*_split_tag(OPEN_TAG, rng), "\n"] if mode == "tags" else []
    return _on("content", opening + reasoning + closing + answer)


def _on(channel: Channel, texts: list[str]) -> list[Piece]:
    return [Piece(channel, text) for text in texts]


def _tokenize(text: str, rng: random.Random) -> Iterator[str]:
    """Cut ``text`` into pieces of 1-6 characters, words keeping their leading space."""
    for word in _WORD.findall(text):
        yield from _chop(word, rng)


def _chop(word: str, rng: random.Random) -> Iterator[str]:
    """Short rests stay whole most of the time, like common words in a BPE vocabulary."""
    start = 0
    while start < len(word):
        rest = len(word) - start
        keep_whole = rest <= 4 and rng.random() < 0.8
        size = rest if keep_whole else rng.randint(1, min(6, rest))
        yield word[start : start + size]
        start += size


def _split_tag(tag: str, rng: random.Random) -> list[str]:
    """The tag as one piece, or cut at one or two random points."""
    if rng.random() < 0.5:
        return [tag]
    cuts = sorted(rng.sample(range(1, len(tag)), rng.randint(1, 2)))
    bounds = [0, *cuts, len(tag)]
    return [tag[a:b] for a, b in pairwise(bounds)]
