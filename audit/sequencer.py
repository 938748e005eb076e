"""The sequencer: one transaction per batch assigns indexes, extends the tree, signs its head.

It keeps the tree's compact range (the right frontier, O(log n) hashes) between commits and
hands a commit script (``audit.commit``, where the transaction's rules are) to the database's
driver (``audit.drivers``). So indexes are contiguous across replicas, the node table is
insert-only, and every batch leaves a signed tree head behind (``sign_each_commit``), or, in
the interval mode, ``publish`` signs one over everything committed since the last. The new
frontier and the saved data keys are adopted only once the transaction committed: a failed one
leaves no trace here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from audit import store
from audit.commit import Script, Signing, commit_script
from audit.datakeys import DataKeys
from audit.drivers import open_driver
from audit.intents import Beat, Intent
from audit.merkle import CompactRange
from audit.note import NoteSigner
from audit.record import Sealed
from audit.sqlasync import AsyncEngine


class Sequencer:
    def __init__(
        self,
        engine: AsyncEngine,
        signer: NoteSigner,
        origin: str,
        keys: DataKeys,
        clock: Callable[[], float] = time.time,
        *,
        sign_each_commit: bool = True,
    ) -> None:
        self._engine = engine
        self._sign_each_commit = sign_each_commit  # False: ``publish`` signs, per interval
        self._driver = open_driver(engine)
        self._signing = Signing(origin, signer.sign, clock)
        self._keys = keys
        self._tree = CompactRange()

    @property
    def size(self) -> int:
        """The tree size after this process's last commit (others may have written since)."""
        return self._tree.size

    async def commit(self, batch: Sequence[Sealed], *, replay: bool = False,
                     intents: Sequence[Intent] = (), beat: Beat | None = None) -> int:  # fmt: skip
        """Append ``batch`` in order; with ``replay``, skip records the ledger already holds.
        ``intents`` are inserted, those ``batch`` replaces deleted, and ``beat`` written, in
        the same transaction. Returns the new tree size. A commit of intents alone is
        ``relaxed`` (``audit.drivers``): durable against this process's death."""
        keys = list(self._keys.unsaved.values())
        checkpoint = self._sign_each_commit and bool(batch or keys or replay)
        relaxed = not (batch or keys or replay)
        tree = await self._run(lambda: commit_script(
            self._driver.statements, self._tree, batch, keys, self._signing, replay=replay,
            checkpoint=checkpoint, intents=intents, beat=beat), relaxed)  # fmt: skip
        self._keys.saved([k.dek_id for k in keys])
        self._tree = tree
        return tree.size

    async def publish(self) -> int:
        """Sign a checkpoint over the whole tree, if its size has none yet (the interval mode;
        also after a crash between a commit and its checkpoint); the tree size."""
        sql, signing = self._driver.statements, self._signing
        self._tree = await self._run(lambda: commit_script(sql, self._tree, [], [], signing))
        return self._tree.size

    async def _run(self, script: Callable[[], Script], relaxed: bool = False) -> CompactRange:
        for last_try in (False, True):
            try:
                return await self._driver.run(script(), relaxed=relaxed)
            except store.DB_ERRORS:
                # A kept connection may have died while idle (database restarted, idle
                # timeout): one more try on a fresh one before calling the database away.
                if not await self._driver.reset() or last_try:
                    raise
            except BaseException:
                await self._driver.reset()  # its state is unknown: a fresh one next time
                raise
        raise AssertionError("unreachable")

    async def ping(self) -> bool:
        """Whether the database answers."""
        try:
            async with self._engine.connect() as conn:
                await store.tree_size(conn)
        except store.DB_ERRORS:
            return False
        return True

    async def aclose(self) -> None:
        await self._driver.aclose()
