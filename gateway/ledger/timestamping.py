"""Trusted time for checkpoints: the latest checkpoint goes to an RFC 3161 Time-Stamp
Authority (``TSA_URL``) and its stamp is kept beside it (``audit.timestamps`` for the checks).

Rules:

- A loop per gateway process looks at the latest checkpoint every ``TSA_INTERVAL_S``; if it
  has no stamp yet, it POSTs a ``application/timestamp-query`` and keeps the reply once it is
  granted, over that checkpoint's body, with the request's nonce and, when ``TSA_ROOTS_FILE``
  names trusted roots, chaining to one of them. So at most one stamp per interval: the stamp
  on size ``N`` dates every record below ``N``.
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
                 interval_s: float, client: httpx.AsyncClient) -> None:  # fmt: skip
        self._ledger = ledger
        self._url = url
        self._roots = roots
        self._interval = interval_s
        self._client = client

    async def run(self) -> None:
        await every(self._interval, self.round, "timestamping")

    async def round(self) -> None:
        note = await self._ledger.checkpoint()
        if note is None:
            return
        body = note.split("\n\n", 1)[0] + "\n"
        size = parse_checkpoint(body).size
        if await self._ledger.timestamps([size]):
            return
        sent = timestamps.request(body)
        try:
            response = await self._client.post(
                self._url, content=sent.as_bytes(),
                headers={"content-type": "application/timestamp-query"},
            )  # fmt: skip
        except httpx.HTTPError as exc:
            log.warning("the TSA is unreachable: %s", type(exc).__name__)
            return
        if response.status_code != 200:
            log.warning("the TSA answered %d", response.status_code)
            return
        try:
            reply = timestamps.accept(response.content, sent, body, self._roots)
        except timestamps.TimestampError as exc:
            log.error("the TSA's reply for checkpoint %d is not kept: %s", size, exc)
            return
        await self._ledger.add_timestamp(size, reply)
