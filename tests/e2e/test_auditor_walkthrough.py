"""The auditor walkthrough of ``docs/auditors.md``, copy-paste: its first ``sh`` block,
extracted and run with bash and curl against a live gateway, ends with the export verified
offline (``test_docs_examples`` leaves this block to this test)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def walkthrough() -> str:
    text = (ROOT / "docs" / "auditors.md").read_text()
    return text.split("```sh\n", 1)[1].split("```", 1)[0]


async def test_the_auditor_walkthrough_runs_as_written(stack_factory: Any, tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed (.ci/run installs it)")
    stack = await stack_factory()
    ask = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "hi"}]}
    client_key = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"{stack.url}/chat/completions", json=ask, headers=client_key)
    assert answer.status_code == 200
    venv = Path(sys.executable).parent  # where `thinkgate` is
    env = {**os.environ, "GW": stack.root, "AUDITOR_KEY": stack.keys["auditor"],
           "REQUEST_ID": answer.headers["x-request-id"],
           "PATH": f"{venv}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    # the gateway runs in this event loop: the shell must not block it
    shell = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", walkthrough(), cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(shell.communicate(), timeout=90)
    assert shell.returncode == 0, err.decode()
    assert "export OK" in out.decode()
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["body"]["content"] and record["request_id"] == answer.headers["x-request-id"]
    proof = json.loads((tmp_path / "proof.json").read_text())
    assert proof["index"] == record["index"] and proof["hashes"] is not None
