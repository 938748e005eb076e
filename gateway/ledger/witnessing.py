"""The log side of C2SP tlog-witness: each new checkpoint goes to the configured witnesses,
whose cosignatures are kept beside it (``audit.witness`` for the formats and checks).

Rules:

- A loop per gateway process looks at the latest checkpoint every ``WITNESS_INTERVAL_S`` and
  submits it to each witness that has not cosigned it, with a consistency proof from the size
  that witness last cosigned. It starts from "old 0"; a 409 says the witness's size (another
  replica, or a restarted gateway, submitted since) and the loop retries at once from there.
  A 409 on the same size, or a 422, is the witness refusing a fork: logged as an error, never
  retried for that checkpoint.
- A cosignature is kept only if it verifies under that witness's configured key, over exactly
  this checkpoint (``CosignerKey.timestamp``); anything else is dropped and logged.
- With a TSA configured, the checkpoint submitted is the latest one already stamped, so that
  what the witnesses cosign carries a trusted time too: ``/tlog/checkpoint`` publishes only
  checkpoints that have both (``Settings.publish_policy``).
- With ``CHECKPOINT_INTERVAL_MS`` (``every_checkpoint``) every checkpoint is offered, oldest
  first, from the latest one at start (once stamped, with a TSA); a witness checks each against
  the one before by the consistency proof.
- Witnesses being away never blocks a completion or a checkpoint: the records are sealed and
  signed as always, and the cosignatures come when the witness answers again.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from audit.ledger import Ledger
from audit.note import parse_checkpoint
from audit.witness import CosignerKey, add_checkpoint_body
from gateway.ledger.periodic import every
from gateway.settings import WitnessConfig

log = logging.getLogger("thinkgate.witness")


class Witnessing:
    """Submits checkpoints to witnesses; ``run`` until cancelled."""

    def __init__(self, ledger: Ledger, witnesses: tuple[WitnessConfig, ...],
                 interval_s: float, client: httpx.AsyncClient, *,
                 stamped: bool = False, every_checkpoint: bool = False) -> None:  # fmt: skip
        self._ledger = ledger
        self._stamped = stamped
        self._every = every_checkpoint
        self._next: int | None = None  # the smallest size not offered yet (every_checkpoint)
        self._witnesses = [(w.url.rstrip("/"), CosignerKey.parse(w.key)) for w in witnesses]
        self._interval = interval_s
        self._client = client
        self._sizes: dict[str, int] = {}  # what each witness last cosigned, as far as we know
        self._refused: set[tuple[str, int]] = set()

    async def run(self) -> None:
        await every(self._interval, self.round, "witnessing")

    async def round(self) -> None:
        if not self._every or self._next is None:
            note = await self._ledger.published(stamped=self._stamped)
            if note is not None:
                await self._offer(note)
                self._next = _size(note) + 1
            elif self._every and await self._ledger.checkpoint() is None:
                self._next = 1  # a new log: every checkpoint from its first
            return
        for _, _, bare in await self._ledger.checkpoints(self._next, CATCH_UP):
            size = _size(bare)
            if self._stamped and not await self._ledger.timestamps([size]):
                return  # offered once stamped, in order
            note = await self._ledger.checkpoint(size)  # with the cosignatures kept so far
            if note is not None:
                await self._offer(note)
            self._next = size + 1

    async def _offer(self, note: str) -> None:
        signed = note.split("\n\n", 1)
        checkpoint = parse_checkpoint(signed[0] + "\n")
        have = {line.split(" ", 2)[1] for line in signed[1].splitlines() if line.startswith("—")}
        missing = [(url, key) for url, key in self._witnesses if key.name not in have]
        await asyncio.gather(*(self._submit(url, key, note, checkpoint.size)
                               for url, key in missing))  # fmt: skip

    async def _submit(self, url: str, key: CosignerKey, note: str, size: int) -> None:
        if (key.name, size) in self._refused:
            return
        plain = _without_cosignatures(note)
        body_text = plain.split("\n\n", 1)[0] + "\n"
        for _ in range(2):  # once more after a 409 told us the witness's size
            old = min(self._sizes.get(key.name, 0), size)
            proof = await self._ledger.consistency(old, size) if 0 < old < size else []
            try:
                response = await self._client.post(
                    f"{url}/add-checkpoint", content=add_checkpoint_body(old, proof, plain)
                )
            except httpx.HTTPError as exc:
                log.warning("witness %s unreachable: %s", key.name, type(exc).__name__)
                return
            if response.status_code == 409 and response.text.strip().isdigit():
                theirs = int(response.text.strip())
                if theirs == old:  # same size, another root: the witness saw a fork
                    break
                self._sizes[key.name] = theirs
                continue
            if response.status_code != 200:
                break
            self._sizes[key.name] = size
            for line in response.text.splitlines(keepends=True):
                if key.timestamp(body_text, line) is not None:
                    await self._ledger.add_cosignature(size, key.name, line)
                    return
            log.error("witness %s answered a cosignature that does not verify", key.name)
            return
        self._refused.add((key.name, size))
        log.error("witness %s refused the checkpoint of size %d: %d %s", key.name, size,
                  response.status_code, response.text.strip()[:200])  # fmt: skip


CATCH_UP = 64  # checkpoints offered per round at most (every_checkpoint)


def _size(note: str) -> int:
    return parse_checkpoint(note.split("\n\n", 1)[0] + "\n").size


def _without_cosignatures(note: str) -> str:
    """The note with only the log's own signature line (the first one)."""
    text, _, lines = note.partition("\n\n")
    return f"{text}\n\n{lines.splitlines()[0]}\n"
