"""What the deploy tests need to check PromQL: the metric names an expression reads, Grafana's
variables replaced by sample values, ``promtool``, and the catalogue of names a live gateway and
simulator export.

Metric names (``metric_names``) come from a small tokenizer, not a parser: promtool already
says whether an expression is valid, so this only has to find the names in a valid one. An
identifier is a metric name unless it is

- a keyword (aggregation operators, ``and``/``or``/``unless``, ``bool``, ``offset``, ...),
- a function (an identifier followed by ``(``),
- a label: inside ``{...}`` matchers, or in the list after ``by``/``without``/``on``/
  ``ignoring``/``group_left``/``group_right``.

Strings, durations and numbers are tokens of their own, so label values, ``[5m]`` and ``1e6``
never look like names. ``{__name__="x"}`` names ``x``; ``{__name__=~"a_(b|c)_total"}`` names
``a_b_total`` and ``a_c_total`` (only literal text and one level of ``(x|y)`` groups are
understood; anything else is an error, so a name can never slip through unchecked).

A name ending in ``_bucket``, ``_sum`` or ``_count`` belongs to a family without that suffix
only when that family is a histogram (or summary): ``Catalogue.family`` strips it then and
only then, so ``thinkgate_requests_count`` would not pass for a histogram nobody exports.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.cli.keys import open_store
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import ledger_files, make_keys

# -- metric names in an expression ---------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+)(?![\w.])
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][\w:]*)
  | (?P<punct>=~|!~|!=|==|<=|>=|[-+*/%^(){}\[\],=<>@:])
    """,
    re.VERBOSE,
)
AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
     "topk", "quantile", "limitk", "limit_ratio"}
)  # fmt: skip
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = (
    AGGREGATIONS | LABEL_LISTS | {"and", "or", "unless", "atan2", "bool", "offset", "inf", "nan"}
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # string, duration, number, ident, punct
    text: str


def tokenize(expr: str) -> list[Token]:
    """The expression's tokens, whitespace and comments dropped; ``ValueError`` on a character
    PromQL has no token for (an unreplaced Grafana ``$variable``, say)."""
    tokens, position = [], 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"no PromQL token at {expr[position : position + 20]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            tokens.append(Token(kind, match.group()))
        position = match.end()
    return tokens


def metric_names(expr: str) -> set[str]:
    """Every metric name ``expr`` reads (see the module docstring for what counts)."""
    tokens, names, index = tokenize(expr), set[str](), 0
    while index < len(tokens):
        token = tokens[index]
        if token.text == "{":
            index = _matchers(tokens, index, names)
        elif token.text == "[":  # a range or subquery: durations, and ':' that may look like
            index = _closing(tokens, index, "]")  # the start of a name (`[1h:5m]`)
        elif token.kind == "ident" and token.text.lower() in LABEL_LISTS:
            index = _label_list(tokens, index)
        elif token.kind == "ident" and _is_metric(tokens, index):
            names.add(token.text)
        index += 1
    return names


def _is_metric(tokens: list[Token], index: int) -> bool:
    called = index + 1 < len(tokens) and tokens[index + 1].text == "("
    return not called and tokens[index].text.lower() not in KEYWORDS


def _label_list(tokens: list[Token], index: int) -> int:
    """Past ``by (a, b)`` and its kin: the index of the closing parenthesis (or of the keyword,
    for ``group_left`` without a list)."""
    if index + 1 < len(tokens) and tokens[index + 1].text == "(":
        return _closing(tokens, index + 1, ")")
    return index


def _matchers(tokens: list[Token], index: int, names: set[str]) -> int:
    """Past ``{...}``, adding the names its ``__name__`` matchers select; the index of ``}``."""
    end = _closing(tokens, index, "}")
    body = tokens[index + 1 : end]
    for label, op, value in zip(body, body[1:], body[2:], strict=False):
        if label.text == "__name__" and value.kind == "string":
            names.update(_name_matcher(op.text, _unquote(value.text)))
    return end


def _name_matcher(op: str, value: str) -> set[str]:
    if op == "=":
        return {value}
    if op == "=~":
        return _expand(value)
    raise ValueError(f"a negative __name__ matcher ({op}) selects names no test can list")


def _expand(regex: str) -> set[str]:
    """The names a regex of literal text and ``(x|y)`` groups matches; ``ValueError`` on more."""
    parts = re.split(r"\(([\w:|]+)\)", regex)
    literals, groups = parts[0::2], [group.split("|") for group in parts[1::2]]
    if any(re.fullmatch(r"[\w:]*", literal) is None for literal in literals):
        raise ValueError(f"__name__ regex {regex!r}: only literal text and (a|b) groups")
    names = set()
    for choice in itertools.product(*groups):
        pieces = [piece for pair in itertools.zip_longest(literals, choice) for piece in pair]
        names.add("".join(piece or "" for piece in pieces))
    return names


def _closing(tokens: list[Token], index: int, closer: str) -> int:
    for end in range(index + 1, len(tokens)):
        if tokens[end].text == closer:
            return end
    raise ValueError(f"unclosed {tokens[index].text!r}")


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    return body if literal[0] == "`" else body.encode().decode("unicode_escape")


# -- Grafana variables ---------------------------------------------------------------------

GRAFANA_SAMPLES: Mapping[str, str] = {
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
    "model": ".*",
    "tenant": ".*",
    "upstream": ".*",
    "job": ".*",
    "gpu_hourly_usd": "2.5",
    "gpus": "8",
}
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_]\w*)(?::\w+)?\}|([A-Za-z_]\w*))")


def substitute(expr: str, samples: Mapping[str, str] = GRAFANA_SAMPLES) -> str:
    """``expr`` with each ``$var`` / ``${var}`` / ``${var:format}`` replaced by a sample value;
    ``KeyError`` for a variable the table does not know (add it there, with a sample)."""

    def sample(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in samples:
            raise KeyError(f"Grafana variable ${name} has no sample value in GRAFANA_SAMPLES")
        return samples[name]

    return _VARIABLE.sub(sample, expr)


# -- promtool ------------------------------------------------------------------------------


def promtool() -> str:
    """The promtool binary; without one the test fails under ``CI`` and skips elsewhere."""
    binary = shutil.which("promtool")
    if binary is None:
        message = "promtool is not installed (apt-get install prometheus; .ci/run does it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def check_expressions(expressions: Mapping[str, str], directory: Path) -> None:
    """``promtool check rules`` on each expression wrapped as a recording rule named after its
    key (so an error names the panel); asserts that all parse."""
    rules = [{"record": f"check:{key}", "expr": expr} for key, expr in expressions.items()]
    path = directory / "expressions.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "expressions", "rules": rules}]}))
    result = run_promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- the catalogue of exported names -------------------------------------------------------

_SERIES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
           "summary": ("", "_sum", "_count"), "info": ("_info",)}  # fmt: skip


@dataclass(frozen=True)
class Catalogue:
    """Metric families as ``text_string_to_metric_families`` reports them (counters without
    ``_total``), by name, with their type. A family with no samples yet still counts."""

    types: Mapping[str, str]

    @classmethod
    def parse(cls, *expositions: str) -> Catalogue:
        types = {}
        for text in expositions:
            types |= {family.name: family.type for family in text_string_to_metric_families(text)}
        return cls(types)

    @cached_property
    def owners(self) -> Mapping[str, str]:
        """Series name → the family it belongs to (``x_total`` → counter ``x``, ...)."""
        return {
            name + suffix: name
            for name, kind in self.types.items()
            for suffix in _SERIES.get(kind, ("",))
        }

    def family(self, name: str) -> str:
        """``name`` less ``_bucket``/``_sum``/``_count`` when it is a histogram's or summary's
        series; otherwise ``name`` as it is."""
        for suffix in ("_bucket", "_sum", "_count"):
            base = name.removesuffix(suffix)
            if base != name and self.types.get(base) in ("histogram", "summary"):
                return base
        return name

    def missing(self, names: Iterable[str]) -> list[str]:
        """The names no exported family has (a histogram's series by the histogram's name)."""
        return sorted({self.family(name) for name in names if name not in self.owners})

    def unread(self, names: Iterable[str], prefix: str) -> list[str]:
        """Families under ``prefix`` none of whose series is in ``names`` (``_created``
        timestamps aside)."""
        read = {self.owners.get(name) for name in names}
        return sorted(
            family
            for family in self.types
            if family.startswith(prefix) and not family.endswith("_created") and family not in read
        )


async def scrape_catalogue(directory: Path) -> Catalogue:
    """The simulator and the gateway in-process on real sockets (SQLite and ledger files in
    ``directory``), a few completions (non-streamed, streamed, one refused on ``rpm=1``), then
    both ``/metrics``."""
    database = f"sqlite+aiosqlite:///{directory / 'gw.db'}"
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=1, itl_ms=1))) as sim:
        settings = Settings(upstreams=(f"{sim.url}/v1",), database_url=database,
                            models_cache_ttl_s=0, **ledger_files(directory))  # fmt: skip
        ensure_keys(settings.ledger, create=True)
        keys = await make_keys(settings)
        async with open_store(settings) as store:
            limited, _ = await store.create(tenant="acme", role="client", rpm=1)
        async with BackgroundServer(create_app(settings)) as gateway, httpx.AsyncClient(
            base_url=gateway.url, timeout=30
        ) as client:  # fmt: skip
            statuses = [await _chat(client, key, stream) for key, stream in _traffic(keys)]
            statuses += [await _chat(client, limited.secret, False) for _ in range(2)]
            assert statuses == [200, 200, 200, 200, 429], statuses
            expositions = [
                (await client.get("/metrics")).text,
                (await client.get(f"{sim.url}/metrics")).text,
            ]
    return Catalogue.parse(*expositions)


def _traffic(keys: Mapping[str, str]) -> Iterator[tuple[str, bool]]:
    yield keys["visible"], False
    yield keys["visible"], True
    yield keys["hidden"], True


async def _chat(client: httpx.AsyncClient, key: str, stream: bool) -> int:
    body = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 16, "stream": stream}  # fmt: skip
    response = await client.post("/v1/chat/completions", json=body,
                                 headers={"authorization": f"Bearer {key}"})  # fmt: skip
    return response.status_code
