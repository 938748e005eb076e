"""``bench.ledger`` runs end to end on both databases and renders its RESULTS.md section
(functional, tiny sizes, not timed)."""

from __future__ import annotations

from pathlib import Path

from bench.ledger import bench_append, bench_large, bench_strict, render
from bench.sections import carry_sections, write_section


async def test_the_ledger_benchmark_runs(database_url: str, tmp_path: Path) -> None:
    large = await bench_large(database_url, tmp_path, 50)  # first: on the empty database
    assert large[0].text.startswith("fill 50 records")
    assert large[1].ok is None  # below 1,000,000 records the targets are not judged
    assert large[2].text.startswith("full verify of 50 records")
    append = await bench_append(database_url, tmp_path, 300)
    assert "records/s (300 records" in append.text and append.ok is not None
    strict = await bench_strict(database_url, tmp_path, 0.001, workers=4)
    assert strict.target is not None and "strict adds" in strict.text
    section = render([*large, append, strict], ["test"])
    assert section.count("| **") == 2  # the two judged targets, each with its verdict


def test_sections_are_replaced_and_carried_over(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# relay\n\nold tables\n")
    write_section(results, "ledger", "## ledger v1")
    write_section(results, "ledger", "## ledger v2")
    text = results.read_text()
    assert "v1" not in text and text.count("## ledger v2") == 1 and "old tables" in text
    rewritten = carry_sections(text, "# relay\n\nnew tables\n")  # what compare.py writes
    assert "new tables" in rewritten and "## ledger v2" in rewritten and "old" not in rewritten


def test_the_gateway_cost_benchmark_runs(tmp_path: Path) -> None:
    from bench.ledger_cost import run, summary
    from bench.procs import Workdir

    costs = run(Workdir(tmp_path), duration_s=0.3, modes=("none", "strict"), cells=((2, 1),),
                rounds=1)  # fmt: skip
    assert [c.mode for c in costs] == ["none", "strict"]
    assert all(c.requests > 0 and c.us_per_request > 0 for c in costs)
    (line,) = summary(costs)
    assert "the ledger adds strict +" in line
