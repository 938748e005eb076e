"""The audit ledger as an auditor sees it through the gateway: ``/audit/v1`` over real sockets.

Completions are made with the real ``openai`` SDK, then found, read, proved and paged through
the auditor API, and the proofs are checked with the project's own RFC 9162 verifier and the
checkpoint signature with the public key the API serves.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.export import check_export
from audit.merkle import leaf_hash, verify_consistency, verify_inclusion
from audit.note import Checkpoint, NoteError, NoteSigner, NoteVerifier, parse_checkpoint
from audit.record import Sealed
from gateway.auth.keys import split_key
from gateway.cli.keys import open_store
from gateway.settings import Settings
from gateway.side.sim.app import SimConfig
from tests.e2e.conftest import Stack, log_origin, spool_cannot_take
from tests.openai_errors import assert_openai_error
from tests.waiting import eventually

MESSAGES: list[Any] = [{"role": "user", "content": "Why is the sky blue?"}]
MODEL = "deepseek-r1"
ITL_MS = 500  # between the answer's pieces: the lock is taken meanwhile
HELD_S = 1.0  # how long the lock is held once the answer is in
LISTED_FIELDS = {"index", "request_id", "tenant", "key_id", "model", "status", "leaf_hash"}


# -- helpers -------------------------------------------------------------------------------


def key_id(secret: str) -> str:
    parts = split_key(secret)
    assert parts is not None
    return parts[0]


def reasoning_of(obj: Any) -> str:
    value = (obj.model_extra or {}).get("reasoning_content")
    return value if isinstance(value, str) else ""


def hash32(value: str) -> bytes:
    raw = base64.b64decode(value, validate=True)
    assert len(raw) == 32
    return raw


def sdk(stack: Stack, secret: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url, api_key=secret, max_retries=0)


async def sdk_stream(stack: Stack, secret: str, **params: Any) -> tuple[str, str, str]:
    """``(request id, reasoning, content)`` of one streamed completion, read to its end."""
    async with sdk(stack, secret) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, stream=True, **params
        )
        stream = raw.parse()  # with_raw_response is the SDK's legacy wrapper: parse is sync
        reasoning, content = [], []
        async for chunk in stream:
            if chunk.choices:
                reasoning.append(reasoning_of(chunk.choices[0].delta))
                content.append(chunk.choices[0].delta.content or "")
    return raw.headers["x-request-id"], "".join(reasoning), "".join(content)


async def sdk_whole(stack: Stack, secret: str, **params: Any) -> tuple[str, str, str]:
    """``(request id, reasoning, content)`` of one non-streamed completion."""
    async with sdk(stack, secret) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, **params
        )
        message = raw.parse().choices[0].message
    return raw.headers["x-request-id"], reasoning_of(message), message.content or ""


@contextlib.asynccontextmanager
async def audit_client(stack: Stack, secret: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"authorization": f"Bearer {secret or stack.keys['auditor']}"}
    async with httpx.AsyncClient(
        base_url=f"{stack.root}/audit/v1", headers=headers, timeout=10
    ) as client:
        yield client


async def get_json(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    response = await client.get(path, params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


async def listed(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    page = await get_json(client, "/records", limit=1000, **params)
    assert page["object"] == "list" and page["next_cursor"] is None
    data: list[dict[str, Any]] = page["data"]
    return data


async def only_record(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    found = await listed(client, request_id=request_id)
    assert len(found) == 1, found
    return found[0]


async def record_eventually(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    """Records of requests that ended without ``[DONE]`` land after the response; poll."""
    async with asyncio.timeout(5):
        while True:
            found = await listed(client, request_id=request_id)
            if found:
                assert len(found) == 1, found
                return found[0]
            await asyncio.sleep(0.02)


async def signed_head(client: httpx.AsyncClient, verifier: NoteVerifier) -> Checkpoint:
    response = await client.get("/checkpoint")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse_checkpoint(verifier.open(response.text))


async def served_verifier(client: httpx.AsyncClient) -> NoteVerifier:
    response = await client.get("/public-key")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return NoteVerifier(response.text.strip())


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> Any:
    return assert_openai_error(response, status, code)


def database(tmp_path: Path) -> Path:
    return tmp_path / "gw.db"  # where ``stack_factory`` puts the gateway's database


def settings_for(tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite+aiosqlite:///{database(tmp_path)}")


async def new_key(tmp_path: Path, tenant: str, role: Any, reasoning: Any = "hidden") -> str:
    async with open_store(settings_for(tmp_path)) as store:
        new, _ = await store.create(tenant=tenant, role=role, reasoning=reasoning)
    return new.secret


@contextlib.contextmanager
def raw_sql(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A second connection to the gateway's database, as a DBA (or an outage) would use it."""
    conn = sqlite3.connect(database(tmp_path), isolation_level=None, check_same_thread=False)
    try:
        yield conn
    finally:
        conn.close()


# -- 1. every completion is on record, readable in full, and every read is recorded --------


async def test_completions_are_on_record_by_the_time_the_client_has_them(
    stack_factory: Any,
) -> None:
    stack = await stack_factory()
    visible, hidden = stack.keys["visible"], stack.keys["hidden"]
    streamed = await sdk_stream(stack, visible, seed=11, max_tokens=400)
    async with audit_client(stack) as audit:
        # No waiting: in strict mode [DONE] is sent only once the record is committed.
        stream_listed = await only_record(audit, streamed[0])
        whole = await sdk_whole(stack, visible, seed=11, max_tokens=400)
        whole_listed = await only_record(audit, whole[0])
        hidden_streamed = await sdk_stream(stack, hidden, seed=11, max_tokens=400)
        hidden_listed = await only_record(audit, hidden_streamed[0])

        for row, stream in ((stream_listed, True), (whole_listed, False)):
            assert set(row) >= LISTED_FIELDS
            assert (row["tenant"], row["key_id"]) == ("acme", key_id(visible))
            assert (row["model"], row["status"], row["kind"]) == (MODEL, "ok", "completion")
            assert row["header"]["stream"] is stream
            assert row["header"]["client_disconnected"] is False
            hash32(row["leaf_hash"])
        assert hidden_listed["key_id"] == key_id(hidden)
        assert len({stream_listed["index"], whole_listed["index"], hidden_listed["index"]}) == 3
        # The header is readable without a key, so it must not carry the conversation.
        everything = (await audit.get("/records")).text
        assert MESSAGES[0]["content"] not in everything and streamed[2] not in everything

        reads = []
        for row, (_, reasoning, content) in (
            (stream_listed, streamed),
            (whole_listed, whole),
            (hidden_listed, (None, streamed[1], hidden_streamed[2])),
        ):
            response = await audit.get(f"/records/{row['index']}")
            assert response.status_code == 200, response.text
            opened = response.json()
            assert opened["index"] == row["index"] and opened["leaf_hash"] == row["leaf_hash"]
            assert opened["body_status"] == "ok"
            body = opened["body"]
            assert body["messages"] == MESSAGES
            assert body["params"]["max_tokens"] == 400 and body["params"]["seed"] == 11
            assert body["reasoning"] == [reasoning] and body["content"] == [content]
            reads.append((row["index"], response.headers["x-request-id"]))

            # The read is itself on record before it is served.
            access = await listed(audit, kind="access")
            assert [a["header"]["subject"] for a in access] == [i for i, _ in reads]

    assert streamed[1] and streamed[2] and whole[1] == streamed[1] and whole[2] == streamed[2]
    assert hidden_streamed[1] == "" and hidden_streamed[2] == streamed[2]
    for record, (subject, request_id) in zip(access, reads, strict=True):
        assert (record["kind"], record["tenant"]) == ("access", "acme")
        assert record["key_id"] == key_id(stack.keys["auditor"])
        assert record["request_id"] == request_id
        assert record["header"]["subject"] == subject


async def test_done_waits_for_the_record_when_the_stream_succeeds(
    stack_factory: Any, tmp_path: Path
) -> None:
    """While another connection holds the database's write lock the record cannot commit, so
    a strict gateway must hold back [DONE], and send it once the record is in."""
    sim = {"chunks": ["Rayleigh", "</think>", "\n\nBlue", " sky."], "itl_ms": ITL_MS}
    await ordering_of_done_and_record(stack_factory, tmp_path, sim, expect_error=False)


async def test_done_waits_for_the_record_when_the_stream_fails(
    stack_factory: Any, tmp_path: Path
) -> None:
    """The same promise for a stream the upstream cut off: the terminal error event, then
    [DONE] only once the failed completion is on record."""
    sim = {"chunks": ["Rayleigh", "</think>", "\n\nBlue", " sky."], "fail": "drop", "fail_after": 3,
           "itl_ms": ITL_MS}  # fmt: skip
    await ordering_of_done_and_record(stack_factory, tmp_path, sim, expect_error=True)


async def raw_into(response: httpx.Response, received: bytearray) -> None:
    async for chunk in response.aiter_raw():
        received += chunk


async def ordering_of_done_and_record(
    stack_factory: Any, tmp_path: Path, sim: dict[str, Any], *, expect_error: bool
) -> None:
    stack = await stack_factory()
    await sdk_whole(stack, stack.keys["visible"])  # the tenant's data key exists from here on
    received = bytearray()
    last_piece = b"event: error" if expect_error else b" sky."
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "sim": sim}
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient(timeout=30) as client:
        with raw_sql(tmp_path) as lock:  # off the loop, as ledger_table_gone says why
            try:
                async with client.stream(
                    "POST", f"{stack.url}/chat/completions", json=body, headers=headers
                ) as response:
                    request_id = response.headers["x-request-id"]
                    reading = asyncio.ensure_future(raw_into(response, received))
                    try:
                        await eventually(lambda: bool(received), within_s=5)
                        # Locked once the stream runs (its write-ahead intent is in: locked
                        # before it, the request waits out the busy timeout and the spool
                        # takes it), the answer's pieces still ITL_MS apart: the record's
                        # commit waits now.
                        await asyncio.to_thread(lock.execute, "BEGIN IMMEDIATE")
                        assert last_piece not in received, "locked too late: the loop stalled"
                        await eventually(lambda: last_piece in received, within_s=5)
                        # [DONE] must not come while the lock is held, however long it is
                        # given (a gateway that does not wait sends it within milliseconds)
                        with contextlib.suppress(TimeoutError):
                            await eventually(lambda: b"data: [DONE]" in received,
                                             within_s=HELD_S)  # fmt: skip
                        done_while_locked = b"data: [DONE]" in received
                        await asyncio.to_thread(lock.execute, "COMMIT")
                        await asyncio.wait_for(reading, 10)
                    finally:
                        reading.cancel()
                        await asyncio.gather(reading, return_exceptions=True)
            finally:
                if lock.in_transaction:
                    await asyncio.to_thread(lock.execute, "ROLLBACK")
    assert received.endswith(b"data: [DONE]\n\n")
    assert not done_while_locked, "[DONE] was sent before the record could be committed"
    async with audit_client(stack) as audit:
        record = await only_record(audit, request_id)
    assert record["status"] == ("upstream_error" if expect_error else "ok")


# -- 2. checkpoints and proofs -------------------------------------------------------------


async def test_checkpoints_are_signed_and_proofs_verify(stack_factory: Any, tmp_path: Path) -> None:
    stack = await stack_factory()
    origin = log_origin(tmp_path)  # unique to the deployment's signing key
    assert origin.startswith("thinkgate/") and len(origin) == len("thinkgate/") + 12
    first_id, _, _ = await sdk_whole(stack, stack.keys["visible"], max_tokens=40)
    async with audit_client(stack) as audit:
        verifier = await served_verifier(audit)
        assert verifier.name == origin
        first = await signed_head(audit, verifier)
        assert first.origin == origin and first.size >= 1
        stranger = NoteSigner(origin, Ed25519PrivateKey.generate()).verifier_key()
        with pytest.raises(NoteError):
            NoteVerifier(stranger).open((await audit.get("/checkpoint")).text)

        record = await only_record(audit, first_id)
        proof = await get_json(
            audit, "/proof/inclusion", index=record["index"], tree_size=first.size
        )
        assert (proof["index"], proof["tree_size"]) == (record["index"], first.size)
        assert proof["leaf_hash"] == record["leaf_hash"]
        verify_inclusion(
            hash32(record["leaf_hash"]),
            record["index"],
            first.size,
            [hash32(h) for h in proof["hashes"]],
            first.root,
        )

        for seed in range(4):
            await sdk_stream(stack, stack.keys["hidden"], seed=seed, max_tokens=40)
        second = await signed_head(audit, verifier)
        assert second.size == first.size + 4
        consistency = await get_json(
            audit, "/proof/consistency", first=first.size, second=second.size
        )
        assert (consistency["first"], consistency["second"]) == (first.size, second.size)
        verify_consistency(
            first.size,
            second.size,
            [hash32(h) for h in consistency["hashes"]],
            first.root,
            second.root,
        )

        # Every record of the tree (all of tenant acme here) is in the second head.
        rows = await listed(audit)
        assert [r["index"] for r in rows] == list(range(second.size))
        for row in rows:
            proof = await get_json(
                audit, "/proof/inclusion", index=row["index"], tree_size=second.size
            )
            verify_inclusion(
                hash32(row["leaf_hash"]),
                row["index"],
                second.size,
                [hash32(h) for h in proof["hashes"]],
                second.root,
            )

        # The export holds what the leaf hashes are computed from, and checks offline.
        export = await audit.get("/export")
        assert export.status_code == 200, export.text
        lines = export.content.splitlines()
        report = check_export(lines, verifier)
        assert (report.tree_size, report.records) == (second.size, second.size)
        by_index = {r["index"]: r["leaf_hash"] for r in rows}
        for line in lines[1:]:
            item = orjson.loads(line)
            sealed = Sealed(base64.b64decode(item["header"]), base64.b64decode(item["ciphertext"]))
            assert (
                base64.b64encode(leaf_hash(sealed.leaf_data())).decode() == by_index[item["index"]]
            )
            assert MESSAGES[0]["content"].encode() not in sealed.ciphertext


async def test_bad_proof_and_list_parameters_are_400_with_the_parameter(
    stack_factory: Any,
) -> None:
    stack = await stack_factory()
    await sdk_whole(stack, stack.keys["visible"], max_tokens=20)
    await sdk_whole(stack, stack.keys["visible"], max_tokens=20)
    async with audit_client(stack) as audit:
        size = (await signed_head(audit, await served_verifier(audit))).size
        cases: list[tuple[str, dict[str, Any], set[str]]] = [
            ("/proof/inclusion", {"index": size, "tree_size": size}, {"index", "tree_size"}),
            ("/proof/inclusion", {"index": 0, "tree_size": size + 1}, {"tree_size"}),
            ("/proof/inclusion", {"index": 0, "tree_size": 0}, {"tree_size"}),
            ("/proof/inclusion", {"index": "one", "tree_size": size}, {"index"}),
            ("/proof/inclusion", {"index": "-1", "tree_size": size}, {"index"}),
            ("/proof/inclusion", {"index": "0", "tree_size": "1.5"}, {"tree_size"}),
            ("/proof/inclusion", {"index": "0", "tree_size": "0x2"}, {"tree_size"}),
            ("/proof/inclusion", {"tree_size": size}, {"index"}),
            ("/proof/consistency", {"first": 0, "second": size}, {"first"}),
            ("/proof/consistency", {"first": 1, "second": size + 1}, {"second"}),
            ("/proof/consistency", {"first": size, "second": 1}, {"first", "second"}),
            ("/proof/consistency", {"first": "1e0", "second": size}, {"first"}),
            ("/proof/consistency", {"first": 1}, {"second"}),
            ("/records", {"limit": 0}, {"limit"}),
            ("/records", {"limit": 1001}, {"limit"}),
            ("/records", {"limit": "ten"}, {"limit"}),
            ("/records", {"since": "yesterday"}, {"since"}),
            ("/records", {"until": "2026-01-01T00:00:00"}, {"until"}),  # no UTC offset
            ("/records/first", {}, {"index"}),
        ]
        for path, params, names in cases:
            error = assert_error(await audit.get(path, params=params), 400)
            assert error["type"] == "invalid_request_error", (path, params, error)
            assert error["param"] in names, (path, params, error)


async def test_digits_that_are_not_ascii_are_400_not_500(stack_factory: Any) -> None:
    """``str.isdigit`` is true for '²' (and other Unicode digits) that ``int()`` refuses."""
    stack = await stack_factory()
    await sdk_whole(stack, stack.keys["visible"], max_tokens=20)
    async with audit_client(stack) as audit:
        for path, params, name in (
            ("/proof/inclusion", {"index": "²", "tree_size": "1"}, "index"),
            ("/proof/consistency", {"first": "1", "second": "²"}, "second"),
            ("/records", {"limit": "²"}, "limit"),
            ("/records/²", {}, "index"),
        ):
            error = assert_error(await audit.get(path, params=params), 400)
            assert error["param"] == name, (path, error)


# -- 3. who may see what -------------------------------------------------------------------


async def test_auditor_routes_need_an_auditor_key(stack: Stack) -> None:
    paths = [
        "/records",
        "/records/0",
        "/checkpoint",
        "/public-key",
        "/proof/inclusion?index=0&tree_size=1",
        "/proof/consistency?first=1&second=1",
        "/export",
    ]
    async with httpx.AsyncClient(base_url=f"{stack.root}/audit/v1", timeout=10) as client:
        for path in paths:
            assert_error(await client.get(path), 401, "missing_api_key")
            for name in ("visible", "hidden", "admin"):
                headers = {"authorization": f"Bearer {stack.keys[name]}"}
                assert_error(await client.get(path, headers=headers), 403)
            bad = {"authorization": "Bearer sk-tg-000000000000-" + "A" * 43}
            assert_error(await client.get(path, headers=bad), 401)


async def test_an_auditor_sees_its_tenant_and_a_star_auditor_sees_all(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await stack_factory()
    other = await new_key(tmp_path, "other", "client", "visible")
    everyone = await new_key(tmp_path, "*", "auditor")
    acme_id, _, _ = await sdk_whole(stack, stack.keys["visible"], max_tokens=20)
    other_id, other_reasoning, other_content = await sdk_whole(stack, other, max_tokens=20)

    async with audit_client(stack) as acme, audit_client(stack, everyone) as star:
        assert_error(await acme.get("/records", params={"tenant": "other"}), 403)
        assert_error(await acme.get("/export", params={"tenant": "other"}), 403)
        assert await listed(acme, request_id=other_id) == []
        assert {r["tenant"] for r in await listed(acme)} == {"acme"}
        assert {r["tenant"] for r in await listed(acme, tenant="acme")} == {"acme"}

        other_row = await only_record(star, other_id)
        acme_row = await only_record(star, acme_id)
        assert (other_row["tenant"], other_row["key_id"]) == ("other", key_id(other))
        assert {r["tenant"] for r in await listed(star)} == {"acme", "other"}
        assert [r["index"] for r in await listed(star, tenant="other")] == [other_row["index"]]

        # Another tenant's record looks exactly like one that does not exist.
        hidden = assert_error(await acme.get(f"/records/{other_row['index']}"), 404)
        missing = assert_error(await acme.get("/records/1000000"), 404)
        assert hidden["code"] == missing["code"] == "record_not_found"
        assert await listed(star, kind="access") == []  # a refused read leaves no trace

        opened = await get_json(star, f"/records/{other_row['index']}")
        assert opened["body"]["reasoning"] == [other_reasoning]
        assert opened["body"]["content"] == [other_content]
        assert (await get_json(acme, f"/records/{acme_row['index']}"))["body_status"] == "ok"
        access = await listed(star, kind="access")
        assert [(a["tenant"], a["key_id"], a["header"]["subject"]) for a in access] == [
            ("other", key_id(everyone), other_row["index"]),
            ("acme", key_id(stack.keys["auditor"]), acme_row["index"]),
        ]
        # The acme auditor sees reads of acme records, not the star auditor's read of "other".
        assert [a["header"]["subject"] for a in await listed(acme, kind="access")] == [
            acme_row["index"]
        ]


async def test_cursor_pagination_walks_every_record_once(stack_factory: Any) -> None:
    stack = await stack_factory()
    for seed in range(3):
        await sdk_whole(stack, stack.keys["visible"], seed=seed, max_tokens=20)
        await sdk_whole(stack, stack.keys["hidden"], seed=seed, max_tokens=20)
    async with audit_client(stack) as audit:
        everything = [r["index"] for r in await listed(audit)]
        assert len(everything) == 6

        async def walk(**params: Any) -> list[int]:
            seen: list[int] = []
            cursor = None
            for _ in range(20):
                extra: dict[str, str] = {} if cursor is None else {"cursor": cursor}
                page = await get_json(audit, "/records", limit=2, **params, **extra)
                assert 1 <= len(page["data"]) <= 2 or not seen
                seen += [r["index"] for r in page["data"]]
                cursor = page["next_cursor"]
                if cursor is None:
                    return seen
            raise AssertionError("pagination did not end")

        assert await walk() == everything
        hidden_key = key_id(stack.keys["hidden"])
        hidden_only = [r["index"] for r in await listed(audit, key_id=hidden_key)]
        assert len(hidden_only) == 3 and await walk(key_id=hidden_key) == hidden_only
        for garbage in ("not a cursor!", "////", base64.b64encode(b"seven").decode()):
            error = assert_error(await audit.get("/records", params={"cursor": garbage}), 400)
            assert error["param"] == "cursor"


# -- 4. failed and abandoned completions are on record too ---------------------------------


async def read_into(stream: Any, reasoning: list[str]) -> None:
    async for chunk in stream:
        if chunk.choices:
            reasoning.append(reasoning_of(chunk.choices[0].delta))


async def test_upstream_failures_are_recorded(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SimConfig(error_rate=1.0))
    visible = stack.keys["visible"]
    async with sdk(stack, visible) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        # A request's own sim.fail overrides the configured rate: this one starts, then drops.
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            extra_body={
                "sim": {
                    "chunks": ["Think", "ing", "</think>", "\n\nNo"],
                    "fail": "drop",
                    "fail_after": 2,
                }
            },
        )
        received: list[str] = []
        with pytest.raises(openai.APIError):
            await read_into(stream, received)
        dropped_id = stream.response.headers["x-request-id"]
    assert refused.value.status_code >= 500
    refused_id = refused.value.response.headers["x-request-id"]
    async with audit_client(stack) as audit:
        refused_row = await only_record(audit, refused_id)  # before the error response: durable
        dropped_row = await record_eventually(audit, dropped_id)
        dropped = await get_json(audit, f"/records/{dropped_row['index']}")
    assert refused_row["status"] == "upstream_error" and refused_row["header"]["error_code"]
    assert refused_row["header"]["stream"] is False
    assert dropped_row["status"] == "upstream_error"
    assert dropped_row["header"]["error_code"] == "upstream_protocol_error"
    assert dropped["body"]["reasoning"] == ["".join(received)] == ["Thinking"]
    assert dropped["body"]["messages"] == MESSAGES


async def test_a_client_that_leaves_mid_stream_is_recorded(stack_factory: Any) -> None:
    stack = await stack_factory(sim=SimConfig(itl_ms=20))
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "max_tokens": 2000}
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream(
            "POST", f"{stack.url}/chat/completions", json=body, headers=headers
        ) as response,
    ):
        request_id = response.headers["x-request-id"]
        first = await anext(response.aiter_bytes())
    assert first
    async with audit_client(stack) as audit:
        row = await record_eventually(audit, request_id)
        opened = await get_json(audit, f"/records/{row['index']}")
    assert row["status"] == "client_disconnected"
    assert row["header"]["client_disconnected"] is True
    assert opened["body"]["messages"] == MESSAGES
    assert opened["body"]["reasoning"][0]  # what was produced before the client left is kept


# -- 5. what is captured, and what happens when nothing can store the record ---------------


@pytest.mark.parametrize("capture", ["reasoning", "metadata"])
async def test_audit_capture_limits_the_body(stack_factory: Any, capture: str) -> None:
    stack = await stack_factory(audit_capture=capture)
    request_id, reasoning, content = await sdk_whole(stack, stack.keys["visible"], max_tokens=400)
    assert reasoning and content
    async with audit_client(stack) as audit:
        row = await only_record(audit, request_id)
        opened = await get_json(audit, f"/records/{row['index']}")
    assert row["header"]["capture"] == capture and row["status"] == "ok"
    assert row["header"]["usage"]["completion_tokens"] > 0  # the header is kept whole
    assert opened["body_status"] == "ok"
    body = opened["body"]
    assert body["messages"] is None and body["params"] is None
    if capture == "reasoning":
        assert body["reasoning"] == [reasoning] and body["content"] == [content]
    else:
        assert body["reasoning"] is None and body["content"] is None


@contextlib.asynccontextmanager
async def ledger_table_gone(tmp_path: Path) -> AsyncIterator[None]:
    """The ledger's table disappears (reads and writes fail) and comes back afterwards. The
    statements run off the event loop: the gateway under test shares it, and may hold
    SQLite's write lock across its turns (its heartbeat's transaction) when they start."""
    with raw_sql(tmp_path) as conn:
        await asyncio.to_thread(
            conn.execute, "ALTER TABLE ledger_entries RENAME TO ledger_entries_away"
        )
        try:
            yield
        finally:
            await asyncio.to_thread(
                conn.execute, "ALTER TABLE ledger_entries_away RENAME TO ledger_entries"
            )


async def post_chat(stack: Stack, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL, "messages": MESSAGES, "stream": stream, "max_tokens": 20}
    headers = {"authorization": f"Bearer {stack.keys['visible']}"}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(f"{stack.url}/chat/completions", json=body, headers=headers)


async def test_database_away_records_are_spooled_then_replayed(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await stack_factory()
    await post_chat(stack)
    async with ledger_table_gone(tmp_path):
        response = await post_chat(stack, stream=True)
        assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
        spool = (tmp_path / "spool.log").read_bytes()
        assert spool.count(b"\n") >= 1
        for line in spool.splitlines():
            payload = base64.b64decode(line.split(b" ")[1])
            assert MESSAGES[0]["content"].encode() not in payload
    request_id = response.headers["x-request-id"]
    async with audit_client(stack) as audit:
        row = await record_eventually(audit, request_id)
        opened = await get_json(audit, f"/records/{row['index']}")
    assert opened["body"]["messages"] == MESSAGES


async def test_audit_fail_closed_refuses_what_cannot_be_recorded(
    stack_factory: Any, tmp_path: Path
) -> None:
    # A spool path under a regular file stops the gateway at start (the spool's directory
    # cannot be made); a spool path that becomes a directory later fails at write time.
    stack = await stack_factory(audit_fail="closed")
    await post_chat(stack)
    spool_cannot_take(tmp_path / "spool.log")
    async with ledger_table_gone(tmp_path):
        lost = await post_chat(stack, stream=True)
        assert lost.status_code == 200  # the stream had begun; it ends with an error event
        assert b"event: error" in lost.content and b"ledger_unavailable" in lost.content
        assert_error(await post_chat(stack), 503, "ledger_unavailable")  # refused up front
        async with httpx.AsyncClient() as client:
            ready = await client.get(f"{stack.root}/readyz")
        assert ready.status_code == 503  # a load balancer sends traffic elsewhere meanwhile
        assert ready.json()["checks"]["ledger"] == "refusing records"
        assert_error(await post_chat(stack, stream=True), 503, "ledger_unavailable")
    async with asyncio.timeout(5):  # the writer notices the database is back
        while True:
            back = await post_chat(stack)
            if back.status_code != 503:
                break
            await asyncio.sleep(0.05)
    assert back.status_code == 200, back.text
    async with audit_client(stack) as audit:
        assert await listed(audit, request_id=lost.headers["x-request-id"]) == []
        await only_record(audit, back.headers["x-request-id"])


async def test_a_refused_stream_is_not_an_unhandled_server_error(
    stack_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream already told its client (error event, then [DONE]); the record's failure is
    handled, so it must not also escape to the server as an unhandled exception."""
    stack = await stack_factory(audit_fail="closed")
    await post_chat(stack)
    spool_cannot_take(tmp_path / "spool.log")
    async with ledger_table_gone(tmp_path):
        lost = await post_chat(stack, stream=True)
    assert b"ledger_unavailable" in lost.content
    unhandled = [r for r in caplog.records if r.name == "uvicorn.error" and r.exc_info]
    assert unhandled == [], [r.exc_info[1] for r in unhandled if r.exc_info]


async def test_audit_fail_open_serves_and_loses_the_record(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await stack_factory(audit_fail="open")
    await post_chat(stack)
    spool_cannot_take(tmp_path / "spool.log")
    async with ledger_table_gone(tmp_path):
        served = [await post_chat(stack, stream=True), await post_chat(stack)]
    assert served[0].text.endswith("data: [DONE]\n\n") and b"event: error" not in served[0].content
    assert served[1].status_code == 200 and served[1].json()["choices"][0]["finish_reason"]
    after = await post_chat(stack)
    async with audit_client(stack) as audit:
        for response in served:
            assert await listed(audit, request_id=response.headers["x-request-id"]) == []
        await only_record(audit, after.headers["x-request-id"])


async def test_no_key_secret_is_ever_recorded(stack_factory: Any, tmp_path: Path) -> None:
    """The client's key and the upstream key travel in headers, never in what is recorded:
    neither the record (header and decrypted body) nor the raw database holds them."""
    upstream_key = "sk-upstream-marker-9c2e71"
    stack = await stack_factory(upstream_api_key=upstream_key)
    secret = stack.keys["visible"]
    request_id, _, _ = await sdk_whole(stack, secret)
    async with audit_client(stack) as audit:
        row = await only_record(audit, request_id)
        record = await get_json(audit, f"/records/{row['index']}")
    assert record["body"]["messages"] == MESSAGES  # the body was really read back
    seen = json.dumps(record)
    raw = database_bytes(tmp_path)
    for marker in (secret, secret[len("sk-tg-") + 13 :], upstream_key):  # key, its secret part
        assert marker not in seen
        assert marker.encode() not in raw


def database_bytes(directory: Path) -> bytes:
    """The SQLite database and its WAL, as raw bytes."""
    return b"".join(p.read_bytes() for p in sorted(directory.glob("gw.db*")))


async def test_the_raw_bytes_of_one_record_recompute_its_leaf_within_the_tenant(
    stack_factory: Any, tmp_path: Path
) -> None:
    stack = await stack_factory()
    other = await new_key(tmp_path, "other", "client", "visible")
    acme_id, _, _ = await sdk_whole(stack, stack.keys["visible"], max_tokens=20)
    other_id, _, _ = await sdk_whole(stack, other, max_tokens=20)
    async with audit_client(stack) as acme:
        row = await only_record(acme, acme_id)
        raw = await get_json(acme, f"/records/{row['index']}/raw")
        header, ciphertext = base64.b64decode(raw["header"]), base64.b64decode(raw["ciphertext"])
        leaf = hashlib.sha256(b"\x00" + len(header).to_bytes(4, "big") + header + ciphertext)
        assert base64.b64encode(leaf.digest()).decode() == raw["leaf_hash"] == row["leaf_hash"]
        assert orjson.loads(header) == row["header"]  # the listing's header is these bytes
        assert await listed(acme, kind="access") == []  # no decryption, no access record
        everyone = await new_key(tmp_path, "*", "auditor")
        async with audit_client(stack, everyone) as star:
            other_index = (await only_record(star, other_id))["index"]
        hidden = assert_error(await acme.get(f"/records/{other_index}/raw"), 404)
        missing = assert_error(await acme.get("/records/99999/raw"), 404)
        assert hidden["code"] == missing["code"] == "record_not_found"
        opened = await get_json(acme, f"/records/{row['index']}")
        (access,) = await listed(acme, kind="access")
        assert access["request_id"] == opened["access_request_id"]
        me = await get_json(acme, "/me")
        assert me == {"key_id": key_id(stack.keys["auditor"]), "tenant": "acme", "role": "auditor"}


async def test_admins_read_the_configured_tenant_policies(stack_factory: Any) -> None:
    stack = await stack_factory(tenants={"acme": {"rpm": 600, "weight": 3}},
                                keys={"3f2a9c0b1d4e": {"priority": "critical"}})  # fmt: skip
    async with httpx.AsyncClient(base_url=stack.root) as client:
        admin = {"authorization": f"Bearer {stack.keys['admin']}"}
        body = (await client.get("/admin/v1/tenants", headers=admin)).json()
        auditor = {"authorization": f"Bearer {stack.keys['auditor']}"}
        refused = await client.get("/admin/v1/tenants", headers=auditor)
    assert body["data"] == [{"tenant": "acme", "rpm": 600, "tpm": 0, "weight": 3,
                             "priority": "standard"}]  # fmt: skip
    assert body["key_policies"] == {"3f2a9c0b1d4e": {"priority": "critical"}}
    assert_error(refused, 403)
