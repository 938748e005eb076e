"""Micro-benchmarks of the sans-I/O chunk path, in-process, with ``timeit``.

Each case is one call on one typical chunk: a 5-character token, and the ~220-byte event vLLM
sends for it. A case's figure is the best of several repeats (the least disturbed by other
processes on a shared machine) divided by the number of calls; ``json.loads`` of the same
payload is measured alongside as the yardstick the others are quoted against.
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from gateway.relay.rewrite import Policy, StreamRelay
from gateway.relay.sse import Event, SSEParser
from gateway.relay.thinksplit import ThinkSplitter

TOKEN = " user"  # a typical token: 4-6 characters
PAYLOAD = (
    b'{"id":"chatcmpl-86407dbf951146a6a5253bb2276245e3","object":"chat.completion.chunk",'
    b'"created":1796011202,"model":"deepseek-r1","choices":[{"index":0,"delta":'
    b'{"content":" user"},"logprobs":null,"finish_reason":null}],"usage":null}'
)
EVENT_BYTES = b"data: " + PAYLOAD + b"\n\n"
_END_OF_REASONING = PAYLOAD.replace(b'" user"', b'"\\n</think>\\n\\n"')


@dataclass(frozen=True, slots=True)
class MicroResult:
    name: str
    us_per_call: float
    calls: int


def run_micro(calls: int = 200_000, repeat: int = 5) -> list[MicroResult]:
    """Every case, in the order they are reported; ``json.loads`` first (the baseline)."""
    return [_measure(name, make(), calls, repeat) for name, make in _CASES]


def _measure(name: str, fn: Callable[[], object], calls: int, repeat: int) -> MicroResult:
    best = min(timeit.repeat(fn, number=calls, repeat=repeat))
    return MicroResult(name, best / calls * 1e6, calls)


def _json_loads() -> Callable[[], object]:
    return lambda: json.loads(PAYLOAD)


def _orjson_loads() -> Callable[[], object]:
    return lambda: orjson.loads(PAYLOAD)


def _splitter_reasoning() -> Callable[[], object]:
    splitter = ThinkSplitter("deepseek_r1")  # inside the template-opened reasoning block
    return lambda: splitter.feed(TOKEN)


def _splitter_format(name: str, token: str) -> Callable[[], Callable[[], object]]:
    def make() -> Callable[[], object]:
        splitter = ThinkSplitter(name)  # inside the template-opened reasoning block
        return lambda: splitter.feed(token)

    return make


def _splitter_answer() -> Callable[[], object]:
    splitter = ThinkSplitter("deepseek_r1")
    splitter.feed("reasoning\n</think>\n\n")
    return lambda: splitter.feed(TOKEN)


def _sse_parser() -> Callable[[], object]:
    parser = SSEParser()
    return lambda: parser.feed(EVENT_BYTES)


def _sse_parser_byte() -> Callable[[], object]:
    """One byte of a line that never ends: the cost of a read stays the same however long
    the line already is (the parser joins a line's reads once, at its end)."""
    parser = SSEParser(max_event=1 << 31)
    parser.feed(b"data: ")
    return lambda: parser.feed(b"x")


def _relay(show_reasoning: bool, answer: bool) -> Callable[[], Callable[[], object]]:
    def make() -> Callable[[], object]:
        relay = StreamRelay(Policy.named("deepseek_r1", show_reasoning, "reasoning_content"))
        if answer:
            relay.feed(Event(_END_OF_REASONING))
        event = Event(PAYLOAD)
        return lambda: relay.feed(event)

    return make


def _parse_and_relay() -> Callable[[], object]:
    parser = SSEParser()
    relay = StreamRelay(Policy.named("deepseek_r1", True, "reasoning_content"))

    def step() -> object:
        return [relay.feed(event) for event in parser.feed(EVENT_BYTES)]

    return step


_CASES: list[tuple[str, Callable[[], Callable[[], object]]]] = [
    ("json.loads (baseline)", _json_loads),
    ("orjson.loads", _orjson_loads),
    ("ThinkSplitter.feed, reasoning", _splitter_reasoning),
    ("ThinkSplitter.feed, answer", _splitter_answer),
    ("ThinkSplitter.feed, reasoning, Kimi K3 markers", _splitter_format("kimi_k3", TOKEN)),
    ("ThinkSplitter.feed, reasoning, Qwen3 markers", _splitter_format("qwen3", TOKEN)),
    # not a typical chunk (kept out of the ≤ 1 µs target): a '<' makes the splitter look for
    # a marker and a prefix of one to hold
    ("Marker scan: reasoning chunk with '<', R1", _splitter_format("deepseek_r1", " a<b")),
    ("Marker scan: reasoning chunk with '<', Kimi K3", _splitter_format("kimi_k3", " a<b")),
    ("SSEParser.feed, one event", _sse_parser),
    ("SSEParser.feed, one byte of a line 1M bytes long", _sse_parser_byte),
    ("StreamRelay.feed, reasoning shown", _relay(show_reasoning=True, answer=False)),
    ("StreamRelay.feed, reasoning hidden", _relay(show_reasoning=False, answer=False)),
    ("StreamRelay.feed, answer", _relay(show_reasoning=True, answer=True)),
    ("SSEParser + StreamRelay, reasoning", _parse_and_relay),
]


if __name__ == "__main__":  # python -m bench.micro: the table alone, without the load runs
    results = run_micro()
    for result in results:
        ratio = result.us_per_call / results[0].us_per_call
        print(f"{result.name:55} {result.us_per_call:7.3f} µs  {ratio:5.2f}×")
