"""``--workers``: a count or ``auto``, and how ``auto`` reads the CPUs a process may use."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from gateway.cli import workers
from gateway.cli.main import _parser


def test_the_argument_is_auto_by_default_or_a_positive_count() -> None:
    parser = _parser()
    assert parser.parse_args(["serve"]).workers == workers.AUTO
    assert parser.parse_args(["serve", "--workers", "3"]).workers == 3
    assert parser.parse_args(["serve", "--workers", "auto"]).workers == workers.AUTO
    for wrong in ("0", "-2", "two", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="positive count or 'auto'"):
            workers.parse(wrong)


def test_auto_is_one_per_cpu_with_shared_limits_and_one_otherwise() -> None:
    shared = workers.resolve(workers.AUTO, demo=False, shared_limits=True, cpus=4)
    assert (shared.count, shared.reason, shared.warning) == (
        4, "4 workers (auto: 4 usable CPUs)", "")  # fmt: skip
    alone = workers.resolve(workers.AUTO, demo=False, shared_limits=False, cpus=4)
    assert alone.count == 1 and "without REDIS_URL" in alone.reason and not alone.warning
    demo = workers.resolve(workers.AUTO, demo=True, shared_limits=True, cpus=4)
    assert demo.count == 1 and "demo" in demo.reason
    one = workers.resolve(workers.AUTO, demo=False, shared_limits=True, cpus=1)
    assert one.reason == "1 worker (auto: 1 usable CPU)"


def test_an_explicit_count_is_obeyed_and_warned_about_without_shared_limits() -> None:
    told = workers.resolve(3, demo=False, shared_limits=False, cpus=1)
    assert told.count == 3 and "each worker allows the whole limit" in told.warning
    assert workers.resolve(3, demo=False, shared_limits=True, cpus=1).warning == ""
    assert workers.resolve(1, demo=False, shared_limits=False, cpus=8).warning == ""


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "400000 100000"}, 4.0),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "250000", "cpu/cpu.cfs_period_us": "100000"}, 2.5),
        ({}, None),
    ],
    ids=["v2-none", "v2-1.5", "v2-4", "v1-none", "v1-2.5", "no-cgroup"],
)
def test_the_cgroup_quota_is_read_from_v2_or_v1(
    tmp_path: Path, files: dict[str, str], quota: float | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert workers.cgroup_quota(tmp_path) == quota


def test_usable_cpus_is_the_affinity_cut_to_whole_cpus_of_the_quota(tmp_path: Path) -> None:
    allowed = len(os.sched_getaffinity(0))
    assert workers.usable_cpus(tmp_path) == allowed  # no quota
    (tmp_path / "cpu.max").write_text("50000 100000")  # half a CPU: still one worker
    assert workers.usable_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{(allowed + 3) * 100000} 100000")  # more than allowed
    assert workers.usable_cpus(tmp_path) == allowed


def test_usable_cpus_follows_the_affinity_taskset_sets() -> None:
    before = os.sched_getaffinity(0)
    one = {min(before)}
    os.sched_setaffinity(0, one)
    try:
        assert workers.usable_cpus(Path("/nonexistent")) == 1
    finally:
        os.sched_setaffinity(0, before)
