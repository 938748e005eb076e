"""A shred is a barrier (issue 39): two real replica processes on PostgreSQL, each with the
tenant's sealing key cached; 6 times in a row the tenant is shredded (by the CLI, from another
process, and by the admin API of either replica, in turn), at once served on a replica (in
turn), and that request's record read back by an auditor: readable every time (before the
barrier, the record was ``destroyed`` 10 times out of 10 on one gateway). The three ways to
shred, each followed by a request on either replica, are six combinations: 6 rounds try each
once (a lost barrier failed every try; twice each took the suite 14 s more on a busy machine)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.side.sim.app import SimConfig
from tests.e2e.processes import run_cli
from tests.e2e.test_replica_faults import (  # noqa: F401 - the fixture
    Cluster,
    ClusterFactory,
    cluster_factory,
)
from tests.waiting import eventually

pytestmark = [pytest.mark.xdist_group("private_postgres"), pytest.mark.timeout(150)]

ROUNDS = 6  # every combination of the turns once (see above)
TENANT = "acme"  # the "visible" key's, and the "auditor" key's


async def serve(cluster: Cluster, url: str) -> str:
    """One whole chat completion of the tenant's on ``url``; its request id."""
    body = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "shred?"}],
            "max_tokens": 8}  # fmt: skip
    headers = {"authorization": f"Bearer {cluster.keys['visible']}"}
    async with httpx.AsyncClient(timeout=20) as http:
        answered = await http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    assert answered.status_code == 200, answered.text
    return answered.headers["x-request-id"]


async def keep_serving(cluster: Cluster, url: str, stop: asyncio.Event) -> None:
    """The tenant's requests on ``url``, one after another, until ``stop``."""
    while not stop.is_set():
        await serve(cluster, url)


async def shred(cluster: Cluster, round_: int) -> None:
    """By the CLI, then the admin API of replica 0, then of replica 1, in turn."""
    if round_ % 3 == 0:
        code, output = await run_cli(cluster.env, "ledger", "shred", "--tenant", TENANT,
                                     cwd=str(cluster.tmp))  # fmt: skip
        assert code == 0, output
        return
    admin = {"authorization": f"Bearer {cluster.keys['admin']}"}
    url = cluster.gateways[round_ % 3 - 1].url
    async with httpx.AsyncClient(timeout=20, headers=admin) as http:
        done = await http.post(f"{url}/admin/v1/shred/{TENANT}", json={"confirm": TENANT})
    assert done.status_code == 200, done.text
    assert done.json()["object"] == "shred" and done.json()["destroyed_keys"] >= 1


async def body_of(cluster: Cluster, request_id: str) -> dict[str, object]:
    """The record of ``request_id`` as the auditor API opens it."""
    auditor = {"authorization": f"Bearer {cluster.keys['auditor']}"}
    async with httpx.AsyncClient(base_url=cluster.gateways[0].url, headers=auditor) as http:

        async def listed() -> list[dict[str, object]]:
            found = await http.get("/audit/v1/records", params={"request_id": request_id})
            return list(found.json()["data"])

        [row] = await eventually(listed, within_s=10)
        opened = await http.get(f"/audit/v1/records/{row['index']}")
    assert opened.status_code == 200, opened.text
    return dict(opened.json())


async def test_a_request_served_at_once_after_a_shred_is_always_readable(
    cluster_factory: ClusterFactory,  # noqa: F811
) -> None:
    cluster = await cluster_factory(sim=SimConfig(ttft_ms=0, itl_ms=0))
    async with asyncio.TaskGroup() as background:
        # the tenant is served on both replicas all along: each holds a sealing key it read
        # well within the last second whenever a shred commits (the condition of the race)
        stop = asyncio.Event()
        for gateway in cluster.gateways:
            background.create_task(keep_serving(cluster, gateway.url, stop))
        try:
            for round_ in range(ROUNDS):
                await shred(cluster, round_)
                # each way to shred followed by a request on either replica
                request_id = await serve(cluster, cluster.gateways[round_ // 3 % 2].url)
                opened = await body_of(cluster, request_id)
                assert opened["body_status"] == "ok" and opened["body"], (round_, opened)
        finally:
            stop.set()
    code, output = await run_cli(cluster.env, "ledger", "verify", cwd=str(cluster.tmp))
    assert code == 0, output


async def test_the_admin_shred_needs_the_tenant_confirmed_and_an_admin(
    cluster_factory: ClusterFactory,  # noqa: F811
) -> None:
    cluster = await cluster_factory()
    url = f"{cluster.gateways[0].url}/admin/v1/shred/{TENANT}"
    async with httpx.AsyncClient(timeout=20) as http:
        admin = {"authorization": f"Bearer {cluster.keys['admin']}"}
        wrong = await http.post(url, json={"confirm": "globex"}, headers=admin)
        client = {"authorization": f"Bearer {cluster.keys['visible']}"}
        not_admin = await http.post(url, json={"confirm": TENANT}, headers=client)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "confirm"
    assert not_admin.status_code == 403
