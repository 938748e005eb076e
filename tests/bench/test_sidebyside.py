"""``bench.sidebyside``'s arithmetic (functional, not timed): the ratio per round is this tree's
cost over the other's, and the summary gives its median and range, not the costs' ratio."""

from __future__ import annotations

import pytest

from bench.realistic import CELLS
from bench.sidebyside import Round, main, summary


def test_the_summary_is_the_median_and_range_of_the_ratios_per_round() -> None:
    cell = next(c for c in CELLS if c.name == "c=32, 3-chunk answers")
    # the machine drifted by half between rounds: the costs move, the ratios do not
    rounds = [Round(500.0, 520.0, -0.1, 2.0), Round(760.0, 780.0, 0.3, -1.0),
              Round(490.0, 500.0, 0.05, 0.5)]  # fmt: skip
    line = summary(cell, rounds)
    assert line.startswith("c=32, 3-chunk answers: CPU µs per request, this tree 500.0, before")
    assert "before 520.0" in line
    assert "ratio 0.974 (0.962–0.980); TTFT p50 +0.05 ms, p99 +0.50 ms; 3 rounds" in line


def test_an_unknown_cell_is_refused_before_anything_starts() -> None:
    with pytest.raises(SystemExit, match="unknown cell"):
        main(["--before", ".", "--cells", "no such cell"])
