"""The ``thinkgate`` command line, run as a user runs it: a subprocess in a fresh directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.cli.demo import SNIPPET
from gateway.settings import Settings
from gateway.spend.prices import load_prices

THINKGATE = [sys.executable, "-m", "gateway.cli"]


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THINKGATE_")}
    return subprocess.run(
        [*THINKGATE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    created = run_cli(
        tmp_path,
        "keys",
        "create",
        "--tenant",
        "acme",
        "--role",
        "client",
        "--reasoning",
        "visible",
        "--rpm",
        "60",
    )
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"sk-tg-[0-9a-f]{12}-[A-Za-z0-9_-]{43}", secret)
    key_id = secret.split("-")[2]
    assert (tmp_path / "var" / "thinkgate.db").exists()
    assert secret.encode() not in (tmp_path / "var" / "thinkgate.db").read_bytes()

    listed = run_cli(tmp_path, "keys", "list")
    assert listed.returncode == 0
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(key_id)]
    assert "acme" in row and "visible" in row and "active" in row
    assert secret not in listed.stdout

    assert run_cli(tmp_path, "keys", "revoke", key_id).returncode == 0
    assert "revoked" in run_cli(tmp_path, "keys", "list").stdout
    again = run_cli(tmp_path, "keys", "revoke", key_id)
    assert again.returncode == 1 and f"key {key_id} is already revoked" in again.stderr
    unknown = run_cli(tmp_path, "keys", "revoke", "000000000000")
    assert unknown.returncode == 1 and "no key 000000000000" in unknown.stderr


def test_keys_revoke_given_a_whole_secret_revokes_its_id_and_says_so(tmp_path: Path) -> None:
    created = run_cli(tmp_path, "keys", "create", "--tenant", "acme", "--role", "client")
    secret = created.stdout.strip().splitlines()[-1]
    key_id = secret.split("-")[2]
    revoked = run_cli(tmp_path, "keys", "revoke", secret)
    assert revoked.returncode == 0
    assert f"revoked {key_id}" in revoked.stdout and "pass just the id" in revoked.stdout
    assert secret not in revoked.stdout + revoked.stderr


def test_keys_list_shows_no_reasoning_flag_for_auditor_and_admin_keys(tmp_path: Path) -> None:
    for role in ("auditor", "admin"):
        assert (
            run_cli(tmp_path, "keys", "create", "--tenant", "ops", "--role", role).returncode == 0
        )
    rows = run_cli(tmp_path, "keys", "list").stdout.splitlines()[1:]
    assert rows and all(row.split()[3] == "-" for row in rows), rows


def test_keys_create_rejects_bad_input(tmp_path: Path) -> None:
    assert (
        run_cli(tmp_path, "keys", "create", "--tenant", "a b", "--role", "client").returncode != 0
    )
    assert run_cli(tmp_path, "keys", "create", "--tenant", "t", "--role", "root").returncode == 2


def test_serve_without_upstream_explains_what_to_do(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "serve")
    assert result.returncode == 2 and "--demo" in result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def start_demo(
    cwd: Path, port: int, *, first: bool = True
) -> tuple[asyncio.subprocess.Process, str]:
    """Start ``serve --demo``; return the process and the printed client key once it serves."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THINKGATE_")}
    proc = await asyncio.create_subprocess_exec(
        *THINKGATE,
        "serve",
        "--demo",
        "--port",
        str(port),
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    printed = ""
    while not printed.endswith("\nprint()\n"):  # the snippet's last line
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        assert line, "the demo server exited before printing its keys"
        printed += line.decode()
    logged = b""
    while True:  # wait, with a deadline, until uvicorn reports that the app started
        line = await asyncio.wait_for(proc.stderr.readline(), timeout=30)
        assert line, "the demo server exited during start-up"
        logged += line
        if b"Application startup complete" in line:
            break
    assert b"demo simulator (the upstream) on http://127.0.0.1:" in logged  # doctor can find it
    # uvicorn's start-up lines once, the gateway's: the embedded simulator's would repeat
    # them with the same PID and no label
    assert logged.count(b"Started server process") == 1, logged
    assert logged.count(b"Application startup complete") == 1, logged
    # the keys it made, once, each warned about in words that fit it
    made = [b"created the checkpoint signing key var/signing-key.pem (demo): keep it, or later "
            b"checkpoints are signed by another key than auditors pinned",
            b"created the ledger encryption key file var/ledger-keys.json (demo): keep it, or "
            b"records become unreadable"]  # fmt: skip
    assert [m in logged for m in made] == [first, first], logged
    assert logged.startswith(b"{")  # not a terminal: JSON lines
    match = re.search(r"client key .*: (sk-tg-\S+)", printed)
    assert match, printed
    assert f"export THINKGATE_URL=http://127.0.0.1:{port}/v1" in printed
    return proc, match.group(1)


async def stop(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGINT)
    return await asyncio.wait_for(proc.wait(), timeout=15)


def readme_snippet() -> str:
    """The first Python block of the README (the demo prints the same, ``demo.SNIPPET``)."""
    text = (Path(__file__).parents[3] / "README.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == SNIPPET, "README's snippet and the demo's differ"
    return block


async def test_demo_serves_the_readme_snippet_and_keeps_its_keys(tmp_path: Path) -> None:
    port = free_port()
    proc, key = await start_demo(tmp_path, port)
    try:
        # the README's snippet, as pasted: its key and URL from the variables the demo prints
        env = {**os.environ, "THINKGATE_KEY": key, "THINKGATE_URL": f"http://127.0.0.1:{port}/v1"}
        ran = await asyncio.create_subprocess_exec(
            sys.executable, "-c", readme_snippet(), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(ran.communicate(), timeout=60)
        assert ran.returncode == 0, err.decode()
        printed = out.decode()
        assert len(printed) > 100 and "None" not in printed and "\033" not in printed  # no tty

        def formats() -> list[tuple[Any, Any]]:
            # the demo reads each simulated model as it sends reasoning: a separating engine's
            # content-only answer is the answer; Kimi K3's markers are split from the text
            c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
            asks = [
                ("deepseek-r1-parsed", {"empty_reasoning": True, "itl_ms": 0}),
                ("kimi-k3", {"chunks": ["plan", "<|close|>", "think", "<|sep|>", "Hi"]}),
            ]
            out = []
            for model, sim in asks:
                message = c.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "Hi"}],
                    extra_body={"sim": sim},
                ).choices[0].message  # fmt: skip
                out.append(((message.model_extra or {}).get("reasoning_content"), message.content))
            c.close()
            return out

        parsed, k3 = await asyncio.to_thread(formats)
        assert parsed[0] is None and parsed[1]
        assert k3 == ("plan", "Hi")
    finally:
        assert await stop(proc) == 0
    proc, key_again = await start_demo(tmp_path, port, first=False)
    assert await stop(proc) == 0
    assert key_again == key
    assert oct((tmp_path / "var" / "demo-keys.json").stat().st_mode & 0o777) == "0o600"


async def test_sim_says_where_it_listens_and_when_it_stops(tmp_path: Path) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *THINKGATE, "sim", "--port", str(port), "--ttft-ms", "0", cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    first = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
    assert f"http://127.0.0.1:{port}/v1" in first and "deepseek-r1" in first
    async with httpx.AsyncClient() as client:  # serving (its signal handlers are in place)
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                    break
            await asyncio.sleep(0.05)  # polling another process's readiness, bounded
    assert await stop(proc) == 0
    rest = (await asyncio.wait_for(proc.stdout.read(), timeout=10)).decode()
    assert "stopped" in rest


def test_help_names_every_command_shows_defaults_and_cites_nothing_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gateway.cli.main import main as cli

    with pytest.raises(SystemExit):
        cli(["--help"])
    top = capsys.readouterr().out
    for command in ("serve", "sim", "keys", "ledger", "capacity", "doctor", "bench"):
        assert command in top.split("positional arguments")[0], command
    assert "DESIGN" not in top and "``" not in top
    with pytest.raises(SystemExit):
        cli(["sim", "--help"])
    assert "(default: 8000)" in capsys.readouterr().out


def test_logs_are_text_on_a_terminal_and_json_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.telemetry.logs import log_config

    def formatter(tty: bool, chosen: str = "auto") -> str:
        monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
        name: str = log_config(Settings(log_format=chosen))["formatters"]["main"]["()"]
        return name.rsplit(".", 1)[1]

    assert (formatter(True), formatter(False)) == ("TextFormatter", "JsonFormatter")
    assert formatter(True, "json") == "JsonFormatter"


def test_make_run_takes_a_port() -> None:
    makefile = (Path(__file__).parents[3] / "Makefile").read_text()
    assert "PORT ?= 8080" in makefile and "serve --demo --port $(PORT)" in makefile


def _routing_page_sim() -> list[str]:
    """The arguments of docs/routing.md's ``thinkgate sim`` line (two lines, joined)."""
    page = (Path(__file__).resolve().parents[3] / "docs" / "routing.md").read_text()
    found = re.search(r"^thinkgate sim (.*?)\\\n(.*?)$", page, re.M | re.S)
    assert found is not None
    return f"{found.group(1)} {found.group(2).splitlines()[0]}".split()


async def test_sim_publishes_kv_events_as_the_routing_page_says(tmp_path: Path) -> None:
    """docs/routing.md's ``thinkgate sim`` line, its ports made free ones: it answers
    ``/kv_event_sources`` and ``/tokenize``, publishes a ``BlockStored`` for a prompt, and
    reports the prompt cached the second time."""
    import msgpack
    import zmq
    import zmq.asyncio

    port, events, replay = free_port(), free_port(), free_port()
    args = [a.replace("8001", str(port)).replace("5557", str(events))
            .replace("5558", str(replay)) for a in _routing_page_sim()]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*THINKGATE, "sim", *args, "--ttft-ms", "0",
                                                cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)  # fmt: skip
    context = zmq.asyncio.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{events}")
    root = f"http://127.0.0.1:{port}"
    text = "a long enough prompt " * 20  # 105 tokens with the round's 11 characters
    ask: dict[str, Any] = {"model": "deepseek-v3", "max_tokens": 2,
                           "messages": [{"role": "user", "content": text}]}  # fmt: skip
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            for _ in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{root}/health")).status_code == 200:
                        break
                await asyncio.sleep(0.05)  # polling another process's readiness, bounded
            sources = (await client.get(f"{root}/kv_event_sources")).json()
            assert sources["0"]["endpoint"] == f"tcp://*:{events}"
            assert sources["0"]["replay_endpoint"] == f"tcp://*:{replay}"
            tokens = (await client.post(f"{root}/tokenize", json=ask)).json()
            assert tokens["count"] == len(tokens["tokens"]) == 105  # four characters a token
            seen: list[Any] = []
            rounds = 0
            while not seen:  # the SUB socket joins asynchronously: new prompts until one is seen
                rounds += 1
                ask["messages"] = [{"role": "user", "content": f"round {rounds:04} {text}"}]
                first = (await client.post(f"{root}/v1/chat/completions", json=ask)).json()
                if await sub.poll(200):
                    seen = msgpack.unpackb((await sub.recv_multipart())[2])[1]
            assert seen[0]["type"] == "BlockStored" and seen[0]["block_size"] == 16
            again = (await client.post(f"{root}/v1/chat/completions", json=ask)).json()
            assert first["usage"]["prompt_tokens"] == 107
            assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    finally:
        context.destroy(linger=0)
        assert await stop(proc) == 0


def test_capacity_prices_writes_a_prices_file_the_gateway_reads(tmp_path: Path) -> None:
    plan = ["capacity", "--model", "deepseek-r1", "--gpus", "32", "--dp", "4", "--tp", "8",
            "--gpu-mem-gib", "141", "--weights", "fp8"]  # fmt: skip
    money = ["--prices", "--monthly-cost", "57000", "--output-tokens-per-s", "2500",
             "--served-model", "deepseek-ai/DeepSeek-R1"]  # fmt: skip
    done = run_cli(tmp_path, *plan, *money)
    assert done.returncode == 0, done.stderr
    (tmp_path / "prices.yaml").write_text(done.stdout)
    prices = load_prices(tmp_path / "prices.yaml")
    price = prices.of("deepseek-ai/DeepSeek-R1")
    assert price is not None and price.output == price.reasoning > price.input > 0
    assert "57,000.00 USD a month" in done.stdout
    missing = run_cli(tmp_path, *plan, "--prices", "--monthly-cost", "57000")
    assert missing.returncode == 2 and "--output-tokens-per-s" in missing.stderr
    bad = run_cli(tmp_path, *plan, *money[:1], "--monthly-cost", "lots", *money[3:])
    assert bad.returncode == 2 and "--monthly-cost" in bad.stderr
    too_small = [*plan[:10], "80", *plan[11:]]  # fp8 R1 does not fit 8 × 80 GB
    unfit = run_cli(tmp_path, *too_small, *money)
    assert unfit.returncode == 2 and "does not fit" in unfit.stderr and not unfit.stdout
