"""Prices derived from the cluster's cost and throughput (``gateway.spend.derived``): a month's
traffic at those prices pays the month's cost (not less, and not more than the rounding), the
weights hold, the YAML is a ``PRICES_FILE`` whatever the model's name, and bad input is named."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gateway.spend.derived import HOURS_A_MONTH, ClusterCost, derive, render
from gateway.spend.prices import parse_prices

CLUSTER = ClusterCost("deepseek-r1", gpus=32, engines=4, output_tokens_per_s=2500,
                      monthly_cost=Decimal(57_000), input_per_output=20)  # fmt: skip


def test_a_months_traffic_at_the_prices_pays_the_months_cost() -> None:
    found = derive(CLUSTER)
    output = Decimal(2500 * 4 * HOURS_A_MONTH * 3600) * Decimal("0.6")
    assert (found.output_tokens, found.input_tokens) == (output, output * 20)
    earned = (found.input_tokens * found.input + found.output_tokens * found.output) / 10**6
    assert Decimal(57_000) <= earned < Decimal(57_000) * Decimal("1.00001")
    assert abs(found.output - found.input * 4) <= Decimal("0.000004")  # each rounded up apart
    assert abs(found.cached_input - found.input / 4) <= Decimal("0.000001")
    assert found.blended.quantize(Decimal("0.0001")) == Decimal("0.1721")


def test_a_gpu_hour_prices_the_whole_cluster() -> None:
    by_hour = ClusterCost("m", gpus=8, engines=1, output_tokens_per_s=1000,
                          gpu_hour=Decimal("2.5"))  # fmt: skip
    assert derive(by_hour).monthly_cost == Decimal("2.5") * 8 * 730
    more_busy = ClusterCost("m", gpus=8, engines=1, output_tokens_per_s=1000,
                            gpu_hour=Decimal("2.5"), busy=0.9)  # fmt: skip
    assert derive(more_busy).input < derive(by_hour).input  # more served, each token cheaper


@pytest.mark.parametrize("name", ["deepseek-r1", "deepseek-ai/DeepSeek-R1", "odd: name #1"])
def test_the_yaml_is_a_prices_file(name: str) -> None:
    cluster = ClusterCost(name, gpus=8, engines=1, output_tokens_per_s=1000,
                          gpu_hour=Decimal("2.44"))  # fmt: skip
    found = derive(cluster)
    prices = parse_prices(render(found).encode())
    price = prices.of(name)
    assert prices.currency == "USD" and price is not None
    assert (price.input, price.cached_input, price.output, price.reasoning) == (
        found.input, found.cached_input, found.output, found.output)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"monthly_cost": None}, "one of them"),
        ({"gpu_hour": Decimal(1)}, "one of them"),
        ({"monthly_cost": Decimal(0)}, "positive"),
        ({"output_tokens_per_s": 0}, "positive"),
        ({"busy": 0}, "busy"),
        ({"cached_share": 1.5}, "cached share"),
        ({"output_weight": 0.5}, "output weight"),
    ],
)
def test_bad_input_is_named(change: dict[str, object], message: str) -> None:
    fields = {"model": "m", "gpus": 8, "engines": 1, "output_tokens_per_s": 10.0,
              "monthly_cost": Decimal(100)} | change  # fmt: skip
    with pytest.raises(ValueError, match=message):
        ClusterCost(**fields)  # type: ignore[arg-type]
