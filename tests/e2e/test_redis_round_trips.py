"""The Redis cost of a request through the real gateway: its admission (rate limits of key and
tenant, KV budget) is one round trip, and so is its settlement (refund and release)."""

from __future__ import annotations

from pathlib import Path

import httpx

from gateway.app import create_app
from gateway.cli.keys import open_store
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings, TenantPolicy
from gateway.side.sim.app import SimConfig, create_sim_app
from ratelimit.autopipe import AutoPipeline
from tests.e2e.conftest import ledger_files


class Recorder:
    """Records, per round trip of the gateway's one Redis client, the commands it carried."""

    def __init__(self, pipe: AutoPipeline) -> None:
        self.batches: list[list[str]] = []
        send = pipe._send

        async def recording() -> None:  # the flush's task: it sends what is pending as it starts
            self.batches.append([str(command[0]) for command, _ in pipe._pending])
            await send()

        pipe._send = recording  # type: ignore[method-assign]


async def test_admission_and_settlement_are_one_round_trip_each(
    tmp_path: Path, redis_url: str
) -> None:
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=1, itl_ms=0))) as sim:
        settings = Settings(
            upstreams=(f"{sim.url}/v1",),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
            redis_url=redis_url,
            kv_capacity_tokens=1_000_000,  # known at once: every request reserves KV budget
            tenants={"acme": TenantPolicy(rpm=1000, tpm=1_000_000)},
            models_cache_ttl_s=3600,
            **ledger_files(tmp_path),
        )
        ensure_keys(settings.ledger, create=True)
        async with open_store(settings) as store:
            key = (await store.create(tenant="acme", role="client", rpm=100, tpm=100_000))[0]
        app = create_app(settings)
        async with BackgroundServer(app) as gateway, httpx.AsyncClient() as client:
            headers = {"authorization": f"Bearer {key.secret}"}
            body = {"model": "deepseek-r1", "max_tokens": 8,
                    "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
            url = f"{gateway.url}/v1/chat/completions"
            assert (await client.post(url, json=body, headers=headers)).status_code == 200
            recorder = Recorder(app.framework.state.tg.redis)  # type: ignore[attr-defined]
            for stream in (False, True):
                recorder.batches.clear()
                response = await client.post(url, json={**body, "stream": stream}, headers=headers)
                assert response.status_code == 200
                assert response.headers["x-ratelimit-limit-requests"] == "100"
                # admission: rate-limit script + KV script; settlement: refund + release
                assert recorder.batches == [["EVALSHA", "EVALSHA"], ["EVALSHA", "EVALSHA"]]
