"""Guard models over a request: what each is asked, and which upstream events wait (sans-I/O).

A guard model (``GuardModel``: Llama Guard on vLLM, or any OpenAI-compatible chat endpoint
that answers the same way) judges text; it is asked (``GuardAsk``) with a conversation of the
request's prompt as the user's turn and the judged text as the agent's, and answers ``safe``
or ``unsafe`` with a line of categories (``parse_verdict``). A verdict counts (``judged``) when
it is unsafe in one of the detector's ``categories`` (any, when it names none).

A stream (``ModelScreen``) is judged while it comes:

- The engine's events go through ``add`` and are **held**: an event goes out (``ready``) only
  once every ``block`` policy's guard model has found safe all the text it and the events
  before it carry. ``flag`` policies hold nothing; their asks are only waited for at the end.
- Each choice is split into reasoning and answer by a state of its own (the relay's split,
  same format and source), and each channel is asked about at its boundaries: a sentence end
  (``every: sentence``: ``.!?…`` before white space, ``。！？``, a line break) or a paragraph
  end (a blank line), once per event however many it completes, and at the channel's end (the
  reasoning ends when the answer begins, both with the choice). An ask carries the channel's
  text from its start to the boundary, its last ``window`` characters when longer.
- An unsafe verdict of a ``block`` policy (or a guard model that failed, under
  ``on_error: block``) ends the choice where the judged text began: the events before that
  point still go out as their own verdicts find them safe (whatever order verdicts come back
  in); the first event that reaches it, and everything after, is dropped (the text before the
  judged sentence that shares an engine event with it included), nothing more of the choice
  is let through, and ``ready`` hands out an ``Acted`` with an empty event of the choice for the
  relay to end it in its endpoint's shape. A ``flag`` verdict is an ``Acted`` without one;
  a flag policy is not asked about that channel of that choice again (every later ask would
  carry the same text, and flag it again).
- ``[DONE]`` waits for every ask.

A whole response is asked about once per channel per ``window`` of text (``whole_asks``); the
prompt, once (``prompt_asks``).
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.guard.policy import Channel, GuardModel, GuardPolicy
from gateway.relay.choice import ChoiceState
from gateway.relay.guarding import GuardAct
from gateway.relay.rewrite import parse_chunk, text_fields
from gateway.relay.sse import Event

Rule = tuple[GuardPolicy, GuardModel]
_CATEGORY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,31}")
_BOUNDARY = {
    "sentence": re.compile(r"[.!?…](?=\s)|[。！？]|\n"),
    "paragraph": re.compile(r"\n[ \t]*\n"),
}


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    unsafe: bool
    categories: tuple[str, ...] = ()


class VerdictError(ValueError):
    """A guard model answered something that is not a verdict."""


def parse_verdict(text: str) -> GuardVerdict:
    """Llama Guard's answer: ``safe``, or ``unsafe`` and a line ``S1,S10``."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    head = lines[0].casefold() if lines else ""
    if head == "safe":
        return GuardVerdict(False)
    if head == "unsafe":  # only category names are kept: a guard that says more is not echoed
        named = lines[1].split(",") if len(lines) > 1 else []
        kept = [c.strip() for c in named if _CATEGORY.fullmatch(c.strip())]
        return GuardVerdict(True, tuple(kept[:16]))
    raise VerdictError("the guard model's answer is neither 'safe' nor 'unsafe'")


@dataclass(frozen=True, slots=True)
class GuardAsk:
    id: int
    choice: int | None  # None: the prompt
    channel: Channel
    policy: GuardPolicy
    judge: GuardModel
    messages: tuple[dict[str, str], ...]  # the conversation the guard model judges
    text: str  # what this ask decides (an act's value: hashed before it is recorded)
    start: int = 0  # where ``text`` starts in its channel

    def body(self) -> dict[str, Any]:
        """The guard request (``params`` may change the defaults, never what is judged)."""
        return {"max_tokens": 32, "temperature": 0, **dict(self.judge.params),
                "model": self.judge.model, "messages": list(self.messages),
                "stream": False}  # fmt: skip


def judged(ask: GuardAsk, verdict: GuardVerdict | None) -> GuardAct | None:
    """What a verdict (``None``: the guard model could not answer) makes the policy do."""
    policy, judge = ask.policy, ask.judge
    if verdict is None:
        if policy.on_error == "allow":
            return None
        return GuardAct(policy.name, "block", ask.channel, f"{judge.name}:unavailable", ask.text)
    named = judge.categories
    counted = verdict.unsafe and (not named or not verdict.categories
                                  or not named.isdisjoint(verdict.categories))  # fmt: skip
    if not counted:
        return None
    detector = judge.name + (":" + ",".join(verdict.categories) if verdict.categories else "")
    return GuardAct(policy.name, policy.action, ask.channel, detector, ask.text)


@dataclass(frozen=True, slots=True)
class Acted:
    """A guard model's act on a choice; ``event`` (a block): an empty event of the choice, for
    the relay to end it once its guard is stopped."""

    choice: int
    act: GuardAct
    event: Event | None


def prompt_texts(body: dict[str, Any]) -> list[str] | None:
    """Every text of a request's prompt a guard model judges: each message's (every role's)
    text, or each legacy prompt; ``None`` for a prompt of token ids (nothing it can read)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        return None
    messages = body.get("messages")
    listed: list[Any] = messages if isinstance(messages, list) else []
    return [_text(m.get("content")) for m in listed if isinstance(m, dict)]


def prompt_text(body: dict[str, Any]) -> str:
    """The user's turn a guard model is shown beside the judged output: the last user
    message's text (chat), or the prompt (completions)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    messages = body.get("messages")
    listed: list[Any] = messages if isinstance(messages, list) else []
    for message in reversed(listed):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))  # fmt: skip
    return ""


_ids = itertools.count(1)


def _ask(rule: Rule, choice: int | None, channel: Channel, prompt: str, text: str,
         start: int, end: int) -> GuardAsk:  # fmt: skip
    policy, judge = rule
    window = judge.window
    shown = text[max(0, end - window) : end]  # the judged piece (no longer than window) last
    if channel == "prompt":
        messages: tuple[dict[str, str], ...] = ({"role": "user", "content": shown},)
    else:
        messages = ({"role": "user", "content": prompt[-window:]},
                    {"role": "assistant", "content": shown})  # fmt: skip
    return GuardAsk(next(_ids), choice, channel, policy, judge, messages, text[start:end], start)


def prompt_asks(rules: Sequence[Rule], texts: Sequence[str]) -> list[GuardAsk]:
    """One ask per ``window`` of each text of the prompt (blank ones aside)."""
    return [_ask(rule, None, "prompt", text, text, at, upto)
            for rule in rules if "prompt" in rule[0].channels
            for text in texts if text.strip()
            for at, upto in _windows(0, len(text), rule[1].window)]  # fmt: skip


def _windows(start: int, end: int, window: int) -> list[tuple[int, int]]:
    """``[start, end)`` in pieces of at most ``window`` characters (a guard model is shown
    no more than that of what it decides, so each piece is asked about)."""
    return [(at, min(end, at + window)) for at in range(start, end, window)]


def whole_asks(rules: Sequence[Rule], body: dict[str, Any], start: Callable[[], ChoiceState],
               prompt: str, completions: bool) -> list[GuardAsk]:  # fmt: skip
    """One ask per channel per ``window`` of each choice's text (a whole response)."""
    asks: list[GuardAsk] = []
    for choice in body.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if completions:
            text, reasoning = choice.get("text"), None
        else:
            text, reasoning = text_fields(choice.get("message") or {})
        split = start().take(text if isinstance(text, str) else None, reasoning, True)
        for channel, said in zip(("reasoning", "answer"), split, strict=True):
            for rule in rules:
                if channel not in rule[0].channels:
                    continue
                if not said.strip():
                    continue
                for at, end in _windows(0, len(said), rule[1].window):
                    asks.append(_ask(rule, int(choice.get("index") or 0), channel, prompt,
                                     said, at, end))  # fmt: skip
    return asks


@dataclass(slots=True)
class _Lane:
    """One rule over one channel of one choice: how far it was asked, how far found safe."""

    asked: int = 0
    cleared: int = 0
    flagged: bool = False  # a flag policy acted: it is not asked again about this channel
    open: deque[list[int]] = field(default_factory=deque)  # [end, ask id or 0 once safe]


@dataclass(slots=True)
class _Choice:
    state: ChoiceState
    text: dict[str, str]
    lanes: dict[tuple[str, int], _Lane]
    envelope: dict[str, Any] = field(default_factory=dict)  # the last chunk, choices aside


@dataclass(slots=True)
class _Held:
    event: Event
    needs: list[tuple[int, int, int]]  # (choice, reasoning length, answer length) it carries
    done: bool = False


class ModelScreen:
    """A stream's events held until its guard models found their text safe (module doc)."""

    def __init__(self, rules: Sequence[Rule], start: Callable[[], ChoiceState], prompt: str,
                 completions: bool) -> None:  # fmt: skip
        self.rules = tuple(rules)
        self._start, self._prompt, self._completions = start, prompt, completions
        self._choices: dict[int, _Choice] = {}
        self._held: deque[_Held] = deque()
        self._asks: dict[int, tuple[GuardAsk, int]] = {}  # open asks: (ask, rule index)
        self._blocked: set[int] = set()
        self._stops: dict[int, tuple[tuple[bool, int], GuardAct]] = {}  # choice: where, why
        self._acted: list[Acted] = []

    @property
    def waiting(self) -> int:
        """Asks not answered yet."""
        return len(self._asks)

    def add(self, event: Event) -> list[GuardAsk]:
        """Hold ``event``; the asks the text it completes needs."""
        asks: list[GuardAsk] = []
        if event.is_done:
            for index, choice in self._choices.items():
                if index not in self._blocked:
                    asks += self._grow(index, choice, "reasoning", "", True)
                    asks += self._grow(index, choice, "answer", "", True)
            self._held.append(_Held(event, [], done=True))
            return asks
        chunk = parse_chunk(event)
        choices = chunk.get("choices")
        needs: list[tuple[int, int, int]] = []
        if isinstance(choices, list) and choices:
            kept = []
            for raw in choices:
                index = int(raw.get("index") or 0) if isinstance(raw, dict) else 0
                if index in self._blocked:
                    continue
                kept.append(raw)
                if isinstance(raw, dict):
                    asks += self._take(index, chunk, raw)
                    choice = self._choices[index]
                    needs.append((index, len(choice.text["reasoning"]),
                                  len(choice.text["answer"])))  # fmt: skip
            if len(kept) != len(choices):
                if not kept and chunk.get("usage") is None:
                    return asks
                event = Event(orjson.dumps({**chunk, "choices": kept}), event.event)
        self._held.append(_Held(event, needs))
        return asks

    def _take(self, index: int, chunk: dict[str, Any], raw: dict[str, Any]) -> list[GuardAsk]:
        choice = self._choices.get(index)
        if choice is None:
            lanes: dict[tuple[str, int], _Lane] = {
                (channel, k): _Lane() for k, (policy, _) in enumerate(self.rules)
                for channel in ("reasoning", "answer") if channel in policy.channels
            }  # fmt: skip
            texts = {"reasoning": "", "answer": ""}
            choice = self._choices[index] = _Choice(self._start(), texts, lanes)
        choice.envelope = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        if self._completions:
            text, reasoning = raw.get("text"), None
        else:
            text, reasoning = text_fields(raw.get("delta") or {})
        final = raw.get("finish_reason") is not None
        said, answer = choice.state.take(text if isinstance(text, str) else None, reasoning,
                                         final)  # fmt: skip
        asks = self._grow(index, choice, "reasoning", said, final or bool(answer))
        return asks + self._grow(index, choice, "answer", answer, final)

    def _grow(self, index: int, choice: _Choice, channel: Channel, text: str,
              final: bool) -> list[GuardAsk]:  # fmt: skip
        whole = choice.text[channel] = choice.text[channel] + text
        asks = []
        for k, rule in enumerate(self.rules):
            lane = choice.lanes.get((channel, k))
            if lane is None or lane.flagged:
                continue
            end = len(whole) if final else _boundary(whole, lane.asked, rule[1].every)
            if end is None or end <= lane.asked:
                continue
            if not whole[lane.asked : end].strip():  # white space: nothing to judge
                if final:
                    lane.asked = end
                    lane.open.append([end, 0])
                    _advance(lane)
                continue
            for at, upto in _windows(lane.asked, end, rule[1].window):
                ask = _ask(rule, index, channel, self._prompt, whole, at, upto)
                lane.open.append([upto, ask.id])
                self._asks[ask.id] = (ask, k)
                asks.append(ask)
            lane.asked = end
        return asks

    def resolve(self, ask_id: int, verdict: GuardVerdict | None) -> None:
        """A guard model's answer to an ask (``None``: it could not answer)."""
        entry = self._asks.pop(ask_id, None)
        if entry is None:
            return  # its choice was ended meanwhile
        ask, k = entry
        assert ask.choice is not None
        act = judged(ask, verdict)
        lane = self._choices[ask.choice].lanes[(ask.channel, k)]
        if act is not None and act.action == "block":
            # the text before this ask's goes out once found safe; from its start on, none
            # (an earlier ask found unsafe later moves the point back)
            at = (ask.channel == "answer", ask.start)
            known = self._stops.get(ask.choice)
            if known is None or at < known[0]:
                self._stops[ask.choice] = (at, act)
            return  # never cleared: the events past it wait until ``ready`` ends the choice
        for item in lane.open:
            if item[1] == ask_id:
                item[1] = 0
        _advance(lane)
        if act is not None:
            if not lane.flagged:  # asks already out when the first flag came flag nothing new
                self._acted.append(Acted(ask.choice, act, None))
            lane.flagged = True

    def _block(self, index: int, act: GuardAct) -> None:
        self._blocked.add(index)
        choice = self._choices[index]
        empty = {"index": index, "text": ""} if self._completions else {"index": index, "delta": {}}
        ending = {**choice.envelope, "choices": [{**empty, "finish_reason": None}]}
        self._acted.append(Acted(index, act, Event(orjson.dumps(ending))))
        for ask_id in [i for i, (ask, _) in self._asks.items() if ask.choice == index]:
            del self._asks[ask_id]
        kept: deque[_Held] = deque()
        for held in self._held:
            if all(need[0] != index for need in held.needs):
                kept.append(held)
                continue
            chunk = parse_chunk(held.event)
            rest = [c for c in chunk.get("choices") or ()
                    if not (isinstance(c, dict) and int(c.get("index") or 0) == index)]  # fmt: skip
            if rest or chunk.get("usage") is not None:
                data = orjson.dumps({**chunk, "choices": rest})
                kept.append(_Held(Event(data, held.event.event),
                                  [n for n in held.needs if n[0] != index]))  # fmt: skip
        self._held = kept

    def ready(self) -> list[Event | Acted]:
        """What may go to the relay now, in order: acts first, then the events found safe."""
        out: list[Event | Acted] = list(self._acted)
        self._acted.clear()
        while self._held:
            held = self._held[0]
            past = [i for i, r, a in held.needs if i in self._stops
                    and _past(self._stops[i][0], r, a)]  # fmt: skip
            if past:
                for index in past:
                    self._block(index, self._stops.pop(index)[1])
                out += self._acted
                self._acted.clear()
                continue  # the event, without the ended choices (or gone)
            if not self._clear(held):
                break
            out.append(self._held.popleft().event)
        return out

    def _clear(self, held: _Held) -> bool:
        if held.done:
            return not self._asks
        for index, reasoning, answer in held.needs:
            if index in self._blocked:
                continue
            lanes = self._choices[index].lanes
            for (channel, k), lane in lanes.items():
                policy = self.rules[k][0]
                if lane.flagged or (policy.action != "block" and policy.on_error != "block"):
                    continue  # flag: holds nothing
                if lane.cleared < (reasoning if channel == "reasoning" else answer):
                    return False
        return True

    def cut(self) -> None:
        """The gateway ended choice 0's reasoning (its budget): what is held is never sent,
        and the continuation's text is all answer."""
        self._held.clear()
        self._asks.clear()
        self._stops.clear()
        for choice in self._choices.values():
            choice.state.end_reasoning()
            for lane in choice.lanes.values():
                lane.open.clear()
            for (channel, _), lane in choice.lanes.items():
                lane.asked = lane.cleared = len(choice.text[channel])


def _past(at: tuple[bool, int], reasoning: int, answer: int) -> bool:
    """Whether an event that leaves a choice's channels this long carries text at or past
    ``at`` (channel: answer or not, and the position in it)."""
    in_answer, start = at
    return answer > start if in_answer else reasoning > start or answer > 0


def _advance(lane: _Lane) -> None:
    """Move ``cleared`` past the segments found safe in order."""
    while lane.open and lane.open[0][1] == 0:
        lane.cleared = lane.open.popleft()[0]


def _boundary(text: str, start: int, every: Literal["sentence", "paragraph"]) -> int | None:
    """Where the last boundary after ``start`` ends, if one does."""
    end = None
    for match in _BOUNDARY[every].finditer(text, start):
        end = match.end()
    return end
