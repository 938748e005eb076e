"""The documentation site: it builds with ``mkdocs build --strict`` (a broken link or anchor, a
page outside the navigation, fails it), and its generated pages are what the code says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.settings import Settings
from tools import settingsdoc

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    built = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").exists()


def test_the_configuration_page_is_generated_from_the_settings() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == settingsdoc.document(), (
        "docs/configuration.md is stale: python -m tools.settingsdoc > docs/configuration.md"
    )


def test_every_setting_is_described_in_a_section_of_its_page() -> None:
    listed = [name for _, names in settingsdoc.sections() for name in names]
    assert sorted(listed) == sorted(Settings.model_fields)  # each once, none outside a section
    assert all(field.description for field in Settings.model_fields.values())


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    first_screen = readme.splitlines()[:8]
    assert any(line.startswith("make run") for line in first_screen)
    assert any(line.startswith("make test") for line in first_screen)


def test_the_readme_picture_names_every_package() -> None:
    readme = (ROOT / "README.md").read_text()
    picture = readme.split("## Architecture", 1)[1].split("```", 2)[1]
    packages = {p.name for p in (ROOT / "gateway").iterdir() if (p / "__init__.py").exists()}
    packages |= {p.name for p in (ROOT / "gateway" / "side").iterdir() if p.is_dir()}
    packages |= {"audit", "ratelimit", "bench", "deploy", "tools", "migrations"}
    packages.discard("__pycache__")
    missing = sorted(name for name in packages if f"{name}/" not in picture)
    assert not missing, f"the README's picture does not name {missing}"
