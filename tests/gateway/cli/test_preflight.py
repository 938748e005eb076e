"""``thinkgate serve`` refuses to start with one clear line and a documented exit code for each
mistake a user can make (``gateway.cli.preflight``), never a traceback, and before it prints or
starts anything."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import preflight
from gateway.cli.main import main

UPSTREAM = ["--upstream", "http://127.0.0.1:9/v1"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("THINKGATE_CONFIG", "THINKGATE_DATABASE_URL", "THINKGATE_UPSTREAMS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["serve", *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return code, err


def test_missing_ledger_keys_say_which_file_and_the_command(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = refused(capsys, *UPSTREAM, "--port", "0")
    assert code == preflight.KEYS == 3
    assert "ledger-keys.json is missing" in err and "thinkgate ledger init" in err


def test_a_busy_port_is_refused_first(
    home: Path, capsys: pytest.CaptureFixture[str], taken: int
) -> None:
    code, err = refused(capsys, "--demo", "--port", str(taken))
    assert code == preflight.ADDRESS == 4
    assert f"127.0.0.1:{taken}" in err and "already in use" in err
    assert not (home / "var").exists()  # no demo key was made, nothing was printed


def test_config_that_is_not_yaml_names_the_file_and_line(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "bad.yaml").write_text("models: [unclosed\n")
    monkeypatch.setenv("THINKGATE_CONFIG", "bad.yaml")
    code, err = refused(capsys, *UPSTREAM, "--port", "0")
    assert code == preflight.CONFIG == 2
    assert "bad.yaml is not valid YAML (line 2" in err


def test_an_unreachable_database_is_named_without_its_password(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINKGATE_DATABASE_URL",
                       "postgresql+asyncpg://app:s3cret@127.0.0.1:1/thinkgate")  # fmt: skip
    code, err = refused(capsys, *UPSTREAM, "--port", "0")
    assert code == preflight.DATABASE == 5
    assert "cannot reach the database postgresql+asyncpg://app:***@127.0.0.1:1/thinkgate" in err
    assert "s3cret" not in err
