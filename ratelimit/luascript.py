"""A Redis Lua script called by its SHA-1 (``EVALSHA``), loaded again when the server answers
``NOSCRIPT`` (after a restart, a failover or ``SCRIPT FLUSH``). One round trip in the normal
case; the SHA is computed locally, so no ``SCRIPT LOAD`` is needed up front.

The scripts live in ``ratelimit/lua/*.lua`` beside the modules that call them (readable, and
checked by Lua-aware tools); ``LuaScript(files=(...))`` joins them, read once, on first use:
importing a module reads nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cached_property
from importlib import resources
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # redis-py is imported where a client is made: not without REDIS_URL
    from redis.asyncio import Redis

    from ratelimit.autopipe import AutoPipeline

# a plain client, or one that pipelines what comes together
ScriptClient: TypeAlias = "Redis | AutoPipeline"


def lua_source(name: str) -> str:
    """The text of ``ratelimit/lua/<name>``."""
    return resources.files("ratelimit").joinpath("lua", name).read_text(encoding="utf-8")


class LuaScript:
    def __init__(self, source: str | None = None, *, files: Sequence[str] = ()) -> None:
        if (source is None) == (not files):
            raise ValueError("a LuaScript takes its source or the files that hold it")
        self._source = source
        self._files = tuple(files)

    @cached_property
    def source(self) -> str:
        if self._source is not None:
            return self._source
        return "".join(lua_source(name) for name in self._files)

    @cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(self, client: ScriptClient, keys: Sequence[str], *args: str | int) -> object:
        from redis.exceptions import NoScriptError  # loaded with the client: a dict lookup

        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # SCRIPT LOAD answers the SHA computed here; retry once, let a second failure surface.
            await client.script_load(self.source)
            return await client.evalsha(self.sha, len(keys), *keys, *args)
