"""Guard models in the forward loop: a stream's events wait for their verdicts, a whole response
and a prompt are judged before they go on (``gateway.guard.judging`` is the sans-I/O half).

- ``screened_output``: the upstream is read by a task while the guard models are asked by
  others; each wake hands the relay what the screen released (``ModelScreen.ready``). The
  engine keeps generating meanwhile (a read waits only for its bytes, not for a verdict), so
  a verdict's latency delays a sentence once rather than every token after it. A stream with
  guard models is relayed by the request's task (never pushed from the read callback).
- ``screen_whole``: every window of a whole response, asked at once; the verdicts stop or mark
  the choices before the rewriter shapes the response.
- ``judge_prompt``: the prompt, before admission; a ``block`` raises ``PromptBlocked``.

A guard model's failure is its policy's ``on_error``; a verdict never changes a byte the
client already has.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import GatewayError, RemoteProtocolError, UpstreamProtocolError
from gateway.guard.judging import (
    Acted,
    GuardVerdict,
    ModelScreen,
    Rule,
    judged,
    prompt_asks,
    whole_asks,
)
from gateway.guard.prompt import PromptBlocked
from gateway.relay.choice import ChoiceState
from gateway.relay.guarding import GuardAct
from gateway.relay.rewrite import Rewriter, StreamRelay
from gateway.relay.sse import Event, SSEParser
from gateway.upstream.judge import GuardModels


class _Stream(Protocol):
    async def read(self) -> bytes: ...


class _Leg(Protocol):
    """What a screened stream reads (``gateway.exchange.forward.Leg``)."""

    @property
    def stream(self) -> _Stream: ...

    @property
    def parser(self) -> SSEParser: ...

    @property
    def body(self) -> bytes: ...

    async def continue_with(self, body: bytes) -> None: ...


class _Exchange(Protocol):
    """What a screened stream tells its exchange (``gateway.exchange.lifecycle.Exchange``)."""

    def observe_read(self, arrived: float) -> None: ...


@dataclass(frozen=True, slots=True)
class ScreenPlan:
    """The guard models over one request's output."""

    rules: tuple[Rule, ...]
    prompt: str  # the user's turn each ask shows the guard model
    models: GuardModels
    completions: bool  # the upstream speaks legacy completions (``text``, not ``delta``)

    def start(self, rewriter: Rewriter) -> ModelScreen:
        return ModelScreen(self.rules, lambda: _state(rewriter), self.prompt, self.completions)


def _state(rewriter: Rewriter) -> ChoiceState:
    """A split of a choice's text as the relay makes it (same format and source)."""
    p = rewriter.policy
    return ChoiceState.start(p.format, p.source, thinking=p.thinking, repair_leak=p.repair_leak)


def parse_read(parser: SSEParser, raw: bytes) -> tuple[list[Event], RemoteProtocolError | None]:
    """The events of one upstream read, and the error after the good ones, if any."""
    try:
        return parser.feed(raw), None
    except RemoteProtocolError as exc:  # keep what came before the bad event
        return exc.events, exc


def relay_events(relay: StreamRelay, events: Sequence[Event], out: list[bytes]) -> None:
    """Feed ``events`` to ``relay``, appending what is due to the client to ``out``, until the
    stream is done, every choice was blocked (the engine is then stopped), or the turn's
    reasoning budget was spent (the rest of this turn is never read)."""
    for event in events:
        data = relay.feed(event)
        if relay.done:
            break
        out.append(data if relay.first_id is None else relay.as_first(data, event))
        if relay.policy.guard is not None and relay.all_blocked:
            relay.done = relay.stopped = True  # nothing more can go out: stop the engine
            break
        if relay.policy.budget is not None and relay.budget_spent():
            relay.cut_at(event)
            break


def release_to(relay: StreamRelay, items: Sequence[Event | Acted]) -> bytes:
    """Hand the screen's output to the relay: events fed, acts put on the choice's guard (a
    block stops it, then its empty event ends it in the endpoint's shape); the client's bytes."""
    out: list[bytes] = []
    for item in items:
        if relay.done or relay.cutting:
            break
        if isinstance(item, Acted):
            guard = relay.choice(item.choice).guard
            assert guard is not None, "a screened request's choices are guarded"
            if item.event is None:
                guard.acts.append(item.act)  # flagged
                continue
            guard.stop(item.act)
            relay_events(relay, (item.event,), out)
        else:
            relay_events(relay, (item,), out)
    return b"".join(out)


async def screened_output(
    ex: _Exchange, leg: _Leg, relay: StreamRelay, plan: ScreenPlan
) -> AsyncIterator[bytes]:
    """``upstream_output`` with every event held until the guard models found it safe."""
    waiting = _Waiting(ex, leg, plan.models, plan.start(relay))
    try:
        while not relay.done:
            woke = await waiting.wake()
            if woke is None:
                break
            if woke:  # the stream broke: what was asked about already still goes out if safe
                await waiting.settle()
                yield release_to(relay, waiting.screen.ready())
                raise woke[0]
            yield release_to(relay, waiting.screen.ready())
            if relay.cutting:  # the budget was spent: the turn continues in a new request
                waiting.cut()
                await leg.continue_with(relay.continuation(leg.body))
    finally:
        waiting.cut()
    if not relay.done:
        raise UpstreamProtocolError("the model server ended the stream before [DONE]")


class _Waiting:
    """The upstream read and the guard models' asks a screened stream waits on."""

    def __init__(self, ex: _Exchange, leg: _Leg, models: GuardModels, screen: ModelScreen) -> None:
        self.ex, self.leg, self.models, self.screen = ex, leg, models, screen
        self.asking: dict[asyncio.Future[GuardVerdict | None], int] = {}
        self.reading: asyncio.Future[bytes] | None = None
        self.ended = False

    async def wake(self) -> list[Exception] | None:
        """Wait for a read or a verdict and give it to the screen; ``None`` once nothing is
        left to wait for, else the read's error after its good events (if any)."""
        if self.reading is None and not self.ended:
            self.reading = asyncio.ensure_future(self.leg.stream.read())
        waits: set[asyncio.Future[Any]] = set(self.asking)
        if self.reading is not None:
            waits.add(self.reading)
        if not waits:
            return None
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        errors: list[Exception] = []
        if self.reading is not None and self.reading in done:
            raw, self.reading = self.reading.result(), None
            self.ended = not raw
            if raw:
                arrived = time.perf_counter()
                events, error = parse_read(self.leg.parser, raw)
                errors += self._add(events)
                errors += [error] if error is not None else []
                self.ex.observe_read(arrived)
        for task in done:
            if task in self.asking:
                self.screen.resolve(self.asking.pop(task), task.result())
        return errors

    async def settle(self) -> None:
        """Wait for every ask out (each is bounded by its guard model's ``timeout_s``)."""
        if self.asking:
            await asyncio.wait(set(self.asking))
        for task in list(self.asking):
            self.screen.resolve(self.asking.pop(task), task.result())

    def _add(self, events: Sequence[Event]) -> list[Exception]:
        """Hold ``events`` and ask about them; the error of a bad one (raised once what was
        found safe before it went out), after which nothing more is read."""
        for event in events:
            try:
                asks = self.screen.add(event)
            except (GatewayError, RemoteProtocolError) as exc:
                self.ended = True
                return [exc]
            for ask in asks:
                self.asking[asyncio.ensure_future(self.models.ask(ask))] = ask.id
            if event.is_done:
                self.ended = True  # nothing after [DONE] is read (a reset then is no failure)
                break
        return []

    def cut(self) -> None:
        """Stop waiting: the stream is over, or its turn goes on in a continuation (what is
        held is then never sent)."""
        for task in (*self.asking, *((self.reading,) if self.reading is not None else ())):
            if not task.done():
                task.cancel()
            else:
                with contextlib.suppress(BaseException):
                    task.exception()  # retrieved: a failed read after the end is nobody's news
        self.asking, self.reading, self.ended = {}, None, False
        self.screen.cut()


async def screen_whole(plan: ScreenPlan, rewriter: Rewriter, body: dict[str, Any]) -> None:
    """Judge a whole response's choices; stop (``block``) or mark (``flag``) their guards."""
    asks = whole_asks(plan.rules, body, lambda: _state(rewriter), plan.prompt, plan.completions)
    verdicts = await asyncio.gather(*(plan.models.ask(ask) for ask in asks))
    for ask, verdict in zip(asks, verdicts, strict=True):
        act = judged(ask, verdict)
        if act is None or ask.choice is None:
            continue
        guard = rewriter.choice(ask.choice).guard
        assert guard is not None, "a screened request's choices are guarded"
        if act.action == "block":
            guard.stop(act)
        else:
            guard.acts.append(act)


async def judge_prompt(rules: Sequence[Rule], texts: Sequence[str] | None, models: GuardModels
                       ) -> tuple[GuardAct, ...]:  # fmt: skip
    """The acts of the guard models over a prompt's texts; ``PromptBlocked`` for a ``block``.
    A prompt of token ids (``None``), which no guard model can read, is what a guard model
    that cannot answer is: its policy's ``on_error``."""
    if texts is None:
        asks = prompt_asks(rules, ["(token ids)"])
        verdicts: Sequence[GuardVerdict | None] = [None] * len(asks)
    else:
        asks = prompt_asks(rules, texts)
        verdicts = await asyncio.gather(*(models.ask(ask) for ask in asks))
    acts = [act for ask, verdict in zip(asks, verdicts, strict=True)
            if (act := judged(ask, verdict)) is not None]  # fmt: skip
    for act in acts:
        if act.action == "block":
            raise PromptBlocked(act.policy, act.detector)
    return tuple(acts)
