"""The two Rust gateways ``bench.realistic`` measures beside thinkgate, before the same upstream.

- **TensorZero** (PyPI ``tensorzero``): its HTTP gateway started embedded
  (``tensorzero._start_http_gateway``, no ClickHouse, PostgreSQL or Valkey) by a small launcher
  in a process of its own, so its CPU is metered like any other proxy's. Its configuration
  (``tensorzero_config``) declares one model per ``bench.paced`` shape, each served by an
  ``openai`` provider whose ``api_base`` is the paced upstream. It is called on its
  OpenAI-compatible route (``/openai/v1/chat/completions``, model
  ``tensorzero::model_name::NAME``); it parses every upstream chunk and writes its own.
  Embedded, it binds a port of its own choosing: the launcher reports its base URL in a file
  (written whole, then renamed), which is also the readiness signal (the start blocks until
  the gateway listens; it has no GET route to poll).
- **vllm-router** (PyPI ``vllm-router``): the paced upstream its only worker, round robin (the
  default policy, ``cache_aware``, keeps a prefix tree of every prompt: work a single worker
  does not need). It relays the upstream's bytes: the floor of a compiled proxy.

Both live in an environment of their own (``BENCH_VENV``, made by the Makefile's
``bench-realistic`` rule with the pins of ``PACKAGES``): they are what is measured, not project
dependencies. A gateway whose package is missing is skipped, with the way to install it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.paced import MODELS
from bench.procs import READY_TIMEOUT_S, ServerProcess, Workdir, free_port

ROOT = Path(__file__).resolve().parent.parent
BENCH_VENV = ROOT / ".venv-bench"
INSTALL_HINT = "make bench-env (or: python3 -m venv .venv-bench && .venv-bench/bin/pip install {})"
# name -> (distribution, version); the Makefile's TENSORZERO_PIN and VLLM_ROUTER_PIN match.
PACKAGES = {"tensorzero": ("tensorzero", "2026.6.0"), "vllm-router": ("vllm-router", "0.1.17")}
TENSORZERO_MODEL_PREFIX = "tensorzero::model_name::"

# Run by the bench environment's Python: argv = config file, file to report the base URL in.
# SIGINT (ServerProcess.stop) ends signal.pause() with KeyboardInterrupt.
LAUNCHER = """\
import os, signal, sys
import tensorzero
gateway = tensorzero._start_http_gateway(config_file=sys.argv[1], clickhouse_url=None,
                                         postgres_url=None, valkey_url=None, async_setup=False)
with open(sys.argv[2] + ".part", "w") as out:
    out.write(gateway.base_url)
os.replace(sys.argv[2] + ".part", sys.argv[2])
try:
    signal.pause()
except KeyboardInterrupt:
    gateway.close()
"""


@dataclass(frozen=True, slots=True)
class RustGateway:
    """A started gateway: its process, the OpenAI base URL to call, and what goes before the
    upstream's model name in a request."""

    name: str
    server: ServerProcess
    base_url: str
    model_prefix: str = ""


def missing(venv: Path) -> dict[str, str]:
    """The gateways whose pinned package is not in ``venv``: name -> ``distribution==version``."""
    installed = {p.name.lower() for p in venv.glob("lib/python3*/site-packages/*.dist-info")}
    return {name: f"{dist}=={version}" for name, (dist, version) in PACKAGES.items()
            if f"{dist.replace('-', '_')}-{version}.dist-info" not in installed}  # fmt: skip


def plan(venv: Path) -> tuple[list[str], str | None]:
    """The gateways to start from ``venv``, and what to tell the user about those skipped
    (``None``: none skipped)."""
    absent = missing(venv)
    present = [name for name in PACKAGES if name not in absent]
    if not absent:
        return present, None
    hint = INSTALL_HINT.format(" ".join(absent.values()))
    return present, f"skipping {', '.join(absent)}: not installed in {venv}; {hint}"


def tensorzero_config(upstream_base_url: str, models: Iterable[str]) -> str:
    """TensorZero's TOML: each paced model routed to the upstream as an OpenAI provider of the
    same name, no API key, observability and usage analytics off (there is no database)."""
    api_base = json.dumps(upstream_base_url.rstrip("/") + "/")  # it appends chat/completions
    lines = ["[gateway]", "disable_pseudonymous_usage_analytics = true", "",
             "[gateway.observability]", "enabled = false"]  # fmt: skip
    for model in models:
        key = json.dumps(model)  # a TOML basic string is a JSON string
        lines += ["", f"[models.{key}]", 'routing = ["paced"]', "",
                  f"[models.{key}.providers.paced]", 'type = "openai"', f"model_name = {key}",
                  f"api_base = {api_base}", 'api_key_location = "none"']  # fmt: skip
    return "\n".join(lines) + "\n"


def start(name: str, work: Workdir, upstream: ServerProcess, venv: Path) -> RustGateway:
    if name == "tensorzero":
        return start_tensorzero(work, upstream, venv)
    if name == "vllm-router":
        return start_vllm_router(work, upstream, venv)
    raise ValueError(f"no such gateway: {name!r}")


def start_tensorzero(work: Workdir, upstream: ServerProcess, venv: Path) -> RustGateway:
    home = work.path / "tensorzero"
    home.mkdir()
    config, reported = home / "tensorzero.toml", home / "base_url"
    config.write_text(tensorzero_config(upstream.base_url, MODELS))
    env = {**work.env, "TENSORZERO_DISABLE_PSEUDONYMOUS_USAGE_ANALYTICS": "1"}
    argv = [str(venv / "bin" / "python"), "-c", LAUNCHER, str(config), str(reported)]
    launched = work.spawn("tensorzero", argv, env, 0, "")
    try:
        base_url = _reported_url(launched, reported)
    except BaseException:
        launched.stop()
        raise
    port = urlsplit(base_url).port
    assert port is not None, base_url
    server = ServerProcess("tensorzero", port, "", launched.popen, launched.log)
    return RustGateway("tensorzero", server, base_url, TENSORZERO_MODEL_PREFIX)


def _reported_url(server: ServerProcess, path: Path) -> str:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text().strip()
        if server.popen.poll() is not None:
            raise RuntimeError(f"{server.name} exited at start-up; see {server.log}")
        time.sleep(0.05)
    raise RuntimeError(f"{server.name} not ready after {READY_TIMEOUT_S} s; see {server.log}")


def start_vllm_router(work: Workdir, upstream: ServerProcess, venv: Path) -> RustGateway:
    port = free_port()
    # Its Prometheus exporter listens on 29000 unless told: a port of its own, so two runs
    # (or anything else on 29000) do not collide.
    argv = [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", upstream.url, "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--log-level", "warning"]  # fmt: skip
    server = work.spawn("vllm-router", argv, work.env, port, "/health")
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return RustGateway("vllm-router", server, server.base_url)
