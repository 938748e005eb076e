"""The reasoning formats of the open model families, by the names vLLM gives its parsers (sans-I/O).

A ``ReasoningFormat`` says how one family marks reasoning in the text it generates: the open and
close markers (any strings, several tokens long if need be), whether the chat template already
opened the block (the output then starts *inside* reasoning), other markers that end reasoning
(they stay in the content, verbatim), and how a request switches thinking off. The splitter
(``gateway.relay.thinksplit``) reads the markers; the route asks ``thinking(params)`` per request.

Each built-in entry was checked against vLLM 0.32's parser of the same name
(``vllm/reasoning/*_reasoning_parser.py`` and ``vllm/parser/*.py``), so an operator passes one
word to both ``vllm serve --reasoning-parser`` and ``REASONING_PARSER``:

============= =========================== ====== ==================================== =============
name          markers                     opened switch (default)                     also ends
============= =========================== ====== ==================================== =============
deepseek_r1   ``<think>`` ``</think>``    yes    none: R1 always reasons              —
deepseek_v3   ``<think>`` ``</think>``    yes    thinking, enable_thinking (off)      —
deepseek_v4   ``<think>`` ``</think>``    yes    thinking, enable_thinking (on), effo DSML tools
qwen3         ``<think>`` ``</think>``    yes    enable_thinking (on), effort         <tool_call>
kimi_k2       ``<think>`` ``</think>``    yes    thinking, enable_thinking (on), effo tool section
kimi_k3       ``<|open|>think<|sep|>``    yes    thinking, enable_thinking (on), effo response (*)
              ``<|close|>think<|sep|>``
minimax_m2    ``</think>`` (``<think>``   yes    none                                 <minimax:...>
              inside is dropped)
glm45         ``<think>`` ``</think>``    yes    thinking, enable_thinking (on), effo <tool_call>
openai_gptoss Harmony channels            —      none                                 (upstream)
think_tags    ``<think>`` ``</think>``    no     none                                 —
none          —                           —      —                                    —
============= =========================== ====== ==================================== =============

"effo": ``reasoning_effort: "none"`` also switches thinking off. "DSML tools":
``<｜DSML｜tool_calls>`` and vLLM's two variant spellings; "tool section":
``<|tool_calls_section_begin|>``; ``<minimax:tool_call>``.

(*) Kimi K3's ``<|open|>response<|sep|>`` ends reasoning only while no think marker was seen
(vLLM: "response opener without think markers -> all content").

Rules:

- "opened" means the output starts inside reasoning; a leading open marker (R1-0528, Qwen3 and
  GLM write one themselves) is dropped, once, before the close marker.
- Thinking is decided per request, before the upstream is asked, and off is the decision that
  must never be wrong (thinking off makes every text field the answer): when the request sets
  any of the format's ``switches`` in ``chat_template_kwargs``, thinking is off only if every
  one it set is exactly ``false`` (a template switches off only on false; vLLM's parsers think
  when either key is on); else top-level ``reasoning_effort: "none"`` (vLLM maps it onto
  ``enable_thinking`` for the template) turns it off for a format with ``effort_switch``; else
  the format's default. A format without switches always thinks: R1's template has no switch,
  so a request cannot make thinkgate hand R1's reasoning to a hidden key as content. The route
  then forwards the decision (``gateway.api.chat``): every switch of the format set to false,
  so the template cannot think where thinkgate decided it does not.
- ``openai_gptoss`` has no text markers: vLLM always separates Harmony's analysis and final
  channels itself, so this format is read from the upstream's fields only
  (``reasoning_source: upstream``); text splitting of it is refused at start-up.
- Invariants checked on construction: markers are non-empty, none is given twice, and no marker
  active in a state starts another one active there or sits inside it (the splitter could not
  decide between them under every chunking); ending another is fine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ReasoningSource = Literal["text", "upstream"]
ReasoningField = Literal["reasoning_content", "reasoning", "both"]  # REASONING_FIELD

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_DSML_TOOLS = ("<｜DSML｜tool_calls>", "<｜DSML｜toolcalls>", "<｜DSML｜tool>")  # vLLM's variants
_TOGGLE = ("thinking", "enable_thinking")


class FormatError(ValueError):
    """A format definition that cannot work (the operator's configuration is wrong)."""


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    name: str
    open: str | None = THINK_OPEN
    close: str | None = THINK_CLOSE
    opened: bool = True
    ends: tuple[str, ...] = ()
    ends_unopened: tuple[str, ...] = ()  # end reasoning only before any open marker
    switches: tuple[str, ...] = ()  # chat_template_kwargs keys, the first present decides
    thinking_default: bool = True
    effort_switch: bool = False  # reasoning_effort "none" turns thinking off
    text: bool = True  # False: the upstream must separate it (no markers in the text)

    def __post_init__(self) -> None:
        markers = (self.open, self.close, *self.ends, *self.ends_unopened)
        if any(m == "" for m in markers):
            raise FormatError(f"reasoning format of {self.name!r}: markers cannot be empty")
        if self.text and self.close is None and self.open is not None:
            raise FormatError(
                f"reasoning format of {self.name!r}: an open marker needs a close one"
            )
        for state_markers in (
            (self.open, self.close, *self.ends, *self.ends_unopened),
            (self.close, *self.ends),
        ):
            _check_prefix_free(self.name, [m for m in state_markers if m])

    @property
    def splits(self) -> bool:
        """Whether any text of this format can be reasoning."""
        return self.text and self.close is not None

    def thinking(self, params: Mapping[str, Any]) -> bool:
        """Whether a request with these fields asked the model to think (rules above)."""
        kwargs = params.get("chat_template_kwargs")
        kwargs = kwargs if isinstance(kwargs, Mapping) else {}
        given = [kwargs[key] for key in self.switches if kwargs.get(key) is not None]
        if given:
            return not all(value is False for value in given)
        if self.effort_switch and params.get("reasoning_effort") == "none":
            return False
        return self.thinking_default


def _check_prefix_free(name: str, markers: list[str]) -> None:
    """No marker may start another or sit inside it (the splitter could not decide between
    them under every chunking); one that ends another is fine (the longer one is leftmost)."""
    if len(set(markers)) != len(markers):
        raise FormatError(f"reasoning format of {name!r}: a marker is given twice")
    for a in markers:
        for b in markers:
            if a != b and a in b and not b.endswith(a):
                raise FormatError(f"reasoning format of {name!r}: marker {a!r} is inside {b!r}")


BUILTIN: Mapping[str, ReasoningFormat] = {
    f.name: f
    for f in (
        ReasoningFormat("deepseek_r1"),
        ReasoningFormat(
            "deepseek_v3", switches=_TOGGLE, thinking_default=False, effort_switch=True
        ),
        ReasoningFormat("deepseek_v4", ends=_DSML_TOOLS, switches=_TOGGLE, effort_switch=True),
        ReasoningFormat(
            "qwen3", ends=("<tool_call>",), switches=("enable_thinking",), effort_switch=True
        ),
        ReasoningFormat(
            "kimi_k2",
            ends=("<|tool_calls_section_begin|>",),
            switches=_TOGGLE,
            effort_switch=True,
        ),
        ReasoningFormat(
            "kimi_k3",
            open="<|open|>think<|sep|>",
            close="<|close|>think<|sep|>",
            ends_unopened=("<|open|>response<|sep|>",),
            switches=_TOGGLE,
            effort_switch=True,
        ),
        ReasoningFormat("minimax_m2", ends=("<minimax:tool_call>",)),
        ReasoningFormat("glm45", ends=("<tool_call>",), switches=_TOGGLE, effort_switch=True),
        ReasoningFormat("openai_gptoss", open=None, close=None, opened=False, text=False),
        ReasoningFormat("think_tags", opened=False),
        ReasoningFormat("none", open=None, close=None, opened=False),
    )
}
NONE = BUILTIN["none"]


def lookup(name: str, *, model: str | None = None) -> ReasoningFormat:
    """The built-in format ``name``; ``FormatError`` naming the known ones otherwise."""
    found = BUILTIN.get(name)
    if found is None:
        where = f" for model {model!r}" if model else ""
        raise FormatError(f"unknown reasoning parser {name!r}{where}; known: {', '.join(BUILTIN)}")
    return found
