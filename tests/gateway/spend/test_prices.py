"""Prices (``gateway.spend.prices``): the file's defaults and refusals, and costs exact to the
nano-unit: cached prompt tokens at ``cached_input``, reasoning at ``reasoning``, the rest of
the output at ``output``."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from audit.record import Usage
from gateway.spend.prices import parse_prices

FILE = b"""
currency: usd
models:
  deepseek-r1: {input: 0.55, cached_input: 0.14, output: 2.19, reasoning: 3.00}
  plain: {input: 1, output: 2}
  embed: {input: 0.02, per_request: 0.0001}
"""


def test_defaults_and_the_digest() -> None:
    prices = parse_prices(FILE)
    assert prices.currency == "USD" and len(prices.digest) == 16
    plain = prices.of("plain")
    assert plain is not None
    assert (plain.cached_input, plain.reasoning, plain.per_request) == (1, 2, 0)
    assert prices.of("other") is None and prices.cost("other", Usage(10)) is None
    assert parse_prices(FILE + b"\n").digest != prices.digest


def test_each_kind_of_token_at_its_price_exactly() -> None:
    prices = parse_prices(FILE)
    usage = Usage(prompt_tokens=1_000, completion_tokens=700, reasoning_tokens=500,
                  total_tokens=1_700, cached_tokens=400)  # fmt: skip
    # 600 × 0.55 + 400 × 0.14 + 200 × 2.19 + 500 × 3.00, per million
    assert prices.cost("deepseek-r1", usage) == Decimal("0.002324000")
    assert prices.cost("embed", Usage(prompt_tokens=3)) == Decimal("0.000100060")
    assert prices.cost("plain", None) == Decimal(0)  # nothing produced, nothing priced
    tiny = sum((prices.cost("plain", Usage(1, 0)) or Decimal(0)) for _ in range(100_000))
    assert tiny == Decimal("0.1")  # 100,000 one-token requests: exactly, no drift


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (b"[]", "a mapping"),
        (b"currency: dollars\nmodels: {m: {input: 1}}", "currency"),
        (b"currency: USD\nmodels: {}", "models"),
        (b"currency: USD\nmodels: {m: {input: -1}}", "models.m.input"),
        (b"currency: USD\nmodels: {m: {input: yes}}", "models.m.input"),
        (b"currency: USD\nmodels: {m: {output: 1}}", "models.m"),
        (b"currency: USD\nmodels: {m: {input: 1, sale: 2}}", "models.m"),
        (b"currency: USD\nmodels: [\n", "PRICES_FILE: not valid YAML (line 3, column 1)"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_the_field(raw: bytes, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        parse_prices(raw)
