"""A request leaves no reference cycle behind: its objects are freed by reference counting as
it ends, not by the cyclic garbage collector.

Each cycle a request leaves costs the collector a traversal of everything it reaches, and
collections more often (a busy gateway ran one every few milliseconds, 5 % of its CPU, and
a full one took milliseconds of every stream's time). So the serving process raises the
collector's threshold (``gateway.app``), which is only safe while requests leave no garbage
of their own. The gateway here is served by uvicorn's httptools protocol, as in production,
in front of the simulator; the collector keeps what it finds (``DEBUG_SAVEALL``) while
the requests run."""

from __future__ import annotations

import gc
from collections import Counter
from pathlib import Path

import httpx

from gateway.app import GC_YOUNG_THRESHOLD, create_app
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig, create_sim_app
from tests.e2e.conftest import ledger_files, make_keys

OURS = ("gateway.", "audit.", "ratelimit.", "uvicorn.")


def _ours(garbage: list[object]) -> Counter[str]:
    """The collected objects made by thinkgate or its server, by type (and coroutine, frame
    or function by the code they run)."""
    found: Counter[str] = Counter()
    for obj in garbage:
        kind = type(obj)
        code = getattr(obj, "cr_code", None) or getattr(obj, "f_code", None) or getattr(
            obj, "__code__", None)  # fmt: skip
        where = code.co_filename if code is not None else kind.__module__
        name = code.co_qualname if code is not None else kind.__qualname__
        module = kind.__module__ if code is None else where
        if any(module.startswith(p) for p in OURS) or any(f"/{p[:-1]}/" in where for p in OURS):
            found[f"{kind.__name__} {name}"] += 1
    return found


async def test_requests_leave_no_reference_cycles(tmp_path: Path) -> None:
    async with BackgroundServer(create_sim_app(SimConfig(ttft_ms=1, itl_ms=1))) as sim:
        settings = Settings(upstreams=(f"{sim.url}/v1",), models_cache_ttl_s=3600,
                            database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
                            **ledger_files(tmp_path))  # fmt: skip
        ensure_keys(settings.ledger, create=True)
        keys = await make_keys(settings)
        async with (
            BackgroundServer(create_app(settings)) as gateway,
            httpx.AsyncClient(
                base_url=gateway.url,
                timeout=30,
                headers={"authorization": f"Bearer {keys['visible']}"},
            ) as client,
        ):

            async def requests() -> None:
                chat: dict[str, object] = {"model": "deepseek-r1", "max_tokens": 8,
                        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
                for stream in (True, False):
                    chat["stream"] = stream
                    answer = await client.post("/v1/chat/completions", json=chat)
                    assert answer.status_code == 200, answer.text
                messages = {"model": "deepseek-r1", "max_tokens": 8, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
                answer = await client.post("/v1/messages", json=messages)
                assert answer.status_code == 200, answer.text
                answer = await client.post("/v1/responses", json={
                    "model": "deepseek-r1", "input": "hi", "stream": True, "max_output_tokens": 8,
                    "store": False})  # fmt: skip
                assert answer.status_code == 200, answer.text

            await requests()  # the first of each: caches, pools and lazy imports fill up
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for _ in range(5):
                    await requests()
                gc.collect()
                left = _ours(gc.garbage)
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
    assert not left, f"reference cycles left by requests: {left.most_common(20)}"


async def test_the_serving_process_freezes_its_start_up_and_collects_less_often(
    tmp_path: Path,
) -> None:
    threshold = gc.get_threshold()
    settings = Settings(upstreams=("http://127.0.0.1:9/v1",), models_cache_ttl_s=3600,
                        database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
                        **ledger_files(tmp_path))  # fmt: skip
    ensure_keys(settings.ledger, create=True)
    try:
        async with BackgroundServer(create_app(settings, freeze_gc=True)) as gateway:
            async with httpx.AsyncClient() as client:  # served: the start-up is over
                assert (await client.get(f"{gateway.url}/healthz")).status_code == 200
            assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *threshold[1:])
            assert gc.get_freeze_count() > 10_000  # the imports and the app, out of its way
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
