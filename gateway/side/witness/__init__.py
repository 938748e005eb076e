"""``thinkgate witness``: a C2SP tlog-witness a partner can run beside a thinkgate log.

``POST /add-checkpoint`` (the spec's API; decisions in ``audit.witness.decide``), with its own
Ed25519 cosigner key and the verifier keys of the logs it follows. Its state, the latest
checkpoint it cosigned per origin, is one SQLite row per log: the check against it and the
update happen under one lock and one transaction, so two submissions can never roll it back
(the race the spec warns about). ``GET /`` says who it is (its name and verifier key).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from audit.note import NoteVerifier
from audit.witness import Cosigner, WitnessError, decide, parse_add_checkpoint

MAX_BODY = 64 * 1024


class WitnessState:
    """The latest cosigned ``(size, root)`` per origin, in SQLite."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS latest (origin TEXT PRIMARY KEY, "
                         "size INTEGER NOT NULL, root BLOB NOT NULL)")  # fmt: skip

    def get(self, origin: str) -> tuple[int, bytes] | None:
        row = self._db.execute("SELECT size, root FROM latest WHERE origin = ?",
                               (origin,)).fetchone()  # fmt: skip
        return None if row is None else (int(row[0]), bytes(row[1]))

    def put(self, origin: str, size: int, root: bytes) -> None:
        self._db.execute("INSERT INTO latest VALUES (?, ?, ?) ON CONFLICT (origin) DO UPDATE "
                         "SET size = excluded.size, root = excluded.root",
                         (origin, size, root))  # fmt: skip

    def close(self) -> None:
        self._db.close()


def create_witness_app(
    cosigner: Cosigner, logs: dict[str, NoteVerifier], state: WitnessState
) -> Starlette:
    lock = asyncio.Lock()

    async def add_checkpoint(request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_BODY:
            return PlainTextResponse("body too large\n", status_code=413)
        try:
            submitted = parse_add_checkpoint(body)
        except WitnessError as exc:
            return PlainTextResponse(f"{exc}\n", status_code=400)
        origin = submitted.note.split("\n", 1)[0]
        async with lock:  # the check and the update, atomically
            decision = decide(submitted, logs, state.get(origin))
            if decision.status != 200 or decision.checkpoint is None:
                media = "text/x.tlog.size" if decision.status == 409 else "text/plain"
                return Response(
                    (decision.body or f"{decision.message}\n").encode(),
                    status_code=decision.status,
                    headers={"content-type": media},
                )  # exactly, no charset
            checkpoint = decision.checkpoint
            state.put(origin, checkpoint.size, checkpoint.root)
        line = cosigner.cosign(checkpoint.body(), int(time.time()))
        return PlainTextResponse(line)

    async def about(request: Request) -> Response:
        return PlainTextResponse(f"{cosigner.name}\n{cosigner.verifier_key}\n")

    return Starlette(routes=[Route("/add-checkpoint", add_checkpoint, methods=["POST"]),
                             Route("/", about, methods=["GET"])])  # fmt: skip
