"""Files and batches through openai-node (``tests/clients/openai_batches.mjs``, the SDK pinned
in ``tests/clients/package-lock.json``) against the simulator: upload with ``toFile``, create,
poll, download the output matched by ``custom_id``, list with auto-pagination; cancel with the
finished lines kept; a bad line's 400 as the SDK raises it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.side.sim.app import SimConfig
from tests.e2e.agent_clients import CLIENTS, clean_env, run_client
from tests.e2e.conftest import Stack
from tests.e2e.test_responses import expected

NODE_TIMEOUT_S = 40


async def node(stack: Stack, home: Path, scenario: str, **env: str) -> Any:
    if not (CLIENTS / "node_modules" / "openai").is_dir():
        pytest.fail(f"openai-node is not installed: npm ci --prefix {CLIENTS} (make test does it)")
    extra = {"GATEWAY_URL": stack.url, "GATEWAY_ROOT": stack.root,
             "GATEWAY_KEY": stack.keys["visible"], "GATEWAY_MODEL": "deepseek-r1",
             **env}  # fmt: skip
    outcome = await run_client(["node", str(CLIENTS / "openai_batches.mjs"), scenario],
                               clean_env(home, extra), CLIENTS, NODE_TIMEOUT_S)  # fmt: skip
    assert outcome.returncode == 0, (outcome.returncode, outcome.stderr[-4000:])
    return outcome.result()


async def test_upload_create_poll_download(stack_factory: Any, tmp_path: Path) -> None:
    stack = await stack_factory()
    got = await node(stack, tmp_path / "node", "run", LINES="5")
    assert (got["file"]["purpose"], got["file"]["filename"]) == ("batch", "in.jsonl")
    assert got["created"]["status"] == "in_progress"
    done = got["done"]
    assert done["status"] == "completed" and done["metadata"] == {"from": "node"}
    assert done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert done["error_file_id"] is None and got["errors"] == []
    answers = {line["custom_id"]: line["response"] for line in got["output"]}
    assert sorted(answers) == [f"q{i}" for i in range(5)]
    for custom_id, response in answers.items():
        question = f"Question {custom_id[1:]}?"
        assert response["status_code"] == 200
        content = response["body"]["choices"][0]["message"]["content"]
        assert content == "\n\n" + expected(question).answer
    assert got["batches"] == [done["id"]]
    assert set(got["files"]) == {got["file"]["id"], done["output_file_id"]}


async def test_cancel_keeps_the_finished_lines(stack_factory: Any, tmp_path: Path) -> None:
    stack = await stack_factory(sim=SimConfig(ttft_ms=20, itl_ms=40), batch_max_concurrency=1)
    got = await node(stack, tmp_path / "node", "cancel", LINES="12")
    assert got["cancelling"] in ("cancelling", "cancelled")
    done = got["done"]
    assert done["status"] == "cancelled" and done["cancelled_at"] is not None
    assert len(got["output"]) >= 1 and len(got["output"]) + len(got["errors"]) == 12
    assert {e["error"]["code"] for e in got["errors"]} == {"batch_cancelled"}


async def test_a_bad_line_is_the_sdks_400(stack_factory: Any, tmp_path: Path) -> None:
    stack = await stack_factory()
    got = await node(stack, tmp_path / "node", "bad")
    assert got["refused"] and got["status"] == 400
    assert "Line 2" in got["error"]["message"] and got["error"]["param"] == "file"
