"""The screened stream's loop (``gateway.exchange.screening``) against faults an engine makes:
a connection reset after ``[DONE]`` is no failure, and an error event after judged text lets
that text out before the error."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.exchange.screening import ScreenPlan, screened_output
from gateway.guard.judging import GuardAsk, GuardVerdict
from gateway.guard.policy import parse
from gateway.guard.stream import ChoiceGuard
from gateway.relay.rewrite import Policy, StreamRelay
from gateway.relay.sse import SSEParser

POLICIES = parse(
    "policies:\n  - name: harm\n    detect:\n      - {model: g, upstream: 'http://g/v1'}\n"
    "    action: block\n"
).policies


def sse(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"id": "c", "choices": [choice]}) + b"\n\n"


class Reads:
    """An upstream whose reads are ``parts``, then a reset (a fault: the engine's socket)."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    async def read(self) -> bytes:
        if not self.parts:
            raise ConnectionResetError("reset by peer")
        return self.parts.pop(0)


class Leg:
    def __init__(self, parts: list[bytes]) -> None:
        self.stream, self.parser, self.body = Reads(parts), SSEParser(1 << 20), b""

    async def continue_with(self, body: bytes) -> None:
        raise AssertionError("no budget here")


class Exchange:
    def observe_read(self, arrived: float) -> None:
        pass


class Safe:
    """A guard model that answers after the engine's next read came (the error's)."""

    async def ask(self, ask: GuardAsk) -> GuardVerdict:
        for _ in range(5):
            await asyncio.sleep(0)  # yield to the loop: the read of the error completes first
        return GuardVerdict(False)


def relay() -> StreamRelay:
    guard = lambda: ChoiceGuard(POLICIES)  # noqa: E731
    return StreamRelay(Policy.named("none", True, "reasoning_content", guard=guard,
                                    thinking=False))  # fmt: skip


async def drain(leg: Leg, relay: StreamRelay) -> bytes:
    plan = ScreenPlan(tuple((p, j) for p in POLICIES for j in p.judges), "q", Safe(),  # type: ignore[arg-type]
                      completions=False)  # fmt: skip
    return b"".join([out async for out in screened_output(Exchange(), leg, relay, plan)])  # type: ignore[arg-type]


async def test_a_reset_after_done_is_no_failure() -> None:
    stream = relay()
    out = await drain(Leg([sse({"content": "Hello there."}), sse({}, "stop"),
                           b"data: [DONE]\n\n"]), stream)  # fmt: skip
    assert stream.done and b"Hello there." in out


async def test_an_error_event_after_judged_text_lets_it_out_first() -> None:
    stream = relay()
    error = b'data: {"error": {"message": "engine died", "code": 500}}\n\n'
    leg = Leg([sse({"content": "Fine."}), sse({"content": " More."}), error])
    with pytest.raises(GatewayError):
        await drain(leg, stream)
    assert "".join(stream.choice(0).shown_text()) == "Fine."
