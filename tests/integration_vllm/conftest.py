"""Real vLLM (CPU build) with a tiny model built here, for the whole session.

Three servers start side by side from the same tiny model (``tinymodel.py``):

- ``parsed``: ``--reasoning-parser deepseek_r1``, served as ``tiny-r1-parsed`` and
  ``tiny-v4-parsed``: reasoning arrives in ``delta.reasoning``, as production deployments run it
  (the gateway reads it with ``reasoning_source: upstream``; ``tiny-v4-parsed`` stands for a
  hybrid model behind that parser, in the ``deepseek_v4`` format, whose thinking can be off);
- ``raw``: no reasoning parser, served as ``tiny-r1``, ``tiny-r1-tags``, ``tiny-v4``,
  ``tiny-k3`` and ``tiny-minimax``: the markers arrive inside ``content`` and thinkgate's own
  splitter does the work, each name configured with its format in the gateway;
- ``embed``: the same weights behind vLLM's pooling runner, served as ``tiny-embed``
  (``/v1/embeddings``).

The two generating servers also serve ``tiny-route``, the prefix-routing tests' model
(``routing_servers``: two engines of one model), with prefix caching, cached tokens in usage,
KV events published over ZMQ (with a replay endpoint) and ``VLLM_SERVER_DEV_MODE=1``
(``/reset_prefix_cache``). Every test's gateway in front of them thus follows real KV events.
Two servers of their own for routing would cost the suite two more starts of vLLM (about a
minute on two CPUs); the tests run one at a time on one worker, and each routing test clears
both caches before it measures.

The two generating servers load ``enginepace.py``, a logits processor: a request sent with
``vllm_xargs: {"pace_s": S}`` takes the engine at least S seconds a step, so a test can have
"the engine is still generating" as a fact, not a race against the tiny model's speed.

The vLLM environment is ``.venv-vllm`` (``make vllm``, which ``make test`` runs). Without it,
or with ``pytest --no-vllm``, these tests skip with the reason; under ``CI`` a missing
environment fails them instead. Each server runs in its own process group with its own
``TMPDIR`` and is torn down whole at the end of the session.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.otlp import ThreadedReceiver

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 240
RAW_NAMES = ("tiny-r1", "tiny-r1-tags", "tiny-v4", "tiny-k3", "tiny-minimax")
ROUTE = "tiny-route"  # served by both generating servers (the prefix-routing tests)
# vLLM's OpenAI server, as ``python -m vllm.entrypoints.openai.api_server`` runs it, from a
# main module of no file: the engine's process is spawned (vLLM's CPU platform forces it), and
# a spawned child imports its parent's main module first, which for ``-m`` is the whole API
# server (FastAPI, the OpenAI protocol's models, MCP) that the engine never uses. Three
# servers side by side were ready 3 s sooner this way (36-41 s against 33-37, idle machine).
LAUNCH = ("import sys; sys.argv[0] = 'vllm-api-server'; "
          "from vllm.entrypoints.launchers.api_server.entry import main; main()")  # fmt: skip


@dataclass(frozen=True)
class VllmServer:
    url: str  # OpenAI base URL, ending in /v1
    root: str
    models: tuple[str, ...]
    log: Path


@dataclass(frozen=True)
class TinyModel:
    path: Path
    think_id: int
    end_think_id: int


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm)
            # one xdist worker runs them all (--dist loadgroup): the servers start once, in
            # the first test's setup, which may take minutes while the other worker runs
            item.add_marker(pytest.mark.xdist_group("vllm"))
            item.add_marker(pytest.mark.timeout(600))


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> TinyModel:
    if pytestconfig.getoption("--no-vllm"):
        pytest.skip("real-vLLM suite disabled with --no-vllm")
    if not VLLM_PYTHON.exists():
        _unavailable("the vLLM environment .venv-vllm is missing: run `make vllm`")
    out = tmp_path_factory.mktemp("tiny-r1")
    subprocess.run(
        [str(VLLM_PYTHON), str(Path(__file__).with_name("tinymodel.py")), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    ids = json.loads((out / "tokens.json").read_text())
    return TinyModel(out, ids["<think>"], ids["</think>"])


_GIVEN: set[int] = set()  # ports handed out this session: the kernel may offer one twice


def _free_port() -> int:
    """A free port no other server of this session was given (the servers start side by side,
    and a port is free again the moment its probe socket closes)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def _start(
    model: TinyModel,
    workdir: Path,
    names: tuple[str, ...],
    parser: bool,
    *,
    embed: bool = False,
    traces: str | None = None,
    extra: tuple[str, ...] = (),
    dev: bool = False,
) -> tuple[subprocess.Popen[bytes], VllmServer]:
    port = _free_port()
    tmp = workdir / f"tmp-{port}"
    tmp.mkdir()
    log = workdir / f"vllm-{port}.log"
    args = [
        str(VLLM_PYTHON),
        "-c",
        LAUNCH,
        "--model",
        str(model.path),
        "--served-model-name",
        *names,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kv-cache-memory-bytes",
        "64M",
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        "--max-num-seqs",
        "2",
        "--structured-outputs-config",
        '{"enable_in_reasoning": true}',
    ]
    if parser:
        args += ["--reasoning-parser", "deepseek_r1"]
    if embed:  # the same weights as an embedding model (vLLM's pooling runner)
        args += ["--runner", "pooling", "--convert", "embed"]
    else:  # a request may ask to be paced (enginepace.py; pooling takes no logits processor)
        args += ["--logits-processors", "enginepace:Pace"]
    if traces is not None:  # vLLM's own spans, over OTLP/HTTP (tests/otlp.py receives them)
        args += ["--otlp-traces-endpoint", f"{traces}/v1/traces"]
    args += extra
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(Path(__file__).parent),  # enginepace.py, for the API server and engine
        "HOME": str(workdir),
        "TMPDIR": str(tmp),
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        **({"VLLM_SERVER_DEV_MODE": "1"} if dev else {}),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    root = f"http://127.0.0.1:{port}"
    return proc, VllmServer(f"{root}/v1", root, names, log)


def _wait_healthy(proc: subprocess.Popen[bytes], server: VllmServer) -> None:
    """Wait, with a deadline, until the server answers /health (or has died)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = server.log.read_text(errors="replace")[-3000:]
            pytest.fail(f"vLLM exited with {proc.returncode} during start-up:\n{tail}")
        try:
            if httpx.get(f"{server.root}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # polling another process's readiness, bounded by the deadline
    pytest.fail(f"vLLM did not answer /health within {START_TIMEOUT_S} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _publishing() -> tuple[str, ...]:
    """Prefix caching, cached tokens in usage and KV events on ports of their own."""
    events, replay = _free_port(), _free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{events}", "replay_endpoint": f"tcp://*:{replay}"}  # fmt: skip
    return ("--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--kv-events-config", json.dumps(config))  # fmt: skip


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[ThreadedReceiver]:
    """Where the parsed server sends its traces (and a test's gateway its own)."""
    receiver = ThreadedReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture(scope="session")
def vllm_servers(
    tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory,
    otlp_receiver: ThreadedReceiver,
) -> Iterator[dict[str, VllmServer]]:  # fmt: skip
    workdir = tmp_path_factory.mktemp("vllm")
    started = [
        _start(
            tiny_model,
            workdir,
            ("tiny-r1-parsed", "tiny-v4-parsed", ROUTE),
            parser=True,
            traces=otlp_receiver.url,
            extra=_publishing(),
            dev=True,
        ),
        _start(
            tiny_model, workdir, (*RAW_NAMES, ROUTE), parser=False, extra=_publishing(), dev=True
        ),
        _start(tiny_model, workdir, ("tiny-embed",), parser=False, embed=True),
    ]
    try:
        for proc, server in started:
            _wait_healthy(proc, server)
        yield {"parsed": started[0][1], "raw": started[1][1], "embed": started[2][1]}
    finally:
        for proc, _ in started:
            _stop(proc)
        sys.stderr.flush()


@pytest.fixture(scope="session")
def routing_servers(vllm_servers: dict[str, VllmServer]) -> list[VllmServer]:
    """Two engines serving ``ROUTE``, each publishing its KV events."""
    return [vllm_servers["parsed"], vllm_servers["raw"]]
