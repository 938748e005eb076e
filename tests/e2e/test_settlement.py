"""A failed exchange is charged what the engine produced, not its reservation (issue 28): a 502
before the first byte, and a client that gives up while the engine still queues its request,
leave a 60,000 TPM tenant all but their prompts. Read as a client reads it: the next request's
``x-ratelimit-remaining-tokens`` (after its own reservation). The bucket refills 1,000 tokens a
second, far too slowly to hide a reservation of 20,000 within the seconds these tests take.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import orjson
import pytest

from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import Stack, StackFactory
from tests.waiting import eventually

TPM = 60_000
ASKED = 20_000  # max_tokens of the request that fails
NEXT = 16  # max_tokens of the request that reads the headers


def body(max_tokens: int, stream: bool = False, **sim: object) -> dict[str, object]:
    """A chat request; ``sim`` scripts the simulator for it (``gateway.side.sim.request``)."""
    return {"model": "deepseek-r1", "max_tokens": max_tokens, "stream": stream, "sim": sim,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip


def prompt(request: dict[str, object]) -> int:
    """About the prompt estimate (bytes / 4) of ``request`` as the gateway sends it."""
    return len(orjson.dumps(request)) // 4 + 8


async def charged(client: httpx.AsyncClient) -> int:
    """What the tenant's budget lacks, besides this probe's own reservation."""
    response = await client.post("/v1/chat/completions", json=body(NEXT))
    assert response.status_code == 200, response.text
    left = int(response.headers["x-ratelimit-remaining-tokens"])
    return TPM - left - (prompt(body(NEXT)) + NEXT)


Limited = Callable[[], Awaitable[tuple[Stack, httpx.AsyncClient]]]


@pytest.fixture
async def tenant_limited(stack_factory: StackFactory) -> AsyncIterator[Limited]:
    clients: list[httpx.AsyncClient] = []

    async def make() -> tuple[Stack, httpx.AsyncClient]:
        stack: Stack = await stack_factory(sim=SimConfig(), tenants={"acme": {"tpm": TPM}})
        auth = {"authorization": f"Bearer {stack.keys['visible']}"}
        clients.append(httpx.AsyncClient(base_url=stack.root, headers=auth, timeout=30))
        return stack, clients[-1]

    yield make
    for client in clients:
        await client.aclose()


async def test_a_502_before_the_first_byte_charges_the_prompt_alone(
    tenant_limited: Limited,
) -> None:
    _, client = await tenant_limited()
    failing = body(ASKED, fail="error")  # the engine answers 500 at once
    response = await client.post("/v1/chat/completions", json=failing)
    assert response.status_code == 502, response.text
    assert await charged(client) <= 2 * prompt(failing)  # not ~20,000


async def test_a_client_that_gives_up_while_the_engine_queues_is_charged_its_prompt(
    tenant_limited: Limited,
) -> None:
    stack, client = await tenant_limited()
    assert stack.sim is not None
    sim = stack.sim.sim
    queued = body(ASKED, True, ttft_ms=60_000)  # a minute before its first token
    asking = asyncio.create_task(client.post("/v1/chat/completions", json=queued))
    await eventually(lambda: any(r.get("max_tokens") == ASKED for r in sim.received))
    asking.cancel()  # the client gives up before any byte of the answer: its connection closes
    with contextlib.suppress(asyncio.CancelledError):
        await asking
    bound = 2 * prompt(queued) + 4 * (prompt(body(NEXT)) + NEXT)  # and the probes' own use

    async def refunded() -> bool:  # settled once the gateway saw the client leave
        return await charged(client) <= bound

    await eventually(refunded, within_s=5, every=0.05)
