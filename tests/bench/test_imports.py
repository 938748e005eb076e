"""``bench.imports``: a real serving process (SQLite, the production configuration) with the
import hook, two streamed completions, and its table."""

from __future__ import annotations

from pathlib import Path

from bench.imports import measure, render
from bench.procs import Workdir


def test_the_serving_process_is_charged_per_package(tmp_path: Path) -> None:
    holding = measure(Workdir(tmp_path), pg=False, requests=2)
    charged = {c.package: c for c in holding.packages}
    # what every configuration imports, each some MB, and where it came from
    for package in ("sqlalchemy", "cryptography", "fastapi", "gateway"):
        assert charged[package].mb > 1, charged[package]
    assert charged["cryptography"].first_from.startswith("audit.")
    assert "redis" not in charged  # no REDIS_URL: not imported (tests/test_imports.py)
    assert [c.mb for c in holding.packages] == sorted((c.mb for c in holding.packages),
                                                      reverse=True)  # fmt: skip
    # the charges are the imports' share of the process, not more
    assert 40 < sum(c.mb for c in holding.packages) < holding.rss_mb
    table = render(holding, top=5)
    assert table.count("\n| ") == 6 + 1  # header, 5 packages, the others
    assert f"RSS **{holding.rss_mb:.1f} MB**" in table
