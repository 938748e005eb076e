"""``bench.ledger`` runs end to end on both databases (functional, tiny sizes, not timed)."""

from __future__ import annotations

from pathlib import Path

from bench.ledger import bench_append, bench_large, bench_strict


async def test_the_ledger_benchmark_runs(database_url: str, tmp_path: Path) -> None:
    lines = await bench_large(database_url, tmp_path, 50)  # first: on the empty database
    assert lines[0].startswith("fill 50 records")
    assert "(1,000 random indexes)" in lines[1]
    assert lines[2].startswith("full verify of 50 records")
    assert "records/s (300 records" in await bench_append(database_url, tmp_path, 300)
    assert "strict adds" in await bench_strict(database_url, tmp_path, 0.001, workers=4)
