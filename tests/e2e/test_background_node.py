"""Background responses through openai-node (``tests/clients/openai_background.mjs``, the SDK
pinned in ``tests/clients/package-lock.json``) against the simulator: create → poll to the
simulator's answer, a stream left after a few events and resumed with ``starting_after`` (the
same events as the whole replay), and cancel (the engine's request aborted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.side.sim.app import SimConfig
from tests.e2e.agent_clients import CLIENTS, clean_env, run_client
from tests.e2e.conftest import Stack
from tests.e2e.test_background import SLOW
from tests.e2e.test_responses import expected

MODEL = "deepseek-r1"
NODE_TIMEOUT_S = 30
CUT_AFTER = 5  # events read before the SDK leaves the live stream


async def node(stack: Stack, home: Path, scenario: str, **env: str) -> Any:
    """Runs the script's ``scenario`` with the visible key; the JSON it printed."""
    if not (CLIENTS / "node_modules" / "openai").is_dir():
        pytest.fail(f"openai-node is not installed: npm ci --prefix {CLIENTS} (make test does it)")
    extra = {"GATEWAY_URL": stack.url, "GATEWAY_ROOT": stack.root,
             "GATEWAY_KEY": stack.keys["visible"], "GATEWAY_MODEL": MODEL, **env}  # fmt: skip
    script = CLIENTS / "openai_background.mjs"
    outcome = await run_client(
        ["node", str(script), scenario], clean_env(home, extra), CLIENTS, NODE_TIMEOUT_S
    )
    assert outcome.returncode == 0, (outcome.returncode, outcome.stderr[-4000:])
    return outcome.result()


async def test_created_queued_then_polled_to_the_simulators_answer(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await stack_factory(sim=SimConfig(itl_ms=5))
    got = await node(stack, tmp_path / "node", "poll")
    assert got["queued"]["status"] == "queued" and got["queued"]["background"] is True
    order = ["queued", "in_progress", "completed"]
    assert got["statuses"] == sorted(got["statuses"], key=order.index), got  # never back
    assert got["statuses"][-1] == got["status"] == "completed", got
    assert got["outputTypes"] == ["reasoning", "message"]
    assert got["outputText"] == "\n\n" + expected("Why?").answer


async def test_a_stream_left_after_n_events_resumes_to_the_whole_replay(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await stack_factory(sim=SimConfig(itl_ms=5))
    got = await node(stack, tmp_path / "node", "resume", CUT_AFTER=str(CUT_AFTER))
    joined, whole = got["events"]["cutResumed"], got["events"]["whole"]
    assert got["cut"] == list(range(CUT_AFTER)) and len(joined) > CUT_AFTER + 10
    assert got["numbers"]["cutResumed"] == list(range(len(joined)))
    assert got["numbers"]["whole"] == got["numbers"]["cutResumed"]
    assert joined == whole  # deep equality: every field of every event
    types = [event["type"] for event in whole]
    assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert types[-1] == "response.completed"
    final = whole[-1]["response"]
    assert final["id"] == got["id"] and final["background"] is True
    texts = [c["text"] for item in final["output"] if item["type"] == "message"
             for c in item["content"]]  # fmt: skip
    assert "".join(texts) == "\n\n" + expected("Why?").answer


async def test_cancel_aborts_the_engine_request(stack_factory: Any, tmp_path: Path) -> None:
    stack = await stack_factory(sim=SLOW)
    assert stack.sim is not None
    got = await node(stack, tmp_path / "node", "cancel")
    assert got["statuses"] == ["queued", "in_progress"], got  # it ran: the engine had it
    assert (got["cancelled"], got["retrieved"]) == ("cancelled", "cancelled"), got
    await stack.sim.sim.wait_for(lambda s: s.cancelled == 1, timeout=5)
    assert stack.sim.sim.completed == 0
