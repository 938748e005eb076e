"""Loaded by ``python -m bench.imports`` into the serving process (this folder first on
``PYTHONPATH``): charges each module's import to its top-level package, as the resident
memory the module's execution added net of the modules it imported in turn, and writes the
sums as JSON to ``THINKGATE_IMPORT_RSS_OUT`` on ``SIGUSR1``. Not a module of thinkgate's: it
only measures one.

RSS moves by whole pages and pymalloc's arenas (1 MB at a time), so one module's figure is
rough; a package's sum over its modules is what the table quotes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
from collections import Counter
from types import FrameType, ModuleType
from typing import Any

_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20
_NET: Counter[str] = Counter()  # MB by top-level package, net of what its modules imported
_FIRST: dict[str, str] = {}  # package -> the module whose import first brought it in
_STACK: list[list[Any]] = []  # [module name, MB its nested imports added]


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_MB


def _caller() -> str:
    """The module whose function imported, for an import made at run time (not by another
    module's import)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not name.startswith(("importlib", "_frozen_importlib", "sitecustomize")):
            return f"{name} (at run time)"
        frame = frame.f_back
    return "?"


class _Measured(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        package = name.partition(".")[0]
        if package not in _FIRST:
            _FIRST[package] = _STACK[-1][0] if _STACK else _caller()
        _STACK.append([name, 0.0])
        before = _rss_mb()
        try:
            self._inner.exec_module(module)
        finally:
            added = _rss_mb() - before
            _, nested = _STACK.pop()
            _NET[package] += added - nested
            if _STACK:
                _STACK[-1][1] += added

    def __getattr__(self, name: str) -> Any:  # the inner loader's other methods (get_data, ...)
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: ModuleType | None = None) -> Any:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Measured(spec.loader)
            return spec
        return None


def _report(_signum: int, _frame: FrameType | None) -> None:
    out = os.environ["THINKGATE_IMPORT_RSS_OUT"]
    body = {"rss_mb": _rss_mb(), "modules": len(sys.modules),
            "packages": {p: {"mb": round(mb, 2), "first_from": _FIRST.get(p, "")}
                         for p, mb in _NET.items()}}  # fmt: skip
    with open(f"{out}.part", "w") as written:
        json.dump(body, written)
    os.replace(f"{out}.part", out)


if os.environ.get("THINKGATE_IMPORT_RSS_OUT"):
    sys.meta_path.insert(0, _Finder())
    signal.signal(signal.SIGUSR1, _report)
