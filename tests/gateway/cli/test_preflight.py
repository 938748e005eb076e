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
from gateway.settings import Settings

UPSTREAM = ["--upstream", "http://127.0.0.1:9/v1"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in (
        "THINKGATE_CONFIG",
        "THINKGATE_DATABASE_URL",
        "THINKGATE_UPSTREAMS",
        "THINKGATE_HOME",
        "THINKGATE_LEDGER_KEY_FILE",
        "THINKGATE_SIGNING_KEY_FILE",
    ):
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
    assert "var/ledger-keys.json is missing" in err and "thinkgate ledger init" in err
    # where it looked, and the two settings that move it
    assert f"THINKGATE_LEDGER_KEY_FILE, or THINKGATE_HOME (now var in {home})" in err


def test_one_home_directory_holds_every_file_and_serve_finds_them(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINKGATE_HOME", str(home / "state"))
    assert main(["ledger", "init"]) == 0
    assert sorted(p.name for p in (home / "state").iterdir()) == [
        "ledger-keys.json", "signing-key.pem", "thinkgate.db",
        "thinkgate.db.migrate.lock"]  # the database's migrations' lock  # fmt: skip
    assert not (home / "var").exists()
    preflight.check_keys(Settings())  # what serve checks: found, from any working directory
    monkeypatch.chdir(home.parent)
    preflight.check_keys(Settings())
    monkeypatch.setenv("THINKGATE_HOME", str(home / "elsewhere"))
    code, err = refused(capsys, *UPSTREAM, "--port", "0")
    assert code == preflight.KEYS
    assert f"{home}/elsewhere/ledger-keys.json is missing" in err
    assert f"THINKGATE_HOME (now {home}/elsewhere)" in err


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


@pytest.mark.parametrize(
    "argv",
    [
        ["ledger", "rotate-kek"],
        ["ledger", "shred", "--tenant", "acme"],
        ["ledger", "export"],
        ["ledger", "public-key"],
    ],
    ids=lambda argv: argv[1],
)
def test_ledger_commands_without_key_files_say_which_and_where(
    home: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert code == preflight.KEYS
    missing = "signing-key.pem" if argv[1] in ("export", "public-key") else "ledger-keys.json"
    assert f"var/{missing} is missing: run 'thinkgate ledger init'" in err
    assert f"THINKGATE_HOME (now var in {home})" in err
