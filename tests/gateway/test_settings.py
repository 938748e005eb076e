"""Settings: environment, YAML file, precedence, per-model parser overrides, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import Settings


def test_defaults_match_the_design() -> None:
    s = Settings()
    assert s.reasoning_parser == "deepseek_r1"
    assert s.reasoning_field == "reasoning_content"
    assert s.database_url == "sqlite+aiosqlite:///./var/thinkgate.db"
    assert s.audit_mode == "strict"
    assert s.kv_target_utilization == 0.85
    assert s.max_body_bytes == 4 << 20


def test_environment_with_prefix_and_comma_separated_upstreams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("THINKGATE_UPSTREAMS", "http://a:8000/v1/, http://b:8000/v1")
    monkeypatch.setenv("THINKGATE_REASONING_FIELD", "both")
    monkeypatch.setenv("THINKGATE_UPSTREAM_API_KEY", "upstream-secret")
    s = Settings()
    assert s.upstreams == ("http://a:8000/v1", "http://b:8000/v1")
    assert s.reasoning_field == "both"
    assert "upstream-secret" not in repr(s) and "upstream-secret" not in str(s.model_dump())


def test_yaml_file_with_model_overrides_and_env_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "thinkgate.yaml"
    config.write_text(
        "upstreams: [http://vllm:8000/v1]\n"
        "reasoning_parser: think_tags\n"
        "idle_timeout_s: 12\n"
        "models:\n"
        "  deepseek-r1: {reasoning_parser: deepseek_r1}\n"
        "  deepseek-v3: {reasoning_parser: none}\n"
    )
    monkeypatch.setenv("THINKGATE_CONFIG", str(config))
    monkeypatch.setenv("THINKGATE_IDLE_TIMEOUT_S", "30")
    s = Settings()
    assert s.upstreams == ("http://vllm:8000/v1",)
    assert s.idle_timeout_s == 30  # the environment wins over the file
    assert s.reasoning_for("deepseek-r1").format.name == "deepseek_r1"
    assert s.reasoning_for("deepseek-v3").format.name == "none"
    assert s.reasoning_for("qwq-32b").format.name == "think_tags"  # the global parser


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REASONING_PARSER", "regex"),
        ("REASONING_FIELD", "thoughts"),
        ("KV_TARGET_UTILIZATION", "1.5"),
    ],
)
def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(f"THINKGATE_{name}", value)
    with pytest.raises(ValidationError):
        Settings()


def test_unknown_model_override_keys_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("models:\n  m: {reasoning_parsr: none}\n")
    monkeypatch.setenv("THINKGATE_CONFIG", str(config))
    with pytest.raises(ValidationError):
        Settings()


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        Settings().port = 1  # type: ignore[misc]


def test_the_upstream_clients_earlier_name_still_names_it() -> None:
    assert Settings(http_transport="aiohttp").http_transport == "wire"  # type: ignore[arg-type]
    assert Settings().http_transport == "wire"
    with pytest.raises(ValidationError):
        Settings(http_transport="curl")  # type: ignore[arg-type]
