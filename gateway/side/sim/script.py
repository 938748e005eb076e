"""What the simulated model says: a deterministic plan of tokens (sans-I/O).

``build_script(mode, seed, prompt_tokens=..., max_tokens=..., stops=...)`` returns a ``Script``
(``gateway.side.sim.pieces``): a tuple of ``Piece(channel, text)``, one piece per token, plus the
token counts, the finish reason and where the ``</think>`` tag starts.

Rules:

- Determinism: everything is drawn from one ``random.Random(seed)``: first the texts (an R1-style
  reasoning monologue and an answer about the ``question``, and about the tool ``result`` when
  the model answers one, ``gateway.side.sim.prose``), then the tokenisation. The same seed,
  question and result always give the same pieces; the process-global ``random`` is never
  touched.
- Modes (how the raw model output reaches the client, per vLLM 0.32)::

    template   content: reasoning + "\\n</think>\\n\\n" + answer    (R1: the template opened it)
    tags       content: "<think>\\n" + reasoning + "\\n</think>\\n\\n" + answer
    separated  reasoning: reasoning; content: answer   (vLLM --reasoning-parser deepseek_r1;
               the model wrote reasoning + "</think>" + answer, the tag's fate is decided by
               ``gateway.side.sim.reasoning``: one token sends no delta, a spelled one turns the
               whole answer into reasoning)
    none       content: answer

- Markers: ``</think>`` and ``<think>`` above stand for the model's format (``markers``: the
  open and close marker of a ``gateway.relay.formats`` entry, e.g. Kimi K3's three-token
  ``<|open|>think<|sep|>`` … ``<|close|>think<|sep|>``); a format without an open marker
  (MiniMax M2) renders ``tags`` like ``template``.
- ``empty_reasoning``: the model thought nothing (R1 on a trivial prompt): the output starts
  with the close marker as one token (``template``: ``</think>\n\n`` + answer; ``separated``:
  vLLM's parser consumes that token, so only ``content`` deltas follow, no reasoning field).
- ``thinking=False`` (a hybrid model asked not to think; the template already closed the
  block): only the answer, no markers. In ``separated`` mode it travels in ``reasoning``, as
  vLLM's ``deepseek_r1`` parser sends text that never reaches a ``</think>`` (the worst case
  for a gateway; the ``deepseek_v3`` parser would send ``content``).
- Tokenisation: text is cut into words with their leading space (``" the"``), then into pieces
  of 1-6 characters. A tag is a special token: one piece half the time, otherwise cut at one or
  two random points (``"</th" "ink>"``, ``"<" "/think" ">"``), so splitters see both shapes.
  The tag's cut is drawn after the answer's tokens, so the reasoning and answer pieces of a
  seed are the same in every mode.
- Stop strings and ``max_tokens`` end the generation as ``gateway.side.sim.stops`` states
  (``finish_reason`` ``"stop"`` or ``"length"``); then, in ``separated`` mode only, the
  parser assigns channels. Generation applies stops to the raw text, tags included.
- Scripted chunks (tests) replace the generated pieces verbatim, one chunk per token (and in
  ``separated`` mode go through the parser too).
- A tool call (``tool``: the function and its JSON arguments, decided by
  ``gateway.side.sim.tools``): the model reasons as usual, then, instead of the answer, writes the
  arguments as ``tool`` pieces (after the close marker in the modes with markers); the choice
  ends with ``tool_calls`` unless ``max_tokens`` or a stop string cut it. Scripted chunks
  make no call. A reasoning parser never moves them
  (vLLM's tool parser takes them out of the text first).
- Prompt tokens are ``max(1, characters // 4)``; the default seed is a stable hash of the
  prompt text (``blake2b``, not ``hash()``, which is salted per process).
"""

from __future__ import annotations

import hashlib
import random
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

from gateway.side.sim.pieces import (
    CLOSE_TAG,
    OPEN_TAG,
    Channel,
    FinishReason,
    Piece,
    Script,
    ScriptedCall,
    SimMode,
    find_tag,
)
from gateway.side.sim.prose import Composition, compose_text
from gateway.side.sim.reasoning import separate
from gateway.side.sim.stops import end_generation
from gateway.side.sim.turn import ToolResult

__all__ = [
    "CLOSE_TAG",
    "OPEN_TAG",
    "Channel",
    "Composition",
    "FinishReason",
    "Piece",
    "Script",
    "ScriptedCall",
    "SimMode",
    "ToolPlan",
    "build_script",
    "compose",
    "count_prompt_tokens",
    "derive_seed",
]

_WORD = re.compile(r" ?\w+| ?[^\w\s]+|\s+")


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The tool call a choice makes: which function, with which JSON arguments."""

    call: ScriptedCall
    arguments: str

    def again(self) -> ToolPlan:
        """The same call for another choice, under its own id (vLLM gives each its own)."""
        return ToolPlan(ScriptedCall(new_call_id(), self.call.name), self.arguments)


def new_call_id() -> str:
    return f"chatcmpl-tool-{secrets.token_hex(16)}"


def count_prompt_tokens(text: str) -> int:
    """The simulator's tokenizer for prompts: four characters per token, at least one."""
    return max(1, len(text) // 4)


def derive_seed(text: str) -> int:
    """A stable 64-bit seed from the prompt text, equal across processes."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def compose(seed: int, question: str = "", result: ToolResult | None = None) -> Composition:
    """The reasoning and answer texts for ``seed`` and ``question`` (and the tool ``result``
    answered, if any): the first draws ``build_script`` makes (``gateway.side.sim.prose``)."""
    return compose_text(random.Random(seed), question, result)


def build_script(
    mode: SimMode,
    seed: int,
    *,
    prompt_tokens: int,
    max_tokens: int | None = None,
    chunks: Sequence[Piece] | None = None,
    stops: Sequence[str] = (),
    markers: tuple[str | None, str] = (OPEN_TAG, CLOSE_TAG),
    thinking: bool = True,
    empty_reasoning: bool = False,
    tool: ToolPlan | None = None,
    continuing: bool = False,
    question: str = "",
    result: ToolResult | None = None,
) -> Script:
    """Plan one choice: scripted ``chunks`` verbatim, else text generated from ``seed``;
    then end it at a stop string or ``max_tokens`` and, in ``separated`` mode, parse it.
    ``continuing``: the request continues an assistant turn whose reasoning is closed
    (``continue_final_message``): the model writes only what follows the close marker, as
    content (vLLM's parser sees the reasoning end in the prompt)."""
    close = markers[1]
    if chunks is not None:
        planned, tool = list(chunks), None  # scripted: the chunks are all there is
    else:
        rng = random.Random(seed)
        text = compose_text(rng, question, result)
        if tool is not None:
            text = Composition(text.reasoning, "")
        if not thinking:
            return _unthinking(mode, text.answer, rng, prompt_tokens, max_tokens, stops, close,
                               tool)  # fmt: skip
        if empty_reasoning:
            text = Composition("", text.answer)
        planned = _render(mode, text, rng, markers)
        if tool is not None:
            planned += _on("tool", list(_tokenize(tool.arguments, rng)))
    if continuing:
        planned, mode = after_reasoning(planned, close), "template"
    ending = end_generation(planned, stops, max_tokens)
    tag_at = find_tag(ending.pieces, close)
    pieces = separate(ending.pieces, tag_at, close) if mode == "separated" else ending.pieces
    finish = _finish(ending.finish_reason, ending.stop_reason, tool)
    return Script(pieces, prompt_tokens, finish, ending.stop_reason, tag_at, close,
                  tool.call if tool else None)  # fmt: skip


def after_reasoning(pieces: Sequence[Piece], close: str) -> list[Piece]:
    """What a model continuing after its closed reasoning writes: the pieces past the close
    marker (reasoning-channel pieces and the whitespace right after the marker dropped)."""
    kept = [p for p in pieces if p.channel != "reasoning"]
    text = "".join(p.text for p in kept if p.channel == "content")
    end = text.find(close)
    if end < 0:
        return kept
    skip, out = end + len(close), []
    for piece in kept:
        if piece.channel == "content" and skip > 0:
            rest = piece.text[skip:] if len(piece.text) > skip else ""
            skip -= len(piece.text)
            if not rest:
                continue
            piece = Piece("content", rest)
        out.append(piece)
    while out and out[0].channel == "content" and not out[0].text.strip():
        out.pop(0)
    return out


def _finish(reason: FinishReason, stop_reason: str | None, tool: ToolPlan | None) -> FinishReason:
    """A tool call neither the budget nor a stop string cut ends the choice with
    ``tool_calls``."""
    return "tool_calls" if tool is not None and reason == "stop" and stop_reason is None else reason


def _unthinking(
    mode: SimMode, answer: str, rng: random.Random, prompt_tokens: int,
    max_tokens: int | None, stops: Sequence[str], close: str, tool: ToolPlan | None,
) -> Script:  # fmt: skip
    """Thinking off: the answer (or the tool call) alone, the answer in ``reasoning`` behind a
    separating engine."""
    channel: Channel = "reasoning" if mode == "separated" else "content"
    planned = _on(channel, list(_tokenize(answer, rng)))
    if tool is not None:
        planned = _on("tool", list(_tokenize(tool.arguments, rng)))
    ending = end_generation(planned, stops, max_tokens)
    finish = _finish(ending.finish_reason, ending.stop_reason, tool)
    return Script(ending.pieces, prompt_tokens, finish, ending.stop_reason, None, close,
                  tool.call if tool else None)  # fmt: skip


def _render(
    mode: SimMode, text: Composition, rng: random.Random, markers: tuple[str | None, str]
) -> list[Piece]:
    """Tokenise the texts in the order and channels ``mode`` prescribes."""
    open_marker, close = markers
    reasoning = list(_tokenize(text.reasoning, rng))
    answer = list(_tokenize(text.answer, rng))
    tag = _split_tag(close, rng)
    if not text.reasoning:
        tag = [close]  # the model went straight to the answer: one special token
    if mode == "separated":
        return _on("reasoning", reasoning + tag) + _on("content", answer)
    if mode == "none":
        return _on("content", answer)
    closing = ["\n", *tag, "\n\n"] if text.reasoning else [*tag, "\n\n"]
    opening = []
    if mode == "tags" and open_marker is not None:
        opening = [*_split_tag(open_marker, rng), "\n"]
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
