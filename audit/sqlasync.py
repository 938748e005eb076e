"""SQLAlchemy's async engine without its ORM: import ``AsyncEngine`` and friends from here.

``sqlalchemy.ext.asyncio``'s ``__init__`` imports ``AsyncSession`` and with it the whole ORM
(about 7 MB of every process's memory, ``bench/RESULTS.md``), which no thinkgate process uses:
every store is written in Core. The engine itself (``sqlalchemy.ext.asyncio.engine``, with
``base`` and ``result``) needs none of it. So this module puts the package into ``sys.modules``
unexecuted, imports the engine's and results' modules alone and sets their names on the
package (so ``from sqlalchemy.ext.asyncio import AsyncEngine`` does not load the ORM either).
The package's ``__init__`` runs, ORM and all, at the first other name asked of it
(``from sqlalchemy.ext.asyncio import AsyncSession``): any importer still gets the whole
package. ``tests/test_imports.py`` holds the serving process free of the ORM, and ruff's
banned-api rule (``pyproject.toml``) keeps the package's own import, which would load the ORM
when it comes first, out of the code.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

_PACKAGE = "sqlalchemy.ext.asyncio"


def _lazy_package() -> None:
    if _PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(_PACKAGE)
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)

    def complete(name: str) -> Any:
        """The package's own ``__init__``, run once, at the first name not yet in it that is
        neither a submodule (``from . import exc``, which the import system then loads) nor
        a dunder probe (``__wrapped__``) other than ``__all__``."""
        dunder = name.startswith("__") and name != "__all__"
        if dunder or importlib.util.find_spec(f"{_PACKAGE}.{name}") is not None:
            raise AttributeError(name)
        del package.__getattr__
        spec.loader.exec_module(package)  # type: ignore[union-attr]
        return getattr(package, name)

    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[_PACKAGE] = package
    parent: ModuleType = sys.modules["sqlalchemy.ext"]
    parent.asyncio = package  # type: ignore[attr-defined]


_lazy_package()

from sqlalchemy.ext.asyncio import engine as _engine  # noqa: E402  (after the package is set)
from sqlalchemy.ext.asyncio import result as _result  # noqa: E402

# The engine's and results' names as the package's ``__init__`` exports them, so that
# ``from sqlalchemy.ext.asyncio import AsyncEngine`` elsewhere does not load the ORM either.
for _module, _names in (
    (_engine, ("async_engine_from_config", "AsyncConnection", "AsyncEngine", "AsyncTransaction",
               "create_async_engine", "create_async_pool_from_url")),
    (_result, ("AsyncMappingResult", "AsyncResult", "AsyncScalarResult", "AsyncTupleResult")),
):  # fmt: skip
    for _name in _names:
        setattr(sys.modules[_PACKAGE], _name, getattr(_module, _name))

AsyncConnection = _engine.AsyncConnection
AsyncEngine = _engine.AsyncEngine
AsyncTransaction = _engine.AsyncTransaction
create_async_engine = _engine.create_async_engine

__all__ = ["AsyncConnection", "AsyncEngine", "AsyncTransaction", "create_async_engine"]
