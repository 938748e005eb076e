"""The fault matrix of issue 28: two gateway replicas (real ``thinkgate serve`` processes) on
one PostgreSQL and one Redis of the test's own, with a simulator behind them and clients in
front, while one part of the system fails: a replica (kill -9), the ledger's keys (KEK rotation,
a tenant shred), Redis, PostgreSQL, and the clients themselves (disconnects at every stage).

Every case asserts what the clients saw, then the same three things of the ledger:

- every response a client completed (a whole 200, or a stream that ended in ``[DONE]`` /
  ``message_stop`` with no ``error`` event) has exactly one record, found by its
  ``x-request-id`` in ``request_id``; no request id is recorded twice;
- the leaf indexes are contiguous (0 … n-1): replicas that died, spooled or raced for the
  sequencer left no hole;
- ``thinkgate ledger verify`` passes.

PostgreSQL is ``tests/pgserver.py`` (killed with SIGKILL, started again on the same port);
Redis a private ``redis-server`` (``tests/e2e/test_rate_limits.py``), killed and started again
on the same port. Each replica has its own spool file, as each pod has its own disk; a replica
started again after a kill gets the dead one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Executable, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from audit.datakeys import ACTIVE_TTL_S
from audit.schema import data_keys, entries
from gateway.cli.keys import open_store
from gateway.db import create_engine
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from gateway.side.sim.app import SimApp, SimConfig, create_sim_app
from gateway.side.sim.state import SimState
from ratelimit.kvbudget import RedisKVBudgetStore
from tests.e2e.conftest import ledger_files, make_keys
from tests.e2e.load import (
    CHAT,
    MESSAGES,
    BodyTap,
    Load,
    RawRequest,
    Result,
    Target,
    request_body,
    send,
    summary,
)
from tests.e2e.processes import Gateway, gateway_env, run_cli, running_gateway, running_gateways
from tests.e2e.test_rate_limits import limit_keys, redis_server
from tests.pgserver import PgServer, stable_port
from tests.waiting import eventually

# One worker runs them all: one initdb, and no two of these (each two gateways, a simulator,
# a PostgreSQL and a Redis) compete for the same two cores.
pytestmark = [pytest.mark.xdist_group("private_postgres"), pytest.mark.timeout(100)]

# ~200 ms a request (first token after 50 ms, 16 tokens 10 ms apart): streams are in flight
# whenever something fails, and a client sends some five requests a second (the load stays
# light: these share two cores with the rest of the suite).
PACED = SimConfig(ttft_ms=50, itl_ms=10)
TPM_LIMIT = 40_000  # the "tpm" key's; refills 667 tokens a second
REDIS_OUTAGE_S = 3.0  # longer than the circuit's retry (1 s): Redis is tried and found dead again
PG_OUTAGE_S = 10.0


@dataclass
class Cluster:
    tmp: Path
    pg: PgServer
    database_url: str
    redis_port: int
    redis_proc: subprocess.Popen[bytes]  # the running redis-server
    sim: SimApp
    tap: BodyTap
    engine_url: str
    env: dict[str, str]  # the replicas' common settings (also the CLI's)
    keys: dict[str, str]  # name -> secret
    gateways: list[Gateway]
    exits: AsyncExitStack

    def replica_env(self, index: int) -> dict[str, str]:
        """Replica ``index``'s settings: the common ones and a spool file of its own."""
        return {**self.env, "THINKGATE_AUDIT_SPOOL_FILE": str(self.tmp / f"spool-{index}.log")}

    async def start_replica(self, index: int) -> Gateway:
        """Replica ``index`` (again): a new process, on a new port, with that replica's spool."""
        gateway = await self.exits.enter_async_context(running_gateway(self.replica_env(index)))
        self.gateways[index] = gateway
        return gateway

    async def raw(self, url: str, key: str, body: Any, request_id: str,
                  upload: int | None = None) -> RawRequest:  # fmt: skip
        """``RawRequest.send`` with ``key``'s secret; closed at the latest when the test ends."""
        request = await RawRequest.send(url, self.keys[key], body, request_id, upload)
        self.exits.push_async_callback(request.close)
        return request

    def kill_redis(self) -> None:
        self.redis_proc.kill()
        self.redis_proc.wait()

    async def start_redis(self) -> None:
        """Redis again, empty, on the same port."""
        _, self.redis_proc = await self.exits.enter_async_context(redis_server(self.redis_port))

    async def rows(self, query: Executable) -> list[Any]:
        """``query``'s rows in the cluster's database, on an engine of the test's own."""
        engine = create_engine(self.database_url)
        try:
            async with engine.connect() as conn:
                return list((await conn.execute(query)).all())
        finally:
            await engine.dispose()

    async def ledger(self) -> list[Any]:
        query = select(entries.c.idx, entries.c.request_id, entries.c.status,
                       entries.c.tenant, entries.c.kind)  # fmt: skip
        return await self.rows(query.order_by(entries.c.idx))

    async def data_keys(self) -> list[Any]:
        return await self.rows(select(data_keys.c.tenant, data_keys.c.kek_id, data_keys.c.wrapped))

    async def assert_ledger(self, results: Iterable[Result]) -> list[Any]:
        """Every completed response recorded exactly once, no request id twice, contiguous
        indexes, and ``thinkgate ledger verify`` passes. The rows, for further checks."""
        rows = await self.ledger()
        recorded = Counter(row.request_id for row in rows)
        completed = [r.request_id for r in results if r.completed]
        assert all(completed), "a completed response had no x-request-id"
        missing = [rid for rid in completed if not recorded[rid]]
        assert not missing, (f"{len(missing)} of {len(completed)} completed responses have "
                             f"no record, e.g. {missing[:3]}")  # fmt: skip
        twice = {rid: n for rid, n in recorded.items() if n > 1}
        assert not twice, f"recorded more than once: {twice}"
        assert [row.idx for row in rows] == list(range(len(rows))), "the indexes have a hole"
        code, output = await run_cli(self.env, "ledger", "verify", cwd=str(self.tmp))
        assert code == 0, output
        return rows


async def more_keys(settings: Settings) -> dict[str, str]:
    """Keys besides ``make_keys``': rate-limited ones, and one no request uses before a fault."""
    async with open_store(settings) as store:
        made = {
            "limited": await store.create(
                tenant="acme", role="client", rpm=1_000_000, tpm=1_000_000_000
            ),
            "tpm": await store.create(tenant="initech", role="client", tpm=TPM_LIMIT),
            "unseen": await store.create(tenant="acme", role="client", reasoning="visible"),
            # 3 RPM: a bucket that stays in Redis for 20 s after one request (a larger limit
            # refills, and its key expires, within milliseconds)
            "rpm3": await store.create(tenant="acme", role="client", rpm=3),
        }
    return {name: new.secret for name, (new, _) in made.items()}


async def admin_execute(pg: PgServer, statement: str) -> None:
    """One statement outside a transaction (``CREATE``/``DROP DATABASE``), as the superuser."""
    engine = create_async_engine(pg.url(), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def database_in(pg: PgServer) -> AsyncIterator[str]:
    """A database of the test's own in ``pg``; dropped afterwards (``pg`` started again first
    if the test left it killed)."""
    if not pg.running:
        await asyncio.to_thread(pg.start)
    name = f"tg_faults_{secrets.token_hex(6)}"
    await admin_execute(pg, f'CREATE DATABASE "{name}"')
    try:
        yield pg.url(name)
    finally:
        if not pg.running:
            await asyncio.to_thread(pg.start)
        await admin_execute(pg, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


ClusterFactory = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def cluster_factory(
    private_postgres: PgServer, tmp_path: Path
) -> AsyncIterator[ClusterFactory]:
    """``await cluster_factory(sim=SimConfig(...), **env)``: a database, Redis, the simulator,
    keys, and two replicas serving (``replicas``: each one's own settings besides)."""
    async with AsyncExitStack() as exits:

        async def factory(sim: SimConfig = PACED,
                          replicas: tuple[dict[str, str], ...] = ({}, {}),
                          **extra_env: str) -> Cluster:  # fmt: skip
            database_url = await exits.enter_async_context(database_in(private_postgres))
            port, proc = await exits.enter_async_context(redis_server(stable_port()))
            sim_app = create_sim_app(sim)
            tap = BodyTap(sim_app)
            engine = await exits.enter_async_context(BackgroundServer(tap))
            files: dict[str, Any] = {**ledger_files(tmp_path)}
            settings = Settings(upstreams=(f"{engine.url}/v1",), database_url=database_url,
                                redis_url=f"redis://127.0.0.1:{port}/0", **files)  # fmt: skip
            ensure_keys(settings.ledger, create=True)
            keys = {**await make_keys(settings), **await more_keys(settings)}
            env = {**gateway_env(settings, files), "THINKGATE_REDIS_URL": settings.redis_url,
                   **extra_env}  # fmt: skip
            cluster = Cluster(tmp_path, private_postgres, database_url, port, proc, sim_app, tap,
                              f"{engine.url}/v1", env, keys, [], exits)  # fmt: skip
            envs = [cluster.replica_env(i) | own for i, own in enumerate(replicas)]
            cluster.gateways = await exits.enter_async_context(running_gateways(envs))
            return cluster

        yield factory


async def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``, at a replica."""
    async with httpx.AsyncClient(timeout=10) as client:
        exposition = (await client.get(f"{url}/metrics")).text
    return sum(s.value for f in text_string_to_metric_families(exposition) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())  # fmt: skip


# -- a. kill -9 of one replica ---------------------------------------------------------------


async def test_kill_9_of_one_replica_under_load(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory()
    first, second = cluster.gateways
    both = [Target(first.url, "visible"), Target(second.url, "visible"),
            Target(first.url, "other"), Target(second.url, "hidden")]  # fmt: skip
    held_body = {**request_body(True, max_tokens=400), "sim": {"itl_ms": 25}}  # ~10 s long
    async with Load(cluster.keys, both, concurrency=6) as load:
        await load.served(10, url=first.url)
        await load.served(10, url=second.url)
        held = await cluster.raw(first.url, "visible", held_body, f"held-{secrets.token_hex(4)}")
        await held.read_events(1)  # in flight for sure, besides the load's
        killed_at = time.monotonic()
        await first.kill_9()
        load.targets = [Target(second.url, "visible"), Target(second.url, "other")]
        await load.served(20, since=killed_at, url=second.url)  # the other keeps serving
        restarted = await cluster.start_replica(0)  # the killed one, again, with its spool
        restarted_at = time.monotonic()
        load.targets = [*load.targets, Target(restarted.url, "visible"),
                        Target(restarted.url, "hidden")]  # fmt: skip
        await load.served(10, since=restarted_at, url=restarted.url)
    results = load.results

    # What the clients saw: the killed replica's requests in flight were cut (a stream after
    # its first chunks: no [DONE], no error event, the connection simply ends); nothing else
    # failed, on the replica that stayed or on the one started again.
    await held.read_to_end()
    assert b"data: [DONE]" not in held.received and b"event: error" not in held.received
    cut = [r for r in results if r.target.url == first.url and not r.completed]
    assert all(r.status in (None, 200) for r in cut), summary(cut)
    others = [r for r in results if r.target.url != first.url]
    assert all(r.completed for r in others), summary(r for r in others if not r.completed)
    await cluster.assert_ledger(results)


# -- b. KEK rotation and a tenant shred --------------------------------------------------------


async def test_kek_rotation_and_a_shred_under_load(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory()
    first, second = cluster.gateways
    mixed = [Target(first.url, "visible"), Target(second.url, "other"),
             Target(first.url, "other"), Target(second.url, "hidden")]  # fmt: skip
    async with Load(cluster.keys, mixed, concurrency=6) as load:
        for gateway in cluster.gateways:
            await load.served(5, url=gateway.url, key="other")
        code, output = await run_cli(cluster.env, "ledger", "rotate-kek", cwd=str(cluster.tmp))
        assert code == 0, output
        rotated_at = time.monotonic()
        for gateway in cluster.gateways:
            await load.served(5, since=rotated_at, url=gateway.url)
        code, output = await run_cli(cluster.env, "ledger", "shred", "--tenant", "globex",
                                     cwd=str(cluster.tmp))  # fmt: skip
        assert code == 0, output
        shredded_at = time.monotonic()
        # past the data-key cache: each replica has looked the tenant's key up again
        for gateway in cluster.gateways:
            await load.served(5, since=shredded_at + ACTIVE_TTL_S, url=gateway.url, key="other")
    results = load.results

    # The other tenant (acme) never noticed; the shredded one (globex) never saw a 500, and
    # was served normally as soon as the shred was done.
    acme = [r for r in results if r.target.key != "other"]
    assert all(r.completed for r in acme), summary(r for r in acme if not r.completed)
    globex = [r for r in results if r.target.key == "other"]
    assert all(r.status != 500 for r in globex), summary(globex)
    after = [r for r in globex if r.began >= shredded_at]
    assert all(r.completed for r in after), summary(r for r in after if not r.completed)

    rows = await cluster.assert_ledger(results)
    # The shredded tenant's new requests are recorded, after its signed shred record.
    [shred] = [row for row in rows if row.kind == "shred"]
    assert shred.tenant == "globex"
    later = {row.request_id for row in rows if row.idx > shred.idx and row.tenant == "globex"}
    assert {r.request_id for r in after} <= later
    # Every live data key is wrapped under the new primary KEK (the rotation's re-wrap, and
    # the key made for globex after its shred); globex's old keys are gone.
    primary = json.loads((cluster.tmp / "ledger-keys.json").read_text())["primary"]
    live = [k for k in await cluster.data_keys() if k.wrapped is not None]
    assert {k.tenant for k in live} >= {"acme", "globex"}
    assert all(k.kek_id == primary for k in live), [(k.tenant, k.kek_id) for k in live]
    assert len([k for k in live if k.tenant == "globex"]) >= 1


# -- c. Redis away for a few seconds ---------------------------------------------------------


async def test_a_redis_outage_under_load_fails_open(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory()
    first, second = cluster.gateways
    limited = [Target(first.url, "limited"), Target(second.url, "limited"),
               Target(first.url, "visible"), Target(second.url, "other")]  # fmt: skip
    async with Load(cluster.keys, limited, concurrency=6) as load:
        await load.served(10, url=first.url)
        await load.served(10, url=second.url)
        probes = [await assert_limits_in_redis(cluster, first)]  # the limits live in Redis
        cluster.kill_redis()
        killed_at = time.monotonic()

        def outage_served() -> bool:  # both replicas served through the whole outage
            return time.monotonic() - killed_at >= REDIS_OUTAGE_S and all(
                len(load.completed(killed_at, g.url)) >= 10 for g in cluster.gateways)  # fmt: skip

        await eventually(outage_served, within_s=30)
        for gateway in cluster.gateways:  # the alert's gauge says so
            assert await metric(gateway.url, "thinkgate_ratelimit_fallback_active",
                                backend="rate_limits") == 1  # fmt: skip
        await cluster.start_redis()
        back_at = time.monotonic()

        async def shared_again() -> bool:  # both replicas' circuits closed again
            gauges = [await metric(g.url, "thinkgate_ratelimit_fallback_active",
                                   backend="rate_limits") for g in cluster.gateways]  # fmt: skip
            return not any(gauges)

        await eventually(shared_again, within_s=15, every=0.1)
        probes.append(await assert_limits_in_redis(cluster, second))
        await load.served(10, since=back_at, url=first.url)
        await load.served(10, since=back_at, url=second.url)
    results = load.results
    assert all(r.completed for r in results), summary(r for r in results if not r.completed)
    await cluster.assert_ledger([*results, *probes])


async def assert_limits_in_redis(cluster: Cluster, gateway: Gateway) -> Result:
    """A request of the 3 RPM key through ``gateway`` leaves its bucket in Redis."""
    async with httpx.AsyncClient(timeout=30) as client:
        result = await send(client, Target(gateway.url, "rpm3"), cluster.keys["rpm3"], False)
    assert result.completed, result.detail
    assert await limit_keys(cluster.redis_port)
    return result


# -- d. PostgreSQL away for ~10 s ------------------------------------------------------------


def assert_database_unavailable(result: Result) -> None:
    """503 with ``retry-after``, in the endpoint's own error shape."""
    assert result.status == 503, (result.status, result.detail)
    assert int(result.headers["retry-after"]) >= 1
    body = json.loads(result.body or result.detail)
    if result.target.path == MESSAGES:  # Anthropic's shape
        assert body["type"] == "error" and set(body) == {"type", "error"}, body
        assert body["error"]["type"] == "overloaded_error", body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    else:  # OpenAI's
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["code"] == "database_unavailable", body


async def probe(
    cluster: Cluster, key: str, paths: Iterable[str] = (CHAT, MESSAGES)
) -> list[Result]:
    """One whole request with ``key`` on each path, to each replica."""
    async with httpx.AsyncClient(timeout=30) as client:
        return [await send(client, Target(g.url, key, path), cluster.keys[key], stream=False)
                for g in cluster.gateways for path in paths]  # fmt: skip


async def probe_until_served(cluster: Cluster, key: str) -> list[Result]:
    """Probes (chat) until both replicas serve ``key``, 15 s at most; every probe's result."""
    results: list[Result] = []

    async def served() -> bool:
        latest = await probe(cluster, key, (CHAT,))
        results.extend(latest)
        return all(r.completed for r in latest)

    with contextlib.suppress(TimeoutError):  # the caller asserts on what came back
        await eventually(served, within_s=15, every=0.2)
    return results


async def wait_recorded(cluster: Cluster, results: Iterable[Result], within_s: float) -> None:
    """Until every completed response's record is in the database (a spool drained)."""
    answered = {r.request_id for r in results if r.completed}

    missing: set[str | None] = set()

    async def recorded() -> bool:
        missing.clear()
        missing.update(answered - {row.request_id for row in await cluster.ledger()})
        return not missing

    try:
        await eventually(recorded, within_s=within_s, every=0.2)
    except TimeoutError:
        spooled = [await metric(g.url, "thinkgate_ledger_spool_records") for g in cluster.gateways]
        raise AssertionError(f"{len(missing)} of {len(answered)} answered requests have no "
                             f"record after {within_s} s (spools: {spooled}), e.g. "
                             f"{sorted(map(str, missing))[:3]}") from None  # fmt: skip


async def test_a_postgres_outage_under_load(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory(sim=SimConfig(ttft_ms=100, itl_ms=20))  # ~400 ms
    seen = [Target(g.url, key, path) for g in cluster.gateways for key in ("visible", "other")
            for path in (CHAT, MESSAGES)]  # fmt: skip
    async with Load(cluster.keys, seen, concurrency=16) as load:
        # every seen key's lookup is cached on both replicas before the database goes
        for target in seen:
            await load.served(2, url=target.url, key=target.key, path=target.path)
        cluster.pg.kill()
        killed_at = time.monotonic()
        unseen_during = await probe(cluster, "unseen")

        def outage_served() -> bool:
            return time.monotonic() - killed_at >= PG_OUTAGE_S and all(
                len(load.completed(killed_at, g.url)) >= 20 for g in cluster.gateways)  # fmt: skip

        with contextlib.suppress(TimeoutError):  # what the clients saw is asserted below
            await eventually(outage_served, within_s=PG_OUTAGE_S + 10)
        during = [r for r in load.results if r.began >= killed_at]
        # the records of what they served meanwhile wait in each replica's spool
        spooled = [await metric(g.url, "thinkgate_ledger_spool_records") for g in cluster.gateways]
        await asyncio.to_thread(cluster.pg.start)  # the gateways stay as they are
        back_at = time.monotonic()
        unseen_after = await probe_until_served(cluster, "unseen")
        for gateway in cluster.gateways:
            await load.served(10, since=back_at, url=gateway.url)
    results = load.results
    everything = [*results, *unseen_during, *unseen_after]

    # Zero 500s, from anything.
    failed = [r for r in everything if r.status == 500]
    assert not failed, summary(failed)
    # Keys seen before the outage were served through it (and after), whole.
    assert len(during) >= 40, summary(during)
    assert all(r.completed for r in results), summary(r for r in results if not r.completed)
    assert all(spooled), spooled
    # A key never seen: 503 database_unavailable with retry-after, in each endpoint's shape,
    # while the database is away; served once it is back (refused the same way meanwhile).
    for result in unseen_during:
        assert_database_unavailable(result)
    assert all(r.completed for r in unseen_after[-2:]), summary(unseen_after)
    for result in unseen_after:
        if not result.completed:
            assert_database_unavailable(result)

    # Every answered request's record reaches the database once the spools drain.
    await wait_recorded(cluster, everything, within_s=30)
    for gateway in cluster.gateways:
        assert await metric(gateway.url, "thinkgate_ledger_spool_records") == 0
    await cluster.assert_ledger(everything)


# -- e. clients that leave -------------------------------------------------------------------


def grew(counter: str, before: int) -> Callable[[SimState], bool]:
    """The simulator's ``counter`` went past ``before``."""

    def past(state: SimState) -> bool:
        value: int = getattr(state, counter)
        return value > before

    return past


async def status_of(cluster: Cluster, request_id: str) -> list[str]:
    return [row.status for row in await cluster.ledger() if row.request_id == request_id]


async def test_clients_that_leave_at_every_stage(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory(THINKGATE_KV_CAPACITY_TOKENS="200000")
    first, second = cluster.gateways
    sim = cluster.sim.sim
    tag = secrets.token_hex(4)
    slow_first_token = {"sim": {"ttft_ms": 60_000}}  # nothing comes back until the client left

    # 1. During the upload of the body: never admitted, so never recorded; the replica counts
    # it as a disconnect and goes on.
    upload_id = f"left-uploading-{tag}"
    uploading = await cluster.raw(first.url, "visible", request_body(True), upload_id, upload=20)
    await uploading.close()

    async def counted() -> bool:
        return await metric(first.url, "thinkgate_requests_total",
                            status="client_disconnected") >= 1  # fmt: skip

    await eventually(counted, within_s=10)

    # 2. Admitted (the engine has the request), before the first byte: streamed, asking for
    # more tokens than the key's TPM could hold twice; then whole.
    waiting = {f"left-waiting-stream-{tag}": ("tpm", True, 30_000),
               f"left-waiting-whole-{tag}": ("visible", False, 16)}  # fmt: skip
    taps = len(cluster.tap.bodies)
    for request_id, (key, stream, max_tokens) in waiting.items():
        body = {**request_body(stream, max_tokens), **slow_first_token}
        asked, cancelled = sim.requests_total, sim.cancelled
        left = await cluster.raw(second.url, key, body, request_id)
        await sim.wait_for(grew("requests_total", asked), timeout=10)  # admitted
        await left.close()
        await sim.wait_for(grew("cancelled", cancelled), timeout=10)  # and cancelled
        await eventually(functools.partial(status_of, cluster, request_id), within_s=10)
        assert await status_of(cluster, request_id) == ["client_disconnected"]
    prompt_estimate = len(cluster.tap.bodies[taps]) // 4  # of the streamed one, as sent upstream

    # 3. Mid-stream, after a few chunks.
    mid_id = f"left-mid-stream-{tag}"
    body = {**request_body(True, max_tokens=400), "sim": {"itl_ms": 20}}
    cancelled = sim.cancelled
    reading = await cluster.raw(first.url, "visible", body, mid_id)
    await reading.read_events(3)
    await reading.close()
    await sim.wait_for(grew("cancelled", cancelled), timeout=10)
    await eventually(lambda: status_of(cluster, mid_id), within_s=10)
    assert await status_of(cluster, mid_id) == ["client_disconnected"]

    # The TPM refund: the client that left before its first token was charged at most its
    # prompt estimate, not its max_tokens. Its settlement is done once its KV lease (released
    # in the same step) is gone; the following request goes through the other replica.
    kv = redis.Redis(port=cluster.redis_port)
    try:
        budget = RedisKVBudgetStore(kv)
        await eventually(lambda: _nothing_reserved(budget, cluster.engine_url), within_s=10)
    finally:
        await kv.aclose()
    taps = len(cluster.tap.bodies)
    async with httpx.AsyncClient(timeout=30) as client:
        following = await send(client, Target(first.url, "tpm"), cluster.keys["tpm"],
                               stream=False, max_tokens=8)  # fmt: skip
    assert following.completed, following.detail
    reserved = len(cluster.tap.bodies[taps]) // 4 + 8
    remaining = int(following.headers["x-ratelimit-remaining-tokens"])
    # The bucket only refills meanwhile: charged <= the prompt estimate leaves at least this.
    assert remaining >= TPM_LIMIT - prompt_estimate - reserved, (
        f"{TPM_LIMIT - remaining - reserved} tokens charged for a request that left before "
        f"its first token (prompt estimate {prompt_estimate}, max_tokens 30000)")  # fmt: skip

    rows = await cluster.assert_ledger([following])
    assert upload_id not in {row.request_id for row in rows}


async def _nothing_reserved(budget: RedisKVBudgetStore, engine_url: str) -> bool:
    return await budget.reserved(engine_url) == 0
