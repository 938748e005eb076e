"""Room for the answer (sans-I/O): a ``max_tokens`` larger than what the engine's context leaves
after the prompt is clamped to what is left, or refused (``UNKNOWN_FIELDS=refuse``, the strict
mode), on every endpoint.

An engine refuses a request whose prompt plus ``max_tokens`` exceeds its ``max_model_len``
(vLLM: 400 "This model's maximum context length is ..."). Clients written against hosted models
ask for what those allow (Claude Code: ``max_tokens: 32000``) whatever the context of the model
behind the gateway, so the gateway lowers the limit to the room there is, and says so in the
``x-thinkgate-clamped`` response header. The context is the smallest ``max_model_len`` the
engines serving the model report on ``/v1/models``; the prompt is estimated as everywhere in
the gateway (its body's bytes / 4, which over-counts the prompt's tokens for most text, so the
clamp errs on the side of room). A model whose engines report no context is left alone.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest

CLAMPED_HEADER = "x-thinkgate-clamped"
_LIMITS = ("max_tokens", "max_completion_tokens")  # what a chat or completions body asks for


def room_for(context: int | None, upstream_body: bytes) -> int | None:
    """The most tokens an answer can have after this prompt; ``None`` when the context is not
    known. At least 1: a prompt that fills the context is the engine's to refuse."""
    if context is None:
        return None
    return max(1, context - len(upstream_body) // 4)


def clamp(upstream_body: bytes, asked: int, room: int, *, strict: bool) -> bytes:
    """The body with its limit lowered to ``room`` (``asked`` is more); in strict mode a 400
    naming ``max_tokens`` instead."""
    if strict:
        raise InvalidRequest(
            f"max_tokens {asked} is more than the model's context leaves after this prompt "
            f"(about {room} tokens).", param="max_tokens", code="context_length_exceeded",
        )  # fmt: skip
    body: dict[str, Any] = orjson.loads(upstream_body)
    for name in _LIMITS:
        if isinstance(body.get(name), int) and body[name] > room:
            body[name] = room
    return orjson.dumps(body)


def clamped_header(asked: int, room: int, context: int) -> tuple[str, str]:
    return (CLAMPED_HEADER, f"max_tokens={room}; asked={asked}; context={context}")


TRUNCATED_HEADER = "x-thinkgate-truncated"


def truncated(
    messages: list[dict[str, Any]], rest_bytes: int, context: int, reserve: int
) -> tuple[list[dict[str, Any]], int]:
    """``truncation: "auto"`` (Responses API): the messages with the oldest turns dropped until
    the prompt (the messages and ``rest_bytes`` of the body around them, estimated at bytes /
    4) leaves ``reserve`` tokens of ``context`` for the answer; and how many were dropped.

    System messages (the instructions) and the last message are never dropped. A turn goes
    whole: after the oldest message, every assistant or tool message that now leads the
    conversation goes too (a tool result without the call that asked for it, or an answer
    without its question, is no conversation), so what is kept starts with a user message.
    When even that does not fit, as much as can go has gone: the engine has the last word."""
    sizes = [len(orjson.dumps(m)) + 1 for m in messages]
    budget = (context - reserve) * 4
    total = rest_bytes + sum(sizes)
    if total <= budget:
        return messages, 0
    droppable = [i for i, m in enumerate(messages[:-1]) if m.get("role") != "system"]
    dropped: set[int] = set()
    for index in droppable:
        if total <= budget and messages[index].get("role") == "user":
            break
        dropped.add(index)
        total -= sizes[index]
    kept = [m for i, m in enumerate(messages) if i not in dropped]
    return kept, len(dropped)


def truncated_header(dropped: int, context: int) -> tuple[str, str]:
    return (TRUNCATED_HEADER, f"dropped={dropped}; context={context}")
