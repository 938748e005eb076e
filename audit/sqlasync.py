"""SQLAlchemy's async engine without its ORM: import ``AsyncEngine`` and friends from here.

``sqlalchemy.ext.asyncio``'s ``__init__`` imports ``AsyncSession`` and with it the whole ORM
(6.9 MB of a process's memory over ``import gateway.app``), which no thinkgate process uses:
every store is written in Core. The engine itself (``sqlalchemy.ext.asyncio.engine``, with
``base`` and ``result``) needs none of it. So this module puts the package into ``sys.modules``
unexecuted, imports the engine's and results' modules alone, sets their names on the package
(so ``from sqlalchemy.ext.asyncio import AsyncEngine`` does not load the ORM either) and does
the rest of what the package's ``__init__`` does (greenlet's check). The ``__init__`` itself
runs, ORM and all, at the first other name asked of the package (``from
sqlalchemy.ext.asyncio import AsyncSession``): any importer still gets the whole package.
``tests/test_imports.py`` holds the serving process free of the ORM, and ruff's banned-api
rule (``pyproject.toml``) keeps the package's own import, which would load the ORM when it
comes first, out of the code.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

from sqlalchemy.util import concurrency

_PACKAGE = "sqlalchemy.ext.asyncio"
# What the package's ``__init__`` takes from the two modules loaded here (in its order);
# ``tests/audit/test_sqlasync.py`` reads the installed ``__init__`` and fails when it differs.
ENGINE_NAMES = ("async_engine_from_config", "AsyncConnection", "AsyncEngine", "AsyncTransaction",
                "create_async_engine", "create_async_pool_from_url")  # fmt: skip
RESULT_NAMES = ("AsyncMappingResult", "AsyncResult", "AsyncScalarResult", "AsyncTupleResult")


class _Completion:
    """The package's own ``__init__``, run once, at the first name asked of the package that it
    lacks, other than a submodule's (``from . import exc``: the import system then loads it) or
    a dunder probe (``__wrapped__``; ``__all__`` does complete it, for ``import *``). Under a
    lock: a second thread waits for the first one's run. A run that fails leaves the package
    lazy, to be tried again and fail the same way, rather than half made and silent."""

    def __init__(self, package: ModuleType, spec: importlib.machinery.ModuleSpec) -> None:
        self._package, self._spec = package, spec
        self._lock = threading.RLock()
        self._running = False

    def __call__(self, name: str) -> Any:
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        if name.isidentifier() and importlib.util.find_spec(f"{_PACKAGE}.{name}") is not None:
            raise AttributeError(name)
        with self._lock:
            if "__getattr__" in vars(self._package) and not self._running:
                self._running = True  # a name asked for while ``__init__`` runs is not there yet
                try:
                    self._spec.loader.exec_module(self._package)  # type: ignore[union-attr]
                finally:
                    self._running = False
                del self._package.__getattr__
        try:
            return vars(self._package)[name]
        except KeyError:
            raise AttributeError(name) from None


def _lazy_package() -> ModuleType:
    if _PACKAGE in sys.modules:
        return sys.modules[_PACKAGE]
    spec = importlib.util.find_spec(_PACKAGE)
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    package.__getattr__ = _Completion(package, spec)  # type: ignore[method-assign]
    sys.modules[_PACKAGE] = package
    parent: ModuleType = sys.modules["sqlalchemy.ext"]
    parent.asyncio = package  # type: ignore[attr-defined]
    return package


_package = _lazy_package()

from sqlalchemy.ext.asyncio import engine as _engine  # noqa: E402  (after the package is set)
from sqlalchemy.ext.asyncio import result as _result  # noqa: E402

for _name in ENGINE_NAMES:
    setattr(_package, _name, getattr(_engine, _name))
for _name in RESULT_NAMES:
    setattr(_package, _name, getattr(_result, _name))
# The rest of the package's ``__init__``: greenlet checked at import (a missing one fails here,
# not at the first query), as the package itself does.
concurrency._concurrency_shim._initialize()

AsyncConnection = _engine.AsyncConnection
AsyncEngine = _engine.AsyncEngine
AsyncTransaction = _engine.AsyncTransaction
create_async_engine = _engine.create_async_engine

__all__ = ["AsyncConnection", "AsyncEngine", "AsyncTransaction", "create_async_engine"]
