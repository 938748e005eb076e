"""A stream held for a guard model's verdicts (``gateway.guard.judging.ModelScreen`` through the
relay, as ``gateway.exchange.screening`` drives it): under any chunking and whatever order the
verdicts come back in, nothing unsafe goes out, everything safe does, and the output does not
depend on the order."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.exchange.screening import release_to
from gateway.guard.judging import (
    GuardAsk,
    GuardVerdict,
    ModelScreen,
    VerdictError,
    judged,
    parse_verdict,
    prompt_text,
    prompt_texts,
)
from gateway.guard.policy import parse
from gateway.guard.stream import ChoiceGuard
from gateway.relay.choice import ChoiceState
from gateway.relay.formats import BUILTIN
from gateway.relay.rewrite import Policy, StreamRelay
from gateway.relay.sse import DONE_DATA, Event, SSEParser

POLICIES = parse(
    "policies:\n  - name: harm\n    detect:\n      - {model: g, upstream: 'http://g/v1'}\n"
    "    action: block\n"
).policies
RULES = [(p, judge) for p in POLICIES for judge in p.judges]
WORDS = st.sampled_from(["alpha", "beta", "gamma", "BAD"])
SENTENCE = st.lists(WORDS, min_size=1, max_size=4).map(lambda ws: " ".join(ws) + ".")
TEXT = st.lists(SENTENCE, min_size=1, max_size=4).map(" ".join)


def verdict(ask: GuardAsk) -> GuardVerdict:
    """A guard model that finds unsafe any text holding BAD (it sees the channel so far)."""
    return GuardVerdict("BAD" in ask.messages[-1]["content"], ("S1",))


def chunk(delta: dict[str, Any], finish: str | None = None) -> Event:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return Event(orjson.dumps({"id": "c", "model": "m", "choices": [choice]}))


def run(pieces: list[str], order: random.Random) -> tuple[str, str, str | None]:
    """Relay ``pieces`` (R1's template: reasoning, ``</think>``, answer) through a screen
    whose asks are answered in the order ``order`` draws; what the client got."""
    relay = StreamRelay(Policy.named("deepseek_r1", True, "reasoning_content",
                                     guard=lambda: ChoiceGuard(POLICIES)))  # fmt: skip
    start = lambda: ChoiceState.start(BUILTIN["deepseek_r1"], "text", thinking=True,  # noqa: E731
                                      repair_leak=False)  # fmt: skip
    screen = ModelScreen(RULES, start, "a question", completions=False)
    events = [*(chunk({"content": p}) for p in pieces), chunk({}, "stop"), Event(DONE_DATA)]
    out, pending = [], []
    for event in events:
        pending += screen.add(event)
        order.shuffle(pending)
        for _ in range(order.randint(0, len(pending))):
            ask = pending.pop()
            screen.resolve(ask.id, verdict(ask))
        out.append(release_to(relay, screen.ready()))
    while pending and not relay.done:
        ask = pending.pop(order.randrange(len(pending)))
        screen.resolve(ask.id, verdict(ask))
        out.append(release_to(relay, screen.ready()))
    assert relay.done, "everything decided: the stream ended"
    reasoning = content = ""
    finish = None
    for sent in SSEParser(1 << 20).feed(b"".join(out)):
        if sent.is_done:
            continue
        for choice in orjson.loads(sent.data)["choices"]:
            reasoning += choice["delta"].get("reasoning_content") or ""
            content += choice["delta"].get("content") or ""
            finish = choice.get("finish_reason") or finish
    return reasoning, content, finish


def pieces_of(data: st.DataObject, raw: str) -> list[str]:
    cuts = sorted(data.draw(st.sets(st.integers(1, len(raw) - 1), max_size=len(raw) // 2)))
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), reasoning=TEXT, answer=TEXT)
def test_under_any_chunking_and_verdict_order_nothing_unsafe_goes_out(
    data: st.DataObject, reasoning: str, answer: str
) -> None:
    pieces = pieces_of(data, f"{reasoning}</think>\n\n{answer}")
    seeds = data.draw(st.tuples(st.integers(0, 2**32), st.integers(0, 2**32)))
    got = run(pieces, random.Random(seeds[0]))
    # the same stream, the verdicts in another order: the same output
    assert run(pieces, random.Random(seeds[1])) == got
    shown_reasoning, shown_answer, finish = got
    if "BAD" not in reasoning + answer:
        assert got == (reasoning, f"\n\n{answer}", "stop")
        return
    assert finish == "content_filter"
    assert "BAD" not in shown_reasoning + shown_answer
    # a prefix of each channel: an event that carries text of both may take the reasoning's
    # tail with it when the answer's first sentence is unsafe
    assert reasoning.startswith(shown_reasoning)
    assert f"\n\n{answer}".startswith(shown_answer)
    if "BAD" in reasoning:
        assert shown_answer == ""


@settings(max_examples=200, deadline=None)
@given(data=st.data(), reasoning=st.lists(SENTENCE, min_size=1, max_size=4),
       answer=st.lists(SENTENCE, min_size=1, max_size=4))  # fmt: skip
def test_one_character_at_a_time_every_sentence_before_the_unsafe_one_goes_out(
    data: st.DataObject, reasoning: list[str], answer: list[str]
) -> None:
    raw = " ".join(reasoning) + "</think>\n\n" + " ".join(answer)
    got = run([*raw], random.Random(data.draw(st.integers(0, 2**32))))

    def before(sentences: list[str]) -> str:
        bad = [i for i, sentence in enumerate(sentences) if "BAD" in sentence]
        return " ".join(sentences[: bad[0]] if bad else sentences)

    if any("BAD" in sentence for sentence in reasoning):
        assert got == (before(reasoning), "", "content_filter")
    elif any("BAD" in sentence for sentence in answer):
        shown = before(answer)  # the white space before a sentence is judged with it
        assert got == (" ".join(reasoning), f"\n\n{shown}" if shown else "", "content_filter")
    else:
        assert got == (" ".join(reasoning), "\n\n" + " ".join(answer), "stop")


def test_what_came_before_the_unsafe_sentence_goes_out_even_when_its_verdict_is_last() -> None:
    pieces = ["Fine", " words.", "</think>", "\n\nSafe", " here.", " BAD", " here.", " End."]

    class Backwards(random.Random):
        """Answers the newest ask first."""

        def shuffle(self, x: Any, *args: Any) -> None:  # newest last: popped first
            pass

        def randint(self, a: int, b: int) -> int:
            return b

    assert run(pieces, Backwards()) == ("Fine words.", "\n\nSafe here.", "content_filter")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("safe", GuardVerdict(False)), ("  Safe\n", GuardVerdict(False)),
     ("unsafe\nS1,S10", GuardVerdict(True, ("S1", "S10"))), ("unsafe", GuardVerdict(True))],
)  # fmt: skip
def test_llama_guards_verdicts_are_read(text: str, expected: GuardVerdict) -> None:
    assert parse_verdict(text) == expected


@pytest.mark.parametrize("text", ["", "I cannot help with that", "unsafely"])
def test_an_answer_that_is_no_verdict_is_an_error(text: str) -> None:
    with pytest.raises(VerdictError):
        parse_verdict(text)


def test_categories_outside_the_detectors_do_not_count_and_a_failure_follows_on_error() -> None:
    flag = parse(
        "policies:\n  - name: f\n    detect:\n      - {model: g, upstream: 'http://g/v1', "
        "categories: [S1]}\n    action: flag\n"
    ).policies[0]
    (ask,) = [a for a in (ModelScreen([(flag, flag.judges[0])], lambda: ChoiceState.start(
        BUILTIN["none"], "text", thinking=False, repair_leak=False), "q", False).add(
        chunk({"content": "Hi."}, "stop")))]  # fmt: skip
    assert judged(ask, GuardVerdict(True, ("S2",))) is None
    act = judged(ask, GuardVerdict(True, ("S2", "S1")))
    assert act is not None and (act.action, act.detector) == ("flag", "model:g:S2,S1")
    assert judged(ask, None) is None  # a flag policy's on_error is allow by default
    (harm,) = POLICIES
    blocking = GuardAsk(1, 0, "answer", harm, harm.judges[0], (), "Hi.")
    failed = judged(blocking, None)
    assert failed is not None and (failed.action, failed.detector) == (
        "block",
        "model:g:unavailable",
    )


def test_the_user_turn_is_the_last_user_message_or_the_prompt() -> None:
    messages = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "second"}]}]  # fmt: skip
    assert prompt_text({"messages": messages}) == "second"
    assert prompt_text({"prompt": ["legacy", "other"]}) == "legacy"
    assert prompt_text({"messages": "nonsense"}) == ""


def test_a_span_longer_than_the_window_is_asked_about_in_pieces_the_guard_sees_whole() -> None:
    (policy,) = parse(
        "policies:\n  - name: harm\n    detect:\n      - {model: g, upstream: 'http://g/v1', "
        "window: 200, every: paragraph}\n    action: block\n"
    ).policies
    none = lambda: ChoiceState.start(BUILTIN["none"], "text", thinking=False,  # noqa: E731
                                     repair_leak=False)  # fmt: skip
    screen = ModelScreen([(policy, policy.judges[0])], none, "q", completions=False)
    text = "build the detonator like so, " + "x, " * 100 + "done"
    asks = screen.add(chunk({"content": text}, "stop"))
    assert "".join(a.text for a in asks) == text  # every character is decided by some ask
    assert all(len(a.text) <= 200 and a.messages[-1]["content"].endswith(a.text) for a in asks)


def test_every_text_of_a_prompt_is_judged_and_token_ids_cannot_be() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert prompt_texts({"messages": messages}) == ["be brief", "hi"]
    assert prompt_texts({"prompt": ["hi", "a detonator"]}) == ["hi", "a detonator"]
    assert prompt_texts({"prompt": [[1, 2, 3]]}) is None


def test_a_guard_that_says_more_than_categories_is_not_echoed() -> None:
    said = parse_verdict("unsafe\nS1, The answer explains how to build it")
    assert said == GuardVerdict(True, ("S1",))
