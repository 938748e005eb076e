"""``bench.rust_gateways``' pure parts (nothing started): TensorZero's configuration, which
gateways a bench environment holds, the skip notice, and the pins shared with the Makefile."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from bench import paced
from bench.rust_gateways import PACKAGES, TENSORZERO_MODEL_PREFIX, missing, plan, tensorzero_config

ROOT = Path(__file__).resolve().parents[2]


def fake_venv(path: Path, *dist_infos: str) -> Path:
    site = path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for name in dist_infos:
        (site / name).mkdir()
    return path


def test_tensorzero_config_routes_every_paced_model_to_the_upstream() -> None:
    config = tomllib.loads(tensorzero_config("http://127.0.0.1:9/v1", paced.MODELS))

    assert config["gateway"]["disable_pseudonymous_usage_analytics"] is True
    assert config["gateway"]["observability"]["enabled"] is False
    assert set(config["models"]) == set(paced.MODELS)
    for name, model in config["models"].items():
        assert model["routing"] == ["paced"]
        assert model["providers"]["paced"] == {
            "type": "openai",
            "model_name": name,  # the upstream picks its shape by it
            "api_base": "http://127.0.0.1:9/v1/",
            "api_key_location": "none",
        }
    assert TENSORZERO_MODEL_PREFIX == "tensorzero::model_name::"


def test_tensorzero_config_quotes_what_toml_would_misread() -> None:
    config = tomllib.loads(tensorzero_config('http://h/"v1"/', ["a.b", 'q"t']))

    assert set(config["models"]) == {"a.b", 'q"t'}
    assert config["models"]["a.b"]["providers"]["paced"]["api_base"] == 'http://h/"v1"/'


def test_without_a_bench_environment_both_are_skipped_with_the_way_to_install(
    tmp_path: Path,
) -> None:
    names, notice = plan(tmp_path / "absent")

    assert names == []
    assert notice is not None
    assert "tensorzero, vllm-router" in notice and "make bench-env" in notice
    assert "tensorzero==2026.6.0 vllm-router==0.1.17" in notice


def test_an_environment_with_both_pins_starts_both(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, "tensorzero-2026.6.0.dist-info", "vllm_router-0.1.17.dist-info")

    assert missing(venv) == {}
    assert plan(venv) == (["tensorzero", "vllm-router"], None)


def test_another_version_counts_as_missing(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, "tensorzero-2026.5.0.dist-info", "vllm_router-0.1.17.dist-info")

    names, notice = plan(venv)

    assert names == ["vllm-router"]
    assert notice is not None and notice.startswith("skipping tensorzero:")


def test_the_makefile_installs_the_pinned_versions() -> None:
    makefile = (ROOT / "Makefile").read_text()
    pins = dict(re.findall(r"^(TENSORZERO|VLLM_ROUTER)_PIN := (\S+)$", makefile, re.MULTILINE))

    assert pins == {"TENSORZERO": PACKAGES["tensorzero"][1],
                    "VLLM_ROUTER": PACKAGES["vllm-router"][1]}  # fmt: skip
