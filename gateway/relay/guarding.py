"""The seam where guardrail policies act on a choice's text (sans-I/O, no policy code here).

``ChoiceState`` (``gateway.relay.choice``) hands each split delta, reasoning and answer apart,
to its ``TextGuard`` when the request has one (``gateway.guard.stream.ChoiceGuard`` implements
it) and gets back two copies: what the client is sent and what the record keeps. A guard may
hold text back while a match is undecided (the copies are then shorter than what went in, and
catch up later), replace matches, or end the choice (``blocked``: nothing more of it is sent,
and the relay closes it with the endpoint's own content-filter ending; ``stop`` does the same
from outside, for a guard model's verdict). ``acts`` lists every
action taken, with the matched value, for the record (which keeps only a keyed hash of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GuardAct:
    policy: str
    action: str  # redact | block | flag
    channel: str  # reasoning | answer
    detector: str
    value: str  # the matched text: sensitive, hashed before it is recorded


@dataclass(frozen=True, slots=True)
class Guarded:
    reasoning: str  # for the client
    content: str
    kept_reasoning: str  # for the record
    kept_content: str


class TextGuard(Protocol):
    @property
    def blocked(self) -> str | None:
        """The policy that ended the choice, if one did."""

    @property
    def acts(self) -> list[GuardAct]: ...

    def take(self, reasoning: str, content: str, final: bool) -> Guarded: ...

    def take_one(self, channel: str, text: str) -> tuple[str, str] | None:
        """``take`` of non-final ``text`` in one channel (``reasoning`` or ``answer``) when
        that changes nothing in the other: ``(client's copy, record's copy)``; ``None``, with
        nothing done, when it would (answer text closes an open reasoning channel) or the
        choice was ended."""

    def stop(self, act: GuardAct) -> None:
        """End the choice from outside its text (a guard model's verdict): ``act`` is kept,
        ``blocked`` names its policy, and nothing more of the choice is let through."""
