"""``POST /v1/chat/completions``: one simulated generation, paced, counted and faulted.

Recipe: parse → decide the fault → plan the scripts → count the request → race the client's
disconnect while: (stream: send headers) → wait for KV admission → for each decode step sleep
(TTFT, then ITL), grow the KV reservation, emit → trailer. ``finally``: the state learns how the
request ended (shielded, so a cancelled task still frees its blocks).

Streamed and whole responses walk an ``interleave`` schedule (``gateway.side.sim.deltas``) through
``_Run.drive``: same pacing, same KV growth, same fault points; only what ``emit`` does differs.
A stream's schedule merges ``sim.merge`` tokens per delta and, in ``separated`` mode with stop
strings, garbles the reasoning/content boundary as vLLM 0.32 does (vllm-project/vllm#51641); a
whole response is scheduled token by token and is never garbled (vLLM's non-streaming path is
correct). A step sleeps TTFT (first) or ITL, plus ITL for each further token it decodes.

Faults (``sim.fail`` or the configured rates):

- ``error``: HTTP 500 with vLLM's error object before any byte of a body.
- ``drop``: after ``fail_after`` emissions (deltas, so pieces unless merged; default: half)
  the response is cut off abruptly: the handler raises ``SimulatedDrop`` after part of the
  body went out, so the server aborts the connection (uvicorn closes the transport: no
  terminating chunk, no ``[DONE]``; the client sees an incomplete read). A whole response is
  cut inside its ``content-length``.
- ``stall``: after ``fail_after`` emissions nothing is sent for ``stall_ms`` (forever if 0),
  then the response goes on; a disconnect during the stall still cancels it at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from starlette.types import Receive, Send

from gateway.side.sim.asgi import race_disconnect, send_part, send_start, send_whole
from gateway.side.sim.config import SimConfig
from gateway.side.sim.deltas import Emission, interleave, leak_width
from gateway.side.sim.errors import error_body
from gateway.side.sim.request import SimRequest
from gateway.side.sim.script import Script, build_script
from gateway.side.sim.state import FailMode, Outcome, SimState
from gateway.side.sim.wire import DONE, ChunkEncoder, SimUsage, completion_body, usage_for

SSE = b"text/event-stream; charset=utf-8"


class SimulatedDrop(Exception):
    """Raised on purpose after part of a response was sent, to make the server abort it."""


@dataclass(frozen=True, slots=True)
class Pacing:
    """Simulated latencies in seconds; a ``stall`` of 0 lasts until the client leaves."""

    ttft: float
    itl: float
    stall: float
    prefill: float = 0.0  # the uncached prompt's prefill, alone on the engine


@dataclass(frozen=True, slots=True)
class Fault:
    """What goes wrong, and before which emission (``at`` may equal the emission count)."""

    mode: FailMode | None
    at: int


async def serve_chat(
    config: SimConfig, state: SimState, request: SimRequest, receive: Receive, send: Send
) -> None:
    """Answer one validated chat request."""
    scripts = _plan(request)
    emissions = _schedule(request, scripts)
    fault = _fault(request, state, len(emissions))
    if fault.mode == "error":
        await state.count_failure()
        body = error_body("Simulated engine failure", "InternalServerError", None, 500)
        await send_whole(send, 500, body)
        return
    request_id = await state.open_request(request.prompt_tokens)
    found = state.cache(request.prompt, request.cache_salt)
    cached = None if found is None else found.cached_tokens
    run = _Run(state, request_id, request, _pacing(config, request, cached), fault, send,
               cached)  # fmt: skip
    outcome: Outcome = "cancelled"
    try:
        work = run.stream if request.stream else run.complete
        finished = await race_disconnect(receive, lambda: work(scripts, emissions))
        outcome = "cancelled" if finished is None else "completed" if finished else "failed"
    finally:
        with anyio.CancelScope(shield=True):
            state.uncache(found)
            reasons = [script.finish_reason for script in scripts]
            await state.close_request(request_id, outcome, reasons)
    if outcome == "failed":
        raise SimulatedDrop(f"simulated drop after {fault.at} pieces")


def _plan(request: SimRequest) -> list[Script]:
    tool = request.tool
    return [
        build_script(
            request.mode,
            request.seed + index,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            chunks=request.sim.chunks,
            stops=request.stops,
            markers=request.markers,
            thinking=request.thinking,
            empty_reasoning=request.sim.empty_reasoning,
            tool=tool if tool is None or index == 0 else tool.again(),
            continuing=request.continuing,
            question=request.question,
            result=request.result,
        )
        for index in range(request.n)
    ]


def _schedule(request: SimRequest, scripts: list[Script]) -> tuple[Emission, ...]:
    """Streams merge tokens and suffer vLLM #51641; whole responses go token by token."""
    if not request.stream:
        return interleave(scripts)
    leak = leak_width(request.stops) if request.mode == "separated" else 0
    return interleave(scripts, merge=request.sim.merge, leak=leak)


def _fault(request: SimRequest, state: SimState, emissions: int) -> Fault:
    """The request's own ``sim.fail`` wins over the configured rates."""
    mode = request.sim.fail or state.roll_fault()
    after = request.sim.fail_after
    return Fault(mode, min(emissions, emissions // 2 if after is None else max(after, 0)))


def _pacing(config: SimConfig, request: SimRequest, cached: int | None) -> Pacing:
    """The request's latencies; with a prefill rate, its first token waits for the prompt's
    uncached tokens too."""
    sim = request.sim
    ttft = config.ttft_ms if sim.ttft_ms is None else sim.ttft_ms
    prefill = 0.0
    if config.prefill_tokens_per_s > 0:
        prefill = (request.prompt_tokens - (cached or 0)) / config.prefill_tokens_per_s
    itl = config.itl_ms if sim.itl_ms is None else sim.itl_ms
    stall = config.stall_ms if sim.stall_ms is None else sim.stall_ms
    return Pacing(ttft / 1000, itl / 1000, stall / 1000, prefill)


class _Run:
    """One admitted request: pacing, KV growth and fault points around an ``emit`` callback."""

    __slots__ = ("cached", "fault", "pacing", "request", "request_id", "send", "state")

    def __init__(
        self,
        state: SimState,
        request_id: int,
        request: SimRequest,
        pacing: Pacing,
        fault: Fault,
        send: Send,
        cached: int | None = None,  # cached prompt tokens, when the cache is simulated
    ) -> None:
        self.state = state
        self.request_id = request_id
        self.request = request
        self.pacing = pacing
        self.fault = fault
        self.send = send
        self.cached = cached

    async def stream(self, scripts: list[Script], emissions: tuple[Emission, ...]) -> bool:
        """SSE response; False if it was dropped (the caller then aborts the connection)."""
        request = self.request
        encoder = ChunkEncoder(
            _completion_id(), int(time.time()), request.model, request.include_usage
        )

        finals = [
            encoder.finish(index, script.finish_reason, script.stop_reason)
            for index, script in enumerate(scripts)
        ]

        calling: set[int] = set()  # choices whose tool call has started

        async def emit(item: Emission) -> None:
            if item.step == 0 and item.opens_step:
                for index in range(request.n):
                    await send_part(self.send, encoder.role(index))
            delta = item.delta
            if delta is not None and delta.channel == "tool":
                first = None if item.index in calling else scripts[item.index].tool
                calling.add(item.index)
                await send_part(self.send, encoder.tool_delta(item.index, delta, first))
            elif delta is not None and delta.text:
                await send_part(self.send, encoder.delta(item.index, delta))
            if item.finish_reason is not None:
                await send_part(self.send, finals[item.index])

        await send_start(self.send, 200, SSE, None)
        if not await self.drive(emissions, emit):
            return False
        if request.include_usage:
            await send_part(self.send, encoder.usage(self._usage(scripts)))
        await self.send({"type": "http.response.body", "body": DONE, "more_body": False})
        return True

    async def complete(self, scripts: list[Script], emissions: tuple[Emission, ...]) -> bool:
        """Whole JSON response after the simulated generation time; False if dropped."""
        request = self.request
        created = int(time.time())
        usage = self._usage(scripts)
        body = completion_body(
            _completion_id(), created, request.model, scripts, usage, request.mode
        )
        if await self.drive(emissions, _ignore):
            await send_whole(self.send, 200, body)
            return True
        await send_start(self.send, 200, b"application/json", len(body))
        await send_part(self.send, body[: len(body) // 2])
        return False

    async def drive(
        self, emissions: tuple[Emission, ...], emit: Callable[[Emission], Awaitable[None]]
    ) -> bool:
        """Admit, then pace and emit every emission; False if the fault drops the response."""
        prompt = self.request.prompt_tokens
        await self.state.admit(self.request_id, prompt)
        generated = 0
        for position, item in enumerate(emissions):
            if item.opens_step:
                if item.step == 0 and self.pacing.prefill:
                    await self._prefill()
                await _pause(self._step_time(item))
                generated += item.step_tokens
                await self.state.advance(self.request_id, prompt + generated, item.step_tokens)
            if not await self._checkpoint(position):
                return False
            await emit(item)
        return await self._checkpoint(len(emissions))

    async def _prefill(self) -> None:
        """The uncached prompt's prefill, sharing the engine's prefill speed with the requests
        prefilling when it starts (a crude processor sharing: an engine sent every request
        prefills each of them slower, as a real one does)."""
        state = self.state
        sharing = state.prefilling + 1
        state.prefilling += 1
        try:
            await asyncio.sleep(self.pacing.prefill * sharing)
        finally:
            state.prefilling -= 1

    def _step_time(self, item: Emission) -> float:
        """TTFT or ITL for the step's first token, ITL for each further one."""
        first = self.pacing.ttft if item.step == 0 else self.pacing.itl
        return first + self.pacing.itl * max(item.step_decodes - 1, 0)

    async def _checkpoint(self, position: int) -> bool:
        """Apply the fault if it is due before emission ``position``; False means drop."""
        if self.fault.mode is None or position != self.fault.at:
            return True
        if self.fault.mode == "drop":
            return False
        if self.pacing.stall > 0:
            await asyncio.sleep(self.pacing.stall)
        else:
            await anyio.sleep_forever()
        return True

    def _usage(self, scripts: list[Script]) -> SimUsage:
        usage = usage_for(scripts, self.request.mode, self.request.sim.reasoning_tokens)
        return dataclasses.replace(usage, cached_tokens=self.cached)


async def _pause(seconds: float) -> None:
    """Simulated latency; zero means no sleep at all (each chunk is still its own message)."""
    if seconds > 0:
        await asyncio.sleep(seconds)


async def _ignore(item: Emission) -> None:
    """A whole response emits nothing until the end."""


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"
