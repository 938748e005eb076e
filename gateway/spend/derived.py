"""Prices derived from what the cluster costs and what it serves (sans-I/O):
``thinkgate capacity --prices`` writes them as a ``PRICES_FILE``.

``derive(cluster) -> Derived`` and ``render(derived) -> str`` (YAML, the derivation in comments).
The rule, per month (730 hours, as clouds bill):

- **cost**: ``monthly_cost``, or ``gpu_hour`` × GPUs × 730;
- **served**: output tokens = ``output_tokens_per_s`` (one engine, measured: ``vllm bench
  serve`` or ``thinkgate bench`` at the concurrency the KV capacity allows) × engines × 730 h ×
  ``busy`` (the share of the month the cluster works); input tokens = output tokens ×
  ``input_per_output`` (agents resend long contexts: 20 or more);
- **prices**: an output token costs ``output_weight`` input tokens (decode is the scarce
  resource; commercial APIs price it 4 to 5 times input), so cost = input tokens × p + output
  tokens × weight × p; ``cached_input`` = p × ``cached_share`` (a prefix the engine holds skips
  its prefill); ``reasoning`` = output. Per million tokens, rounded up to six decimals, so the
  prices recover at least the cost and stay in the admission's integer arithmetic
  (``gateway.spend.budgets``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

HOURS_A_MONTH = 730
SIX = Decimal("0.000001")


@dataclass(frozen=True, slots=True)
class ClusterCost:
    model: str  # the served model's name: the key under ``models``
    gpus: int
    engines: int
    output_tokens_per_s: float  # one engine
    gpu_hour: Decimal | None = None
    monthly_cost: Decimal | None = None
    busy: float = 0.6
    input_per_output: float = 4.0
    output_weight: float = 4.0
    cached_share: float = 0.25
    currency: str = "USD"

    def __post_init__(self) -> None:
        if (self.gpu_hour is None) == (self.monthly_cost is None):
            raise ValueError("give the GPU-hour price or the monthly cost, one of them")
        if self.gpus < 1 or self.engines < 1 or self.output_tokens_per_s <= 0:
            raise ValueError("GPUs, engines and output tokens per second must be positive")
        if not 0 < self.busy <= 1 or not 0 <= self.cached_share <= 1:
            raise ValueError("busy is in (0, 1] and the cached share in [0, 1]")
        if self.input_per_output < 0 or self.output_weight < 1:
            raise ValueError("input per output is >= 0 and the output weight >= 1")
        if (self.gpu_hour or self.monthly_cost or Decimal(0)) <= 0:
            raise ValueError("the cost must be positive")


@dataclass(frozen=True, slots=True)
class Derived:
    cluster: ClusterCost
    monthly_cost: Decimal
    output_tokens: Decimal  # a month's
    input_tokens: Decimal
    input: Decimal  # per million tokens
    cached_input: Decimal
    output: Decimal

    @property
    def blended(self) -> Decimal:
        """What a million tokens cost, input and output alike."""
        return self.monthly_cost * 1_000_000 / (self.input_tokens + self.output_tokens)


def derive(cluster: ClusterCost) -> Derived:
    cost = cluster.monthly_cost
    if cost is None:
        assert cluster.gpu_hour is not None
        cost = cluster.gpu_hour * cluster.gpus * HOURS_A_MONTH
    seconds = Decimal(HOURS_A_MONTH * 3600) * Decimal(str(cluster.busy))
    output = Decimal(str(cluster.output_tokens_per_s)) * cluster.engines * seconds
    input_ = output * Decimal(str(cluster.input_per_output))
    weight = Decimal(str(cluster.output_weight))
    per_input = cost * 1_000_000 / (input_ + output * weight)
    return Derived(cluster, cost, output, input_, _up(per_input),
                   _up(per_input * Decimal(str(cluster.cached_share))),
                   _up(per_input * weight))  # fmt: skip


def _up(amount: Decimal) -> Decimal:
    return amount.quantize(SIX, rounding=ROUND_CEILING).normalize()


def render(found: Derived) -> str:
    """The ``PRICES_FILE``, with how it was derived."""
    c, cur = found.cluster, found.cluster.currency
    how = (f"{c.gpu_hour} {cur} per GPU-hour x {c.gpus} GPUs x {HOURS_A_MONTH} h"
           if c.gpu_hour is not None else "as given")  # fmt: skip
    return "\n".join([
        f"# thinkgate capacity --prices: {c.model} on {c.gpus} GPUs, {c.engines} engine(s)",
        f"# cost: {found.monthly_cost:,.2f} {cur} a month ({how})",
        f"# served a month: {c.output_tokens_per_s:g} output tokens/s per engine x {c.engines}"
        f" x {c.busy:.0%} busy = {_tokens(found.output_tokens)} output tokens;",
        f"#   x {c.input_per_output:g} input tokens each = {_tokens(found.input_tokens)} input",
        f"# an output token priced as {c.output_weight:g} input tokens; a cached one at "
        f"{c.cached_share:g} of input",
        f"# blended: {found.blended:.4f} {cur} per million tokens",
        f"currency: {cur}",
        "models:",
        f"  {json.dumps(c.model)}: {{input: {found.input}, cached_input: {found.cached_input}, "
        f"output: {found.output}, reasoning: {found.output}}}",
        "",
    ])  # fmt: skip


def _tokens(n: Decimal) -> str:
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:,.0f}"
