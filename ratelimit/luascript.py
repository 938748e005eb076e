"""A Redis Lua script called by its SHA-1 (``EVALSHA``), loaded again when the server answers
``NOSCRIPT`` (after a restart, a failover or ``SCRIPT FLUSH``). One round trip in the normal
case; the SHA is computed locally, so no ``SCRIPT LOAD`` is needed up front."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from ratelimit.autopipe import AutoPipeline

ScriptClient = Redis | AutoPipeline  # a plain client, or one that pipelines what comes together


class LuaScript:
    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(self, client: ScriptClient, keys: Sequence[str], *args: str | int) -> object:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # SCRIPT LOAD answers the SHA computed here; retry once, let a second failure surface.
            await client.script_load(self.source)
            return await client.evalsha(self.sha, len(keys), *keys, *args)
