"""``make test``'s ``--dist loadgroup`` keeps each ``xdist_group`` on one worker (the real-vLLM
servers and the private PostgreSQL start once): tests/conftest.py's hook, checked in a pytest of
its own on two workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GROUPED = """
import os, pytest
pytestmark = [pytest.mark.xdist_group("solo")]
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    with open(os.environ["RAN_ON"], "a") as ran:
        ran.write(os.environ["PYTEST_XDIST_WORKER"] + " ")
"""
LOOSE = """
import pytest
@pytest.mark.parametrize("i", range(6))
def test_loose(i):
    pass
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "-o", "addopts=", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RAN_ON": str(tmp_path / "ran")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ran = (tmp_path / "ran").read_text().split()
    assert len(ran) == 6 and len(set(ran)) == 1, ran
