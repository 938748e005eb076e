"""Prices per model, and what an exchange cost (sans-I/O but for reading the file).

``PRICES_FILE`` (YAML), per million tokens, in one currency::

    currency: USD
    models:
      deepseek-r1: {input: 0.55, cached_input: 0.14, output: 2.19, reasoning: 2.19}
      qwen3-embed: {input: 0.02, per_request: 0.0001}

``reasoning`` defaults to ``output`` and ``cached_input`` to ``input``; ``per_request`` to 0.
Amounts are decimals, never floats: a cost is exact to the nano-unit (``QUANTUM``), so sums
over a ledger are exact to the cent and beyond.

``cost(price, usage)``: the prompt's uncached tokens at ``input``, its cached tokens (the
engine's ``cached_tokens``) at ``cached_input``, the answer's tokens at ``output`` and the
reasoning tokens at ``reasoning`` (``completion_tokens`` counts both, as vLLM and OpenAI
report them), plus ``per_request``. What the engine produced is priced whatever the outcome:
a stream the client left, a guardrail block or an upstream error after tokens cost what they
used (the usage the record holds: the engine's, or counted by the gateway).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from audit.record import Usage

QUANTUM = Decimal("0.000000001")
MILLION = Decimal(1_000_000)
_FIELDS = ("input", "cached_input", "output", "reasoning", "per_request")


@dataclass(frozen=True, slots=True)
class Price:
    """One model's prices: per million tokens, and per request."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    reasoning: Decimal
    per_request: Decimal = Decimal(0)


@dataclass(frozen=True, slots=True)
class Prices:
    currency: str
    models: dict[str, Price]
    digest: str  # the file's SHA-256 (hex, first 16): which prices a record's cost used

    def of(self, model: str) -> Price | None:
        return self.models.get(model)

    def cost(self, model: str, usage: Usage | None) -> Decimal | None:
        """What the exchange cost, ``None`` for a model without a price."""
        price = self.of(model)
        if price is None:
            return None
        return cost(price, usage or Usage())


def cost(price: Price, usage: Usage) -> Decimal:
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    reasoning = min(usage.reasoning_tokens, usage.completion_tokens)
    per_million = (
        (usage.prompt_tokens - cached) * price.input
        + cached * price.cached_input
        + (usage.completion_tokens - reasoning) * price.output
        + reasoning * price.reasoning
    )
    return (per_million / MILLION + price.per_request).quantize(QUANTUM)


def _amount(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where}: a price must be a number")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{where}: {value!r} is not a number") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{where}: a price must be 0 or more")
    return amount


def parse_prices(raw: bytes) -> Prices:
    """The prices of a ``PRICES_FILE``'s bytes; ``ValueError`` naming what is wrong."""
    import yaml  # only with a prices file

    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ValueError(f"PRICES_FILE: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise ValueError("PRICES_FILE: a mapping with 'currency' and 'models'")
    currency = data.get("currency")
    if not isinstance(currency, str) or not currency.isalpha() or len(currency) != 3:
        raise ValueError("PRICES_FILE: 'currency' must be a three-letter code (USD, EUR, ...)")
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ValueError("PRICES_FILE: 'models' must map model names to their prices")
    found: dict[str, Price] = {}
    for name, fields in models.items():
        where = f"PRICES_FILE: models.{name}"
        if not isinstance(fields, dict) or not set(fields) <= set(_FIELDS):
            raise ValueError(f"{where}: only {', '.join(_FIELDS)}")
        if "input" not in fields and "per_request" not in fields:
            raise ValueError(f"{where}: 'input' (or 'per_request') is required")
        amounts = {k: _amount(v, f"{where}.{k}") for k, v in fields.items()}
        given = amounts.get("input", Decimal(0))
        output = amounts.get("output", Decimal(0))
        found[str(name)] = Price(
            input=given,
            cached_input=amounts.get("cached_input", given),
            output=output,
            reasoning=amounts.get("reasoning", output),
            per_request=amounts.get("per_request", Decimal(0)),
        )
    return Prices(currency.upper(), found, hashlib.sha256(raw).hexdigest()[:16])


def load_prices(path: Path) -> Prices:
    return parse_prices(path.read_bytes())
