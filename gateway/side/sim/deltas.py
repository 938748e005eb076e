"""How a choice's tokens travel as streamed deltas, and how ``n`` choices interleave (sans-I/O).

``interleave(scripts, merge=..., leak=...) -> tuple[Emission, ...]`` is the schedule of one
response: which delta of which choice goes out at which decode step.

Rules (vLLM 0.32):

- Merged tokens: under load, vLLM's API server sends several tokens in one delta. With
  ``merge`` = m (``sim.merge``, default 1) a delta carries up to m consecutive pieces of the
  same channel, joined; a change of channel, or the piece where ``</think>`` starts, begins a
  new delta. A delta still counts its tokens (usage counts pieces, not deltas).
- A delta with empty text sends no chunk (vLLM skips empty deltas) but still takes its steps.
- vllm-project/vllm#51641, streaming only: with stop strings, ``--reasoning-parser`` garbles
  the reasoning/content boundary. With ``leak`` = k = ``min(7, longest stop - 1)`` (see
  ``leak_width``; k < 1 changes nothing), the last k characters of the reasoning before the
  parsed ``</think>`` are lost, and the first content delta is preceded by the last k
  characters of ``"</think>"`` (k=2: ``"k>"``, k=5: ``"hink>"``). It applies only where the
  parser consumed the tag (``Script.split_at``); non-streamed responses are correct.
- Lockstep: step s carries the s-th delta of every choice that still has one, in index order.
  It decodes as many tokens as its longest delta (``step_decodes``), and the KV cache grows by
  all of its tokens (``step_tokens``); both are set on the step's first emission only.
- After its last delta a choice's finish chunk follows (``finish_reason`` on that emission);
  a choice without any token still has one emission (``delta`` ``None``) to carry it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.side.sim.pieces import CLOSE_TAG, Channel, FinishReason, Piece, Script

_MAX_LEAK = len(CLOSE_TAG) - 1


@dataclass(frozen=True, slots=True)
class Delta:
    """The text one streamed chunk carries on one channel, and the tokens it took."""

    channel: Channel
    text: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Emission:
    """One streamed event of a response: delta ``delta`` of choice ``index`` at ``step``."""

    step: int
    index: int
    delta: Delta | None
    finish_reason: FinishReason | None
    opens_step: bool
    step_tokens: int
    step_decodes: int


def leak_width(stops: Sequence[str]) -> int:
    """How many characters #51641 moves across the boundary for these stop strings."""
    longest = max((len(stop) for stop in stops), default=0)
    return max(0, min(_MAX_LEAK, longest - 1))


def plan_deltas(script: Script, merge: int = 1, leak: int = 0) -> tuple[Delta, ...]:
    """The deltas one choice streams: #51641's garbling (``leak``), then merged tokens."""
    pieces = leak_boundary(script, leak)
    if merge == 1:  # the common case, kept cheap: one delta per token
        return tuple(Delta(piece.channel, piece.text, 1) for piece in pieces)
    groups: list[list[Piece]] = []
    for index, piece in enumerate(pieces):
        group = groups[-1] if groups else []
        joins = 0 < len(group) < merge and group[0].channel == piece.channel
        if joins and index != script.tag_at:
            group.append(piece)
        else:
            groups.append([piece])
    return tuple(Delta(g[0].channel, "".join(p.text for p in g), len(g)) for g in groups)


def leak_boundary(script: Script, leak: int) -> tuple[Piece, ...]:
    """The pieces with ``leak`` characters moved across the parsed tag (vLLM #51641)."""
    at = script.split_at
    leak = min(leak, len(script.close) - 1)
    if leak < 1 or at is None:
        return script.pieces
    pieces = list(script.pieces)
    _drop_reasoning_tail(pieces, at, leak)
    for index in range(at + 1, len(pieces)):
        piece = pieces[index]
        if piece.channel == "content" and piece.text:
            pieces[index] = Piece("content", script.close[-leak:] + piece.text)
            break
    return tuple(pieces)


def _drop_reasoning_tail(pieces: list[Piece], end: int, count: int) -> None:
    """Remove the last ``count`` reasoning characters before piece ``end`` (tokens stay)."""
    for index in range(end - 1, -1, -1):
        piece = pieces[index]
        if count == 0:
            return
        if piece.channel == "reasoning" and piece.text:
            cut = min(count, len(piece.text))
            pieces[index] = Piece("reasoning", piece.text[: len(piece.text) - cut])
            count -= cut


def interleave(scripts: Sequence[Script], *, merge: int = 1, leak: int = 0) -> tuple[Emission, ...]:
    """Round-robin the choices delta by delta, as vLLM decodes ``n`` sequences in lockstep."""
    plans = [plan_deltas(script, merge, leak) for script in scripts]
    if len(plans) == 1 and plans[0]:  # n = 1: one delta per step
        return _single(plans[0], scripts[0].finish_reason)
    emissions: list[Emission] = []
    for step in range(max([1, *(len(plan) for plan in plans)])):
        row = [(i, plan) for i, plan in enumerate(plans) if step < max(len(plan), 1)]
        sizes = [plan[step].tokens for _, plan in row if plan]
        for position, (index, plan) in enumerate(row):
            delta = plan[step] if plan else None
            finish = scripts[index].finish_reason if step >= len(plan) - 1 else None
            opens = position == 0
            totals = (sum(sizes), max(sizes, default=0)) if opens else (0, 0)
            emissions.append(Emission(step, index, delta, finish, opens, *totals))
    return tuple(emissions)


def _single(plan: tuple[Delta, ...], finish_reason: FinishReason) -> tuple[Emission, ...]:
    """``interleave`` of one choice with at least one delta, without the row bookkeeping."""
    last = len(plan) - 1
    return tuple(
        Emission(step, 0, d, finish_reason if step == last else None, True, d.tokens, d.tokens)
        for step, d in enumerate(plan)
    )
