"""The package layout, read from the imports: a request's way through ``gateway/`` is the folder
tree, and no import goes against it.

Layers, lowest first; a package imports only packages of lower layers (and its own modules)::

    errors  names (ids and tool names the parsers and the relays share)
    relay (sans-I/O: SSE, formats, splitter, rewriters)  api (request parsers)  edge
    cache (sans-I/O: KV events, the prefix index, the scorer)
    settings  sim (the simulator: a vLLM of its own, it shares only the formats)
    db  ledger
    auth  telemetry  conversation (sealed reasoning, stored responses)
    upstream
    admission
    exchange
    pipeline (the steps the completion routes share)
    routes  console  witness  siem (the SIEM export)
    app
    cli

The side systems (``sim``, ``siem``, ``witness``, ``console``) live in ``gateway/side/`` and
keep their layers; the request's way imports none of them (the app and the command wire them).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS: dict[str, int] = {
    "errors": 0, "names": 0, "sections": 1,
    "relay": 1, "api": 1, "edge": 1, "cache": 1,
    "settings": 2, "sim": 2, "guard": 2, "spend": 2,
    "db": 3, "ledger": 3,
    "auth": 4, "telemetry": 4, "conversation": 4,
    "upstream": 5, "batch": 5,
    "admission": 6,
    "exchange": 7,
    "pipeline": 8,
    "routes": 9, "console": 9, "witness": 9, "siem": 9,
    "app": 10,
    "cli": 11,
}  # fmt: skip
# What the sans-I/O core may import from outside the standard library.
RELAY_THIRD_PARTY = {"orjson"}


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if "migrations" in path.parts:  # Alembic's scripts, loaded by Alembic, not imported
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def package(module: str) -> str:
    """The package that holds ``module`` (for a side system, its own: ``gateway.side.sim``)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] == "side":  # the wing itself holds nothing but its doc
        return parts[2] if len(parts) > 2 else ""
    return parts[1] if len(parts) > 1 else ""


MODULES = dict(modules())
NAMES = set(MODULES)


def gateway_imports(module: str) -> set[str]:
    """The gateway modules ``module`` imports (a package it lives in does not count: ``from
    gateway.cli import ledger`` imports ``gateway.cli.ledger``)."""
    return {
        m for m in imports(MODULES[module])
        if m in NAMES and m != module and not module.startswith(m + ".")
    }  # fmt: skip


def test_every_package_has_a_layer() -> None:
    assert {package(m) for m in NAMES} - {""} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(NAMES - {"gateway"}))
def test_imports_go_only_to_lower_layers(module: str) -> None:
    mine = package(module)
    for target in gateway_imports(module):
        theirs = package(target)
        if theirs and theirs != mine:
            assert LAYERS[theirs] < LAYERS[mine], f"{module} imports {target}: an upward import"


@pytest.mark.parametrize("module", sorted(m for m in NAMES if package(m) == "relay"))
def test_the_relay_core_does_no_io_and_knows_no_framework(module: str) -> None:
    stdlib = sys.stdlib_module_names
    for name in imports(MODULES[module]):
        top = name.split(".")[0]
        if top == "gateway":
            assert package(name) in {"relay", "errors", "names"}, f"{module} imports {name}"
        else:
            assert top in stdlib or top in RELAY_THIRD_PARTY or top == "__future__", (
                f"{module} imports {name}"
            )


def test_nothing_below_the_routes_reaches_the_routes_or_the_app_state() -> None:
    for module in NAMES:
        if LAYERS.get(package(module), 99) < LAYERS["routes"]:
            bad = {t for t in gateway_imports(module) if package(t) in {"routes", "app", "cli"}}
            assert not bad, f"{module} imports {bad}"


def test_no_import_cycles() -> None:
    graph = {m: gateway_imports(m) for m in NAMES}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target] if target in path else [target]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_two_public_classes_share_a_name() -> None:
    seen: dict[str, str] = {}
    paths = [p for top in ("gateway", "audit", "ratelimit") for p in (ROOT / top).rglob("*.py")]
    for path in sorted(paths):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                assert node.name not in seen, f"{node.name}: {seen[node.name]} and {module}"
                seen[node.name] = module


def test_below_the_routes_a_component_gets_its_settings_section_not_the_whole_settings() -> None:
    """Only the routes, the app and the command see ``Settings`` and ``AppState``; every
    package below them is handed its section (``UpstreamSettings``, ``AdmissionSettings``,
    ``LedgerSettings``, ``SiemSettings``, ``LogSettings``, ``PipelineSettings``)."""
    top = LAYERS["routes"]
    for name, path in modules():
        layer = package(name) or "app"
        if layer == "settings" or LAYERS.get(layer, top) >= top:
            continue
        tree = ast.parse(path.read_text())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 for alias in node.names}  # fmt: skip
        assert not names & {"Settings", "AppState"}, name


def test_every_module_has_its_tests_at_the_mirrored_path_or_names_them() -> None:
    """``tests/README.md`` names the tests of every module without a mirrored test file; a
    module moved or removed leaves no stale row, and every file named exists."""
    table = (ROOT / "tests" / "README.md").read_text().split("## Modules tested elsewhere")[1]
    rows = {m[0]: m[1] for m in re.findall(r"^\| `([\w/.]+\.py)` \| (.+) \|$", table, re.M)}
    for package in ("gateway", "audit", "ratelimit"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or path.name in ("__init__.py", "__main__.py"):
                continue
            module = str(path.relative_to(ROOT))
            mirrored = ROOT / "tests" / path.relative_to(ROOT).parent / f"test_{path.stem}.py"
            if mirrored.exists():
                assert module not in rows, f"{module} has its own tests: drop its row"
                continue
            assert module in rows, f"{module}: no {mirrored.relative_to(ROOT)}, no row"
            for named in re.findall(r"`(tests/[\w/]+\.py)`", rows.pop(module)):
                assert (ROOT / named).exists(), f"{module}: {named} does not exist"
    assert not rows, f"rows for modules that do not exist: {sorted(rows)}"


def test_no_function_is_over_sixty_lines() -> None:
    """A function longer than a screen is split by what its parts do (STYLE.md)."""
    long = []
    for package in ("gateway", "audit", "ratelimit"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > 60:
                        long.append(f"{path.relative_to(ROOT)}:{node.name} ({lines})")
    assert not long


SIDE = {"sim", "siem", "witness", "console"}


def test_the_requests_way_imports_no_side_system() -> None:
    for module in NAMES:
        if package(module) in SIDE or package(module) in {"app", "cli", ""}:
            continue
        side = {t for t in gateway_imports(module) if package(t) in SIDE}
        assert not side, f"{module} imports {side}"
    assert {package(m) for m in NAMES if m.startswith("gateway.side.")} == SIDE
