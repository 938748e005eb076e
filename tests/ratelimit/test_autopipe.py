"""Auto-pipelining against a real Redis: what is issued together goes out together, every
command gets its own reply or error, and a dead connection fails every waiting command."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from ratelimit.autopipe import AutoPipeline, pack
from ratelimit.luascript import LuaScript

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
