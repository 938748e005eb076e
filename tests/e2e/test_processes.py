"""The gateway-process harness itself (``tests.e2e.processes``): a port that another process
took between ``free_port`` and the gateway's bind (what made a fresh-clone CI run fail once)
costs a second start on another port, not the test."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e import processes
from tests.e2e.conftest import ledger_files
from tests.gateway.cli.test_main import free_port


async def test_a_gateway_whose_port_was_taken_starts_again_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()  # accepts connections, never answers: what a client saw in the failed run
    ports = iter([taken.getsockname()[1], free_port()])
    monkeypatch.setattr(processes, "free_port", lambda: next(ports))
    files = ledger_files(tmp_path)
    try:
        async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=1, itl_ms=0))) as sim:
            settings = Settings(upstreams=(f"{sim.url}/v1",),
                                database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
                                **files)  # fmt: skip
            ensure_keys(settings.ledger, create=True)
            async with processes.running_gateway(processes.gateway_env(settings, files)) as gw:
                assert not gw.url.endswith(f":{taken.getsockname()[1]}")
                async with httpx.AsyncClient() as client:
                    assert (await client.get(f"{gw.url}/healthz")).json() == {"status": "ok"}
    finally:
        taken.close()
    with pytest.raises(StopIteration):
        next(ports)  # both were asked for
