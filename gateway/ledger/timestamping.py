"""Trusted time for checkpoints: the latest checkpoint goes to an RFC 3161 Time-Stamp
Authority (``TSA_URL``) and its stamp is kept beside it (``audit.timestamps`` for the checks).

Rules:

- A loop per gateway process looks at the latest checkpoint every ``TSA_INTERVAL_S``; if it
  has no stamp yet, it POSTs a ``application/timestamp-query`` and keeps the reply once it is
  granted, over that checkpoint's body, with the request's nonce and, when ``TSA_ROOTS_FILE``
  names trusted roots, chaining to one of them. So at most one stamp per interval: the stamp
  on size ``N`` dates every record below ``N``.
- With ``CHECKPOINT_INTERVAL_MS`` (``every_checkpoint``), every checkpoint is stamped: each
  round stamps, oldest first, those published since the last it looked at (at most
  ``CATCH_UP``; a TSA that is away leaves them for the next round).
- A TSA that is away or refuses delays stamps, never completions or checkpoints; failures are
  logged (status and reason only).
- With no ``TSA_URL`` nothing of this runs and nothing changes.
"""

from __future__ import annotations

import logging

import httpx
from cryptography import x509

from audit import timestamps
from audit.ledger import Ledger
from audit.note import parse_checkpoint
from gateway.ledger.periodic import every

log = logging.getLogger("thinkgate.timestamps")


class Timestamping:
    def __init__(self, ledger: Ledger, url: str, roots: list[x509.Certificate],
                 interval_s: float, client: httpx.AsyncClient, *,
                 every_checkpoint: bool = False) -> None:  # fmt: skip
        self._ledger = ledger
        self._url = url
        self._roots = roots
        self._interval = interval_s
        self._client = client
        self._every = every_checkpoint
        self._next: int | None = None  # the smallest size not looked at yet (every_checkpoint)

    async def run(self) -> None:
        await every(self._interval, self.round, "timestamping")

    async def round(self) -> None:
        if self._every and self._next is None and await self._ledger.checkpoint() is None:
            self._next = 1  # a new log: every checkpoint from its first
        for note in await _due(self._ledger, self._every, self._next):
            size = parse_checkpoint(note.split("\n\n", 1)[0] + "\n").size
            if not await self._stamp(note, size):
                return  # the TSA is away: the same checkpoints next round
            self._next = size + 1

    async def _stamp(self, note: str, size: int) -> bool:
        """Stamp the checkpoint ``note`` of ``size`` unless it has a stamp; whether it has one
        now (a refused reply counts as done: it is logged, and retrying would not help)."""
        body = note.split("\n\n", 1)[0] + "\n"
        if await self._ledger.timestamps([size]):
            return True
        sent = timestamps.request(body)
        try:
            response = await self._client.post(
                self._url, content=sent.as_bytes(),
                headers={"content-type": "application/timestamp-query"},
            )  # fmt: skip
        except httpx.HTTPError as exc:
            log.warning("the TSA is unreachable: %s", type(exc).__name__)
            return False
        if response.status_code != 200:
            log.warning("the TSA answered %d", response.status_code)
            return False
        try:
            reply = timestamps.accept(response.content, sent, body, self._roots)
        except timestamps.TimestampError as exc:
            log.error("the TSA's reply for checkpoint %d is not kept: %s", size, exc)
            return True
        await self._ledger.add_timestamp(size, reply)
        return True


CATCH_UP = 64  # checkpoints looked at per round at most (every_checkpoint)


async def _due(ledger: Ledger, every_checkpoint: bool, after: int | None) -> list[str]:
    """The checkpoints a round looks at: the latest; with ``every_checkpoint``, every one from
    size ``after`` on, oldest first (the first round starts at the latest)."""
    latest = await ledger.checkpoint()
    if latest is None or not every_checkpoint or after is None:
        return [] if latest is None else [latest]
    return [note for _, _, note in await ledger.checkpoints(after, CATCH_UP)]
