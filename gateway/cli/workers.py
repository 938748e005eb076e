"""How many worker processes ``thinkgate serve`` runs: ``--workers N`` or ``auto`` (the default).

``auto`` is one worker per CPU this process may use: the CPUs it is allowed to run on (its
affinity, as ``taskset`` or a cpuset sets it), cut to the whole CPUs of its cgroup's quota (a
Kubernetes pod's ``limits.cpu``: ``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` in v1), at
least one. Two cases run one worker whatever the CPUs, and say why:

- ``--demo``: the simulator lives in the serving process;
- no ``REDIS_URL``: rate limits, token budgets and KV admission are then kept in each
  process's memory, so N workers would each allow the whole limit. With Redis they share it,
  as replicas do.

An explicit ``--workers N`` is obeyed, with a warning in the second case.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path

AUTO = "auto"
CGROUP = Path("/sys/fs/cgroup")


@dataclass(frozen=True, slots=True)
class Workers:
    count: int
    reason: str  # one line for the operator: how the count was chosen
    warning: str = ""  # an explicit count that will not behave as asked


def parse(value: str) -> str | int:
    """``--workers``' argument: ``auto`` or a positive count (argparse's type)."""
    if value == AUTO:
        return AUTO
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"--workers takes a positive count or 'auto', not {value!r}"
        )
    return count


def resolve(asked: str | int, *, demo: bool, shared_limits: bool, cpus: int) -> Workers:
    """The count to run. ``shared_limits``: a ``REDIS_URL`` is set; ``cpus``: ``usable_cpus()``."""
    per_process = "without REDIS_URL, rate limits and budgets are kept per process"
    if asked != AUTO:
        assert isinstance(asked, int)
        warning = ""
        if asked > 1 and not shared_limits:
            warning = f"--workers {asked}: {per_process}, so each worker allows the whole limit"
        return Workers(asked, f"{asked} worker{'s' * (asked > 1)} (--workers {asked})", warning)
    if demo:
        return Workers(1, "1 worker (auto: the demo's simulator lives in it)")
    if not shared_limits:
        return Workers(1, f"1 worker (auto: {per_process})")
    plural = "s" * (cpus > 1)
    return Workers(cpus, f"{cpus} worker{plural} (auto: {cpus} usable CPU{plural})")


def usable_cpus(cgroup: Path = CGROUP) -> int:
    """The CPUs this process may run on, cut to its cgroup's CPU quota; at least one."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = cgroup_quota(cgroup)
    count = allowed or 1
    return count if quota is None else min(count, max(1, math.floor(quota)))


def cgroup_quota(cgroup: Path = CGROUP) -> float | None:
    """The CPUs' worth of time the cgroup allows (quota / period), or None without a quota."""
    v2 = _read(cgroup / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return _ratio(quota, period)
    v1_quota = _read(cgroup / "cpu" / "cpu.cfs_quota_us")
    v1_period = _read(cgroup / "cpu" / "cpu.cfs_period_us")
    if v1_quota is None or v1_period is None:
        return None
    return _ratio(v1_quota, v1_period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max": no quota
        return None
    return q / p if q > 0 and p > 0 else None  # v1 says -1 for none


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
