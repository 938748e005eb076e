"""Importing any module does nothing: no threads, files, output, sockets or loggers; and the
gateway's app imports only what every configuration uses."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

from gateway.cli.preflight import ADDRESS

PROBE = r"""
import importlib, logging, os, pkgutil, sys, threading
before = (threading.active_count(), sorted(os.listdir(".")), dict(os.environ),
          len(logging.getLogger().handlers))
names = []
for package in ("gateway", "audit", "ratelimit", "bench"):
    module = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
        names.append(info.name)
after = (threading.active_count(), sorted(os.listdir(".")), dict(os.environ),
         len(logging.getLogger().handlers))
assert before == after, (before, after)
sys.stderr.write(str(len(names)))
"""


def test_importing_every_module_has_no_side_effects(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert int(result.stderr) > 20  # it really imported the packages
    assert list(tmp_path.iterdir()) == []


# What a configuration may not use, imported where it does (the RSS each costs, measured):
OPTIONAL = {
    "redis": "REDIS_URL (~10 MB)",
    "rfc3161_client": "a TSA (TSA_URL) or a stamp to read (~4 MB)",
    "zmq": "an engine publishing KV events (~5 MB)",
    "numpy": "an engine publishing KV events (~17 MB)",
    "opentelemetry.sdk": "an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT, ~3 MB)",
    "phonenumbers": "a guardrail policy's phone detector, at its first candidate (~1 MB)",
    "stdnum": "a guardrail policy's IBAN detector, at its first candidate (~1 MB)",
    "regex": "a guardrail policy: its detectors and scanner, at its load (~2 MB with them)",
    "gateway.guard.detectors": "a guardrail policy, at its load (with regex, above)",
    "yaml": "a YAML file: THINKGATE_CONFIG, PRICES_FILE or a guardrail policy (~0.5 MB)",
}


def test_the_app_imports_no_optional_library(tmp_path: Path) -> None:
    """Nor what no serving process loads (``NEVER_SERVING``, below)."""
    root = Path(__file__).resolve().parent.parent
    unwanted = sorted({*OPTIONAL, *NEVER_SERVING})
    probe = ("import sys, gateway.app; "
             f"print(sorted(m for m in {unwanted!r} if m in sys.modules))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path,
                            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert result.stdout.strip() == "[]", [OPTIONAL.get(m, m)
                                           for m in ast.literal_eval(result.stdout)]  # fmt: skip


# What no serving process loads: the ORM (every store is Core; ``audit.sqlasync``), and Alembic
# where the database is at its head (``ledger init`` brought it there: the start checks it with
# one query; a start that has to migrate loads Alembic to do it); and what the demo's
# configuration does not use (no YAML file).
NEVER_SERVING = ["alembic", "sqlalchemy.orm", "yaml"]

SERVE = r"""
import json, os, signal, sys, threading, time, urllib.request
from gateway.cli.main import main

PORT = os.environ["PORT"]

def until_up():
    deadline = time.monotonic() + 60
    while True:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{PORT}/healthz", timeout=1)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling the condition, with its deadline above

def probe():
    try:
        until_up()
        key = json.load(open(os.path.join(os.environ["THINKGATE_HOME"], "demo-keys.json")))
        body = json.dumps({"model": "deepseek-r1", "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{PORT}/v1/chat/completions", data=body,
            headers={"authorization": f"Bearer {key['client']}",
                     "content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            streamed = answer.read()
        sys.stderr.write(f"streamed {len(streamed)} bytes, status {answer.status}\n")
        print(json.dumps(sorted(m for m in NEVER if m in sys.modules)), flush=True)
    finally:
        os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=probe, daemon=True).start()
sys.exit(main(["serve", "--demo", "--port", PORT, "--workers", "1"]))
"""


def test_the_serving_process_loads_no_orm_nor_alembic_nor_yaml(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "THINKGATE_HOME": str(tmp_path),
           "THINKGATE_AUDIT_MODE": "strict"}  # fmt: skip
    init = [sys.executable, "-m", "gateway.cli", "ledger", "init"]
    made = subprocess.run(init, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    code = f"NEVER = {NEVER_SERVING!r}\n{SERVE}"
    for _ in range(3):  # a free port may be taken before the server binds it: another one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                                env={**env, "PORT": str(port)}, capture_output=True, text=True,
                                timeout=120, check=False)  # fmt: skip
        if result.returncode != ADDRESS:
            break
    assert "status 200" in result.stderr, result.stderr[-2000:]
    loaded = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert loaded == ["[]"], (loaded, result.stdout[-2000:])
