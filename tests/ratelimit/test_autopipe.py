"""Auto-pipelining against a real Redis: what is issued together goes out together, every
command gets its own reply or error, and a dead connection fails every waiting command. A
pooled connection its server closed is retried once on a new one; a timeout, a failure after
part of the replies and a failure of a connection made for the exchange are not (those run
against ``FakeRedis``, a stand-in on a real socket whose failures the test decides)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from ratelimit.autopipe import AutoPipeline, pack
from ratelimit.luascript import LuaScript
from tests.waiting import eventually

ECHO = LuaScript("return ARGV[1]")


@pytest.fixture
async def pipe(redis_url: str) -> AsyncIterator[AutoPipeline]:
    auto = AutoPipeline(redis.Redis.from_url(redis_url))
    yield auto
    await auto.aclose()


async def test_commands_issued_together_share_one_round_trip(pipe: AutoPipeline) -> None:
    replies = await asyncio.gather(*(ECHO(pipe, [], str(i)) for i in range(50)))
    assert [int(r) for r in replies] == list(range(50))  # type: ignore[call-overload]
    # the first call may have had to load the script: then one more round trip for SCRIPT
    # LOAD and one for the retried command
    assert pipe.round_trips <= 3
    before = pipe.round_trips
    await asyncio.gather(*(ECHO(pipe, [], "x") for _ in range(50)))
    assert pipe.round_trips == before + 1


async def test_commands_issued_apart_go_apart(pipe: AutoPipeline) -> None:
    await pipe.ping()
    before = pipe.round_trips
    await pipe.ping()
    await pipe.ping()
    assert pipe.round_trips == before + 2


async def test_each_command_gets_its_own_error(pipe: AutoPipeline) -> None:
    unknown = "0" * 40
    results = await asyncio.gather(
        pipe.evalsha(unknown, 0), pipe.ping(), pipe.evalsha(ECHO.sha, 1), return_exceptions=True
    )
    assert isinstance(results[0], NoScriptError)
    assert results[1] in (True, b"PONG", "PONG")
    assert isinstance(results[2], ResponseError)  # a key count beyond the arguments


@pytest.mark.private_redis
async def test_a_flushed_script_is_loaded_again_for_that_command(
    pipe: AutoPipeline, redis_url: str
) -> None:
    await ECHO(pipe, [], "warm")
    admin = redis.Redis.from_url(redis_url)
    try:
        await admin.script_flush()
    finally:
        await admin.aclose()
    assert await ECHO(pipe, [], "again") == b"again"


async def test_a_dead_connection_fails_every_waiting_command() -> None:
    dead = AutoPipeline(
        redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    )
    try:
        results = await asyncio.gather(dead.ping(), dead.ping(), return_exceptions=True)
        assert all(isinstance(r, RedisConnectionError | OSError) for r in results)
        assert dead.round_trips == 1
    finally:
        await dead.aclose()


async def test_a_cancelled_caller_does_not_disturb_the_others(pipe: AutoPipeline) -> None:
    waiting = asyncio.ensure_future(pipe.ping())
    other = asyncio.ensure_future(ECHO(pipe, [], "kept"))
    await asyncio.sleep(0)  # both are queued
    waiting.cancel()
    assert await other == b"kept"
    assert waiting.cancelled()


async def test_closing_is_idempotent_and_refuses_new_commands(redis_url: str) -> None:
    auto = AutoPipeline(redis.Redis.from_url(redis_url))
    await auto.ping()
    await auto.aclose()
    await auto.aclose()
    with pytest.raises(RuntimeError):
        await auto.ping()


def test_commands_are_packed_in_resp() -> None:
    assert pack(("SET", "k", b"v\r\n", 42, "é")) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$2\r\n42\r\n$2\r\n\xc3\xa9\r\n"
    )
    for wrong in (1.5, True, None):
        with pytest.raises(TypeError):
            pack(("SET", "k", wrong))


# -- a dead pooled connection: retried once, on a new one ------------------------------------


async def kill_clients(redis_url: str, name: str) -> int:
    """``CLIENT KILL`` every connection named ``name`` (the server closes them); how many."""
    admin = redis.Redis.from_url(redis_url)
    try:
        ids = [c["id"] for c in await admin.client_list() if c["name"] == name]
        for client_id in ids:
            await admin.client_kill_filter(_id=client_id)
        return len(ids)
    finally:
        await admin.aclose()


async def test_a_pooled_connection_the_server_closed_costs_no_failure(redis_url: str) -> None:
    """What a user relies on, whatever redis-py negotiates with the server: a command after
    the server closed the pooled connection succeeds, on one new connection. (redis-py finds
    the closed socket at checkout against some servers, and by using it against others: then
    the batch is sent again, once; ``test_a_pooled_socket_dead_on_use_is_retried_once``
    makes that case on purpose.)"""
    name = f"stale-{secrets.token_hex(4)}"
    auto = AutoPipeline(redis.Redis.from_url(redis_url, client_name=name))
    try:
        assert await ECHO(auto, [], "warm") == b"warm"  # one pooled connection, idle now
        assert await kill_clients(redis_url, name) == 1
        assert await ECHO(auto, [], "again") == b"again"
        assert auto.retries <= 1
        retries = auto.retries
        assert await ECHO(auto, [], "after") == b"after"  # the new one is pooled in its place
        assert auto.retries == retries
        assert await kill_clients(redis_url, name) == 1  # one connection, not one per try
    finally:
        await auto.aclose()


class FakeRedis:
    """Just enough of a Redis server on a real socket for redis-py's defaults (RESP3):
    ``HELLO`` answered, ``+OK`` to the rest of the handshake, ``+PONG`` to ``PING``. ``hold()``
    keeps the replies back until ``released`` is set; ``cut`` answers that many more ``PING``s
    and then closes the connection the next one came on; ``hang`` answers no more ``PING``s;
    ``restart()`` closes every connection (as a server that went away); ``doom()`` makes every
    open connection close at its next command (dead on use)."""

    def __init__(self) -> None:
        self.accepted = 0  # connections
        self.pings = 0  # PINGs received
        self.cut: int | None = None
        self.hang = False
        self._doomed: set[asyncio.StreamWriter] = set()
        self.held = 0  # PINGs that reached the point of their reply (held or not)
        self.released = asyncio.Event()
        self.released.set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeRedis:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.restart()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def client(self, timeout_s: float = 0.5) -> AutoPipeline:
        return AutoPipeline(redis.Redis(port=self.port), timeout_s=timeout_s)

    def hold(self) -> None:
        self.released.clear()

    def restart(self) -> None:
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    def doom(self) -> None:
        """Every open connection is dead on its next command: closed when one arrives, as a
        socket to a server that went away behind a proxy or a NAT that kept it open. Nothing
        at checkout can tell it from a live one."""
        self._doomed = set(self._writers)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while command := await _read_command(reader):
                if command[0].upper() != b"PING":
                    hello = command[0].upper() == b"HELLO"
                    writer.write(b"%1\r\n$5\r\nproto\r\n:3\r\n" if hello else b"+OK\r\n")
                    continue
                self.pings += 1
                if writer in self._doomed:
                    self._doomed.discard(writer)
                    writer.close()
                    return
                if self.cut == 0:
                    self.cut = None
                    writer.close()
                    return
                if self.cut is not None:
                    self.cut -= 1
                if self.hang:
                    continue
                self.held += 1
                await self.released.wait()
                writer.write(b"+PONG\r\n")
                await writer.drain()


async def _read_command(reader: asyncio.StreamReader) -> list[bytes]:
    """One RESP command (an array of bulk strings); empty at the end of the stream."""
    line = await reader.readline()
    if not line:
        return []
    command = []
    for _ in range(int(line[1:])):
        size = int((await reader.readline())[1:])
        command.append((await reader.readexactly(size + 2))[:-2])
    return command


async def test_a_timeout_is_not_retried() -> None:
    async with FakeRedis() as fake:
        auto = fake.client(timeout_s=0.1)
        try:
            await auto.ping()  # pooled now
            fake.hang = True
            with pytest.raises(TimeoutError):
                await auto.ping()
            assert (auto.retries, fake.pings) == (0, 2)  # sent once: it may be running
        finally:
            await auto.aclose()


async def test_a_failure_after_some_replies_were_read_is_not_retried() -> None:
    async with FakeRedis() as fake:
        auto = fake.client()
        try:
            await auto.ping()  # pooled now
            fake.cut = 1  # the first reply of the next batch, then the connection closes
            results = await asyncio.gather(auto.ping(), auto.ping(), return_exceptions=True)
            assert all(isinstance(r, RedisConnectionError) for r in results), results
            assert (auto.retries, fake.pings, auto.round_trips) == (0, 3, 2)
        finally:
            await auto.aclose()


async def test_a_connection_made_for_the_exchange_is_not_retried() -> None:
    async with FakeRedis() as fake:
        auto = fake.client()
        try:
            fake.cut = 0  # the server accepts, then closes at the first command
            with pytest.raises(RedisConnectionError):
                await auto.ping()
            assert (auto.retries, fake.pings, fake.accepted) == (0, 1, 1)
        finally:
            await auto.aclose()


async def test_a_pooled_socket_dead_on_use_is_retried_once_on_a_new_one() -> None:
    async with FakeRedis() as fake:
        auto = fake.client()
        try:
            assert await auto.ping() == b"PONG"  # one pooled connection
            fake.doom()
            assert await auto.ping() == b"PONG"  # sent on it, cut, sent again on a new one
            assert (auto.retries, fake.accepted, fake.pings) == (1, 2, 3)
            assert await auto.ping() == b"PONG"
            assert (auto.retries, fake.accepted) == (1, 2)  # the new one was pooled
        finally:
            await auto.aclose()


async def test_one_dead_pooled_connection_renews_the_older_ones_without_a_failure_each() -> None:
    async with FakeRedis() as fake:
        auto = fake.client(timeout_s=10)  # the replies are held while the test looks
        try:
            await three_at_once(auto, fake)  # three pooled connections
            assert (auto.retries, fake.accepted, fake.pings) == (0, 3, 3)
            fake.doom()  # every pooled socket is dead, and only using one tells
            await three_at_once(auto, fake)
            # the first went out on its dead socket and again on a new one; the other two
            # were made again before use: 3 + 1 + 3 PINGs, not one failure (and a retry) each
            assert (auto.retries, fake.accepted, fake.pings) == (1, 6, 7)
        finally:
            await auto.aclose()


async def test_a_server_restart_costs_no_failure() -> None:
    """The server closed every pooled connection (whether redis-py finds them closed at
    checkout or by using them): three overlapping commands succeed on three new ones."""
    async with FakeRedis() as fake:
        auto = fake.client(timeout_s=10)
        try:
            await three_at_once(auto, fake)
            fake.restart()
            await three_at_once(auto, fake)
            assert fake.accepted == 6 and auto.retries <= 1
        finally:
            await auto.aclose()


async def three_at_once(auto: AutoPipeline, fake: FakeRedis) -> None:
    """Three PINGs whose exchanges overlap (the server holds the replies), so each needs a
    connection of its own; the next starts once the one before is held by the server (on a
    live connection: a retry included)."""
    fake.hold()
    pings: list[asyncio.Future[Any]] = []
    for _ in range(3):
        held = fake.held
        pings.append(asyncio.ensure_future(auto.ping()))
        await eventually(lambda: fake.held == held + 1, within_s=5)  # noqa: B023
    fake.released.set()
    assert await asyncio.gather(*pings) == [b"PONG"] * 3
