"""The bare-metal layout (``deploy/baremetal/``): two 8-GPU nodes without Kubernetes, Ray head
and worker, DeepSeek-R1 at TP 8 x PP 2. The scripts pass ``shellcheck``; ``vllm serve``'s flags
are parsed by vLLM's own argument parser (the CPU build in ``.venv-vllm``) and say what the
Kubernetes overlay ``r1-2x8xh100`` says; the gateway's systemd unit is sound."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "deploy" / "baremetal"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
ns = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "m", *sys.argv[1:]])
print(json.dumps(vars(ns), default=str))
"""


def _needed(tool: str, path: str | None) -> str:
    """The tool's path; without it the test fails, saying how to get it (never a skip: ``make
    test`` builds the vLLM environment and ``.ci/run`` installs shellcheck)."""
    if path is None:
        pytest.fail(f"{tool} is not installed (.ci/run installs shellcheck; make vllm the vLLM "
                    "environment)")  # fmt: skip
    return path


def test_the_scripts_pass_shellcheck() -> None:
    shellcheck = _needed("shellcheck", shutil.which("shellcheck"))
    scripts = sorted(HERE.glob("*.sh"))
    assert {s.name for s in scripts} >= {"ray-head.sh", "ray-worker.sh", "vllm-serve.sh"}
    done = subprocess.run([shellcheck, "-x", *map(str, scripts)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout
    for script in scripts:
        if script.name != "env.sh":
            assert os.access(script, os.X_OK), f"{script.name} is not executable"


def engine_kwargs() -> dict[str, Any]:
    text = (ROOT / "deploy/k8s/overlays/r1-2x8xh100/rayservice.yaml").read_text()
    service = next(d for d in yaml.safe_load_all(text) if d and d.get("kind") == "RayService")
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    kwargs: dict[str, Any] = app["args"]["llm_configs"][0]["engine_kwargs"]
    return kwargs


def test_vllms_own_parser_takes_the_flags_and_they_match_the_kubernetes_overlay() -> None:
    python = _needed("the vLLM environment", str(VLLM_PYTHON) if VLLM_PYTHON.exists() else None)
    script = ["bash", str(HERE / "vllm-serve.sh"), "--print-args"]
    # one flag or value per line: a JSON value (--kv-events-config) holds spaces
    flags = subprocess.run(script, capture_output=True, text=True, check=True).stdout.splitlines()
    parsed = subprocess.run([python, "-c", PARSE, *flags], capture_output=True, text=True,
                            check=False, timeout=120,
                            env={**os.environ, "VLLM_NO_USAGE_STATS": "1"})  # fmt: skip
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    args = json.loads(parsed.stdout.strip().splitlines()[-1])
    assert args["distributed_executor_backend"] == "ray"
    for name, value in engine_kwargs().items():
        assert str(args[name]) == str(value), (name, args[name], value)


def test_the_gateways_unit_reloads_keys_and_does_not_loop_on_its_own_mistakes() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(HERE / "thinkgate.service")
    service = unit["Service"]
    assert service["ExecStart"].split()[1:3] == ["serve", "--host"]
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # reads the ledger key file again
    assert set(service["RestartPreventExitStatus"].split()) == {"2", "3", "4", "5"}
    assert service["Restart"] == "on-failure" and unit["Install"]["WantedBy"]
