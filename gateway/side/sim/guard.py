"""The simulator playing a guard model (Llama Guard 3/4 on vLLM): a verdict, not prose (sans-I/O).

A model named in ``SimConfig.guards`` answers every chat request with Llama Guard's output:
``safe``, or ``unsafe`` and a line of the violated categories (``unsafe\\nS1``). The verdict
is about the conversation's last turn, as Llama Guard's is (the user's prompt, or the agent's
answer when the conversation ends with it): ``unsafe`` when that turn's text holds a word of a
category's lexicon (case-insensitive), listing every such category in order. Nothing else of
the request changes what it says; pacing, faults and usage are the simulator's as for any model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gateway.side.sim.pieces import Piece
from gateway.side.sim.request import SimRequest

Lexicon = Mapping[str, tuple[str, ...]]  # category (S1…) -> the words that violate it


def verdict(text: str, lexicon: Lexicon) -> str:
    """Llama Guard's answer for a turn whose text is ``text``."""
    lowered = text.casefold()
    hit = [category for category, words in lexicon.items()
           if any(word.casefold() in lowered for word in words)]  # fmt: skip
    return "unsafe\n" + ",".join(hit) if hit else "safe"


def last_turn(messages: Any) -> str:
    """The text of the conversation's last message (strings and text parts)."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return ""
    content = messages[-1].get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def as_guard(request: SimRequest, lexicon: Lexicon) -> SimRequest:
    """``request`` answered with its verdict as the only output, in the answer field."""
    said = verdict(last_turn(request.body.get("messages")), lexicon)
    sim = dataclasses.replace(request.sim, chunks=(Piece("content", said),))
    return dataclasses.replace(request, mode="none", sim=sim, tool=None)
