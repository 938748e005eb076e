"""Reasoning effort that means something: a token budget per request, and how it is kept (sans-I/O).

``plan(rule, params, max_tokens, ceiling) -> Budget | None`` turns a request's
``reasoning_effort`` (chat; the Responses API's ``reasoning.effort`` arrives translated to it) or
an explicit ``thinking_token_budget`` (vLLM's own field) into the number of reasoning tokens
the request may spend, and says who keeps it.

Rules:

- The budget is the smallest of: the effort's entry in the model's ``effort_budgets`` (or the
  request's own ``thinking_token_budget``; with both, the smaller), the key's ceiling
  (``keys: {id: {max_reasoning_tokens}}``), and the room left once the answer's share of the
  output is kept: ``max_tokens - ceil(max_tokens × REASONING_ANSWER_SHARE)`` (``max_tokens``
  the request's, else ``DEFAULT_MAX_TOKENS``), so a budget never takes all of the output and
  "low" can no longer end in an empty answer (vllm-project/vllm#55382).
- No effort, no explicit budget and no ceiling: no budget (the model reasons as it likes within
  ``max_tokens``). ``reasoning_effort: "none"`` switches thinking off where the format has that
  switch (``gateway.relay.formats``); a request whose thinking is off has no budget.
- Who keeps it (``effort_enforcement`` per model; by default ``engine`` when the engine runs a
  reasoning parser, ``reasoning_source: upstream``, else ``gateway``):

  - ``engine``: the budget goes upstream as ``thinking_token_budget`` (vLLM ≥ 0.31 with
    ``--reasoning-parser``: its sampler forces the close marker when the budget is spent). The
    gateway still watches: should reasoning run past the budget + ``ENGINE_SLACK`` tokens (an
    engine that ignored the field), it ends it itself, as ``gateway`` does.
  - ``gateway``: no budget goes upstream (an engine without a reasoning configuration refuses
    ``thinking_token_budget``); the stream asks for a running token count instead
    (``continuous_usage_stats``; without one, deltas are counted). When the choice's reasoning
    reaches the budget, the gateway cuts the upstream stream and asks the engine to continue
    the same assistant turn after the reasoning so far and the close marker
    (``continuation_body``), so the answer follows; a whole response is streamed from the
    engine for this, and assembled. The usage then adds the cut turn's tokens to the
    continuation's (all of them reasoning), and ``prompt_tokens`` is the continuation's, which
    holds the reasoning again (the engine prefilled it again, mostly from its prefix cache).
  - ``none``: the budget is not kept (``thinking_token_budget`` from a client is removed).

Gateway enforcement works on one choice (``n`` = 1; the Responses and Messages APIs have no
``n``); with ``n`` > 1 only the engine keeps a budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import InvalidRequest
from gateway.relay.formats import ReasoningFormat

Enforcement = Literal["engine", "gateway", "none"]
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# "none" switches thinking off where the format can; where it cannot (R1), nothing is left
DEFAULT_BUDGETS: Mapping[str, int] = {
    "none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768,
    "max": 65536,
}  # fmt: skip
ENGINE_SLACK = 8  # tokens past an engine-kept budget before the gateway ends the reasoning
UPSTREAM_FIELD = "thinking_token_budget"
COUNTING = {"include_usage": True, "continuous_usage_stats": True}


@dataclass(frozen=True, slots=True)
class EffortRule:
    """One model's effort settings."""

    budgets: Mapping[str, int]
    enforcement: Enforcement
    answer_share: float = 0.25


DEFAULT_RULE = EffortRule(DEFAULT_BUDGETS, "gateway")


@dataclass(frozen=True, slots=True)
class Budget:
    tokens: int  # reasoning tokens the request may spend
    enforcement: Enforcement

    @property
    def cut_at(self) -> int | None:
        """Reasoning tokens at which the gateway itself ends the reasoning, if ever."""
        if self.enforcement == "gateway":
            return self.tokens
        if self.enforcement == "engine":
            return self.tokens + ENGINE_SLACK
        return None

    def upstream_fields(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat body to send upstream: ``thinking_token_budget`` set for the engine to keep,
        removed otherwise; a stream the gateway keeps the budget of asks for a running token
        count (vLLM's ``continuous_usage_stats``: it merges tokens into fewer deltas under load,
        so counting deltas would let the reasoning run past its budget)."""
        out = {k: v for k, v in body.items() if k != UPSTREAM_FIELD}
        if self.enforcement == "engine":
            out[UPSTREAM_FIELD] = self.tokens
        elif self.enforcement == "gateway" and out.get("stream"):
            out["stream_options"] = {**(out.get("stream_options") or {}), **COUNTING}
        return out


def plan(
    rule: EffortRule, params: Mapping[str, Any], max_tokens: int, ceiling: int | None,
    *, thinking: bool,
) -> Budget | None:  # fmt: skip
    """The budget of a request with these chat ``params`` and output limit, or ``None``."""
    effort = params.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest(
            f"Invalid value for 'reasoning_effort': expected one of {', '.join(EFFORTS)}.",
            param="reasoning_effort",
        )
    asked = params.get(UPSTREAM_FIELD)
    if asked is not None and (type(asked) is not int or asked < 0):
        raise InvalidRequest(
            f"Invalid value for '{UPSTREAM_FIELD}': expected a non-negative integer.",
            param=UPSTREAM_FIELD,
        )
    if not thinking:
        return None
    limits = [v for v in (rule.budgets.get(effort or ""), asked, ceiling) if v is not None]
    if not limits:
        return None
    room = max_tokens - math.ceil(max_tokens * rule.answer_share)
    return Budget(max(0, min(*limits, room)), rule.enforcement)


def continuation_prefix(fmt: ReasoningFormat, reasoning: str) -> str:
    """The assistant turn so far, as the model wrote it, with its reasoning closed: the text a
    continuation request asks the engine to go on from (``continue_final_message``). For a
    format whose template opens the block, the generation prompt is not rendered in a
    continuation, so the open marker is written here; the answer starts after the close
    marker and a blank line, as the families' templates write it."""
    opening = f"{fmt.open}\n" if fmt.opened and fmt.open else ""
    body = reasoning if reasoning.endswith("\n") or not reasoning else reasoning + "\n"
    return f"{opening}{body}{fmt.close}\n\n"


def continuation_body(
    body: dict[str, Any], prefix: str, spent: int, max_tokens: int
) -> dict[str, Any]:
    """The chat body that continues a turn cut after ``spent`` tokens: the same request, the
    turn so far as the last assistant message, no new generation prompt, the output limit
    reduced by what was spent (one token at least) and no budget left to keep."""
    messages = [*body.get("messages", []), {"role": "assistant", "content": prefix}]
    out = {k: v for k, v in body.items() if k not in (UPSTREAM_FIELD, "max_completion_tokens")}
    if out.get("stream"):  # nothing left to count: the usage at the end is enough
        out["stream_options"] = {"include_usage": True}
    out.update(
        messages=messages,
        continue_final_message=True,
        add_generation_prompt=False,
        max_tokens=max(1, max_tokens - spent),
    )
    return out
