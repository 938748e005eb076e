"""deploy/grafana/thinkgate.json: a Grafana dashboard whose every query is valid PromQL (as
promtool parses it) over metrics a live gateway and simulator really export, plus the metric
name extraction those checks rest on."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.promql import (
    Catalogue,
    check_expressions,
    metric_names,
    scrape_catalogue,
    substitute,
    tokenize,
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "thinkgate.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
_LABEL_VALUES = re.compile(r"label_values\((?:(.+),\s*)?(\w+)\)")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included; rows themselves are not panels."""
    flat = []
    for panel in dashboard()["panels"]:
        flat.extend([panel, *panel.get("panels", [])])
    return [panel for panel in flat if panel["type"] != "row"]


def expressions() -> dict[str, str]:
    """``panel_<id>_<refId>`` → the target's expression, Grafana variables as written."""
    return {
        f"panel_{panel['id']}_{target['refId']}": target["expr"]
        for panel in panels()
        for target in panel["targets"]
    }


def variables() -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in dashboard()["templating"]["list"]}


def variable_selectors() -> dict[str, str]:
    """The series selectors of ``label_values(selector, label)`` query variables."""
    selectors = {}
    for name, variable in variables().items():
        if variable["type"] == "query":
            match = _LABEL_VALUES.fullmatch(variable["definition"])
            assert match is not None and match.group(1), variable["definition"]
            selectors[f"variable_{name}"] = match.group(1)
    return selectors


# -- the JSON ------------------------------------------------------------------------------


def test_the_dashboard_is_grafana_json_with_its_variables() -> None:
    board, named = dashboard(), variables()
    assert board["schemaVersion"] >= 39 and board["uid"] == "thinkgate"
    assert named["DS_PROMETHEUS"]["type"] == "datasource"
    assert named["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("model", "tenant"):
        assert named[name]["type"] == "query" and named[name]["includeAll"]
    assert named["gpu_hourly_usd"]["type"] in ("textbox", "constant")
    assert named["gpu_hourly_usd"]["query"] == "2.5"
    assert named["gpus"]["type"] in ("textbox", "constant")
    assert named["gpus"]["query"] == "8"


def test_panel_ids_are_unique() -> None:
    ids = [panel["id"] for panel in dashboard()["panels"]]
    ids += [inner["id"] for panel in dashboard()["panels"] for inner in panel.get("panels", [])]
    assert [i for i, n in Counter(ids).items() if n > 1] == []


@pytest.mark.parametrize("panel", panels(), ids=lambda panel: panel["title"])
def test_every_panel_queries_prometheus(panel: dict[str, Any]) -> None:
    assert panel["datasource"] == DATASOURCE
    assert panel["targets"], "a panel without targets"
    refs = [target["refId"] for target in panel["targets"]]
    assert len(set(refs)) == len(refs)
    for target in panel["targets"]:
        assert target["expr"].strip() and target["datasource"] == DATASOURCE


def test_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                 for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
        assert not cells & taken, panel["title"]
        taken |= cells


def test_the_cost_panels_follow_the_formula() -> None:
    """$/1M tokens = gpu_hourly_usd × gpus / 3600 / (tokens per second) × 1e6."""
    costs = [
        panel for panel in panels() if panel["fieldConfig"]["defaults"].get("unit") == "currencyUSD"
    ]
    assert costs
    for panel in costs:
        for target in panel["targets"]:
            expr = " ".join(target["expr"].split())
            assert expr.startswith("$gpu_hourly_usd * $gpus / 3600 / (sum(rate(")
            assert expr.endswith("> 0) * 1e6")
            assert metric_names(substitute(expr)) <= {
                "thinkgate_prompt_tokens_total",
                "thinkgate_reasoning_tokens_total",
                "thinkgate_content_tokens_total",
            }


# -- PromQL --------------------------------------------------------------------------------


def test_every_expression_is_valid_promql(tmp_path: Path) -> None:
    """Each panel expression and variable selector, Grafana variables replaced by sample
    values, as a recording rule in a rules file that ``promtool check rules`` accepts."""
    wrapped = {
        key: substitute(expr) for key, expr in {**expressions(), **variable_selectors()}.items()
    }
    check_expressions(wrapped, tmp_path)


async def test_every_metric_on_the_dashboard_is_exported(tmp_path: Path) -> None:
    """Names from every panel and variable exist in a real scrape of the gateway and the
    simulator (a family announced with ``# TYPE`` but no samples yet counts)."""
    exported = await scrape_catalogue(tmp_path)
    queries = {**expressions(), **variable_selectors()}
    names = set().union(*(metric_names(substitute(expr)) for expr in queries.values()))
    missing = exported.missing(names)
    assert missing == [], f"the dashboard reads metrics nobody exports: {missing}"
    unused = exported.unread(names, prefix="thinkgate_")
    assert unused == [], f"the gateway exports metrics no panel shows: {unused}"


# -- metric names in expressions -------------------------------------------------------------

NAMES = [
    ("up", {"up"}),
    ('rate(http_requests_total{job="api", path=~"/v1/.*"}[5m])', {"http_requests_total"}),
    (
        "histogram_quantile(0.99, sum by (le, model) (rate(ttft_bucket[$__rate_interval])))",
        {"ttft_bucket"},
    ),
    ("sum without (instance, job) (a) / on (model) group_left (tenant) b", {"a", "b"}),
    ("sum(rate(x[5m])) by (status) > bool 0.5", {"x"}),
    ('count_values("version", build_info) or vector(0)', {"build_info"}),
    ("time() - max(last_seen_timestamp_seconds offset 1h)", {"last_seen_timestamp_seconds"}),
    ('label_replace(up, "host", "$1", "instance", "(.*):.*")', {"up"}),
    (
        "vllm:kv_cache_usage_perc > 0.85 and on() vllm:num_requests_waiting > 5",
        {"vllm:kv_cache_usage_perc", "vllm:num_requests_waiting"},
    ),
    ('{__name__="lone_metric", job="x"}', {"lone_metric"}),
    (
        'rate({__name__=~"t_(prompt|content)_tokens_total"}[1m])',
        {"t_prompt_tokens_total", "t_content_tokens_total"},
    ),
    ("max_over_time(deriv(g[10m])[1h:5m]) * 1e6 + 0x1F - Inf", {"g"}),
    ("sum by (by, on) (rate(sum_total[1m] @ end()))", {"sum_total"}),
    ('# a comment naming not_a_metric\nlabel_join(real, "dst", ",", "not_a_metric")', {"real"}),
]


@pytest.mark.parametrize(("expr", "names"), NAMES)
def test_metric_names_are_found_and_nothing_else(expr: str, names: set[str]) -> None:
    assert metric_names(substitute(expr)) == names


def test_the_hand_written_cases_are_valid_promql(tmp_path: Path) -> None:
    check_expressions(
        {f"case_{i}": substitute(expr) for i, (expr, _) in enumerate(NAMES)}, tmp_path
    )


@pytest.mark.parametrize(
    "expr", ['{__name__!="x"}', '{__name__=~"x.*"}', "rate(x[$__unknown])", 'x{job="a"']
)
def test_what_the_extraction_cannot_vouch_for_is_an_error(expr: str) -> None:
    with pytest.raises((ValueError, KeyError)):
        metric_names(substitute(expr))


def test_grafana_variables_take_sample_values() -> None:
    expr = 'rate(x{model=~"$model", tenant=~"${tenant:regex}"}[$__rate_interval]) * $gpus'
    assert substitute(expr) == 'rate(x{model=~".*", tenant=~".*"}[5m]) * 8'
    assert [t.kind for t in tokenize("x[5m] * 1e6")] == [
        "ident", "punct", "duration", "punct", "punct", "number",
    ]  # fmt: skip


def test_histogram_suffixes_are_stripped_only_for_histograms() -> None:
    catalogue = Catalogue({"lat_seconds": "histogram", "jobs": "counter", "depth_count": "gauge"})
    assert catalogue.family("lat_seconds_bucket") == "lat_seconds"
    assert catalogue.family("lat_seconds_count") == "lat_seconds"
    assert catalogue.family("depth_count") == "depth_count"
    assert catalogue.missing(["jobs_total", "jobs_count", "depth_count", "lat_seconds_sum"]) == [
        "jobs_count"
    ]
    assert catalogue.unread(["lat_seconds_bucket", "jobs"], prefix="") == ["depth_count", "jobs"]
