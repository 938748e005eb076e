"""The realistic benchmark's parts (functional, not timed): the paced upstream writes one
event per write and answers both APIs, the bare relay passes bytes through unchanged and checks
its key, and the load generator counts the legacy completions' text chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from bench import paced
from bench.loadgen import LoadSpec, run_load
from bench.relay import Relay
from gateway.edge.servers import BackgroundServer


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    server = await asyncio.get_running_loop().create_server(paced._Http, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def body_chunks(raw: bytes) -> list[bytes]:
    """The chunks of a chunked HTTP/1.1 body, as written."""
    chunks, rest = [], raw
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return chunks
        chunks.append(rest[:n])
        rest = rest[n + 2 :]


async def test_each_event_is_one_chunk_of_the_body(upstream: str) -> None:
    port = int(upstream.split(":")[2].split("/")[0])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"model":"bench-short","stream":true,"stream_options":{"include_usage":true}}'
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: %d\r\n\r\n%s"
                 % (len(body), body))  # fmt: skip
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    raw = await reader.readuntil(b"0\r\n\r\n")
    writer.close()
    chunks = body_chunks(raw)
    assert all(c.startswith(b"data: ") and c.endswith(b"\n\n") and c.count(b"\n\n") == 1
               for c in chunks)  # fmt: skip
    texts = [c for c in chunks if b'"content":"' in c and b'"content":""' not in c]
    assert len(texts) == 4  # </think> (the template opened it), three words
    assert b'"usage"' in chunks[-2] and chunks[-1] == b"data: [DONE]\n\n"


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_the_load_generator_counts_every_text_chunk(upstream: str, api: str) -> None:
    spec = LoadSpec(url=upstream, api_key="", model="bench-short", concurrency=2,
                    duration_s=0.5, api=api)  # type: ignore[arg-type]  # fmt: skip
    result = await run_load(spec)
    assert result.errors == 0, result.first_error
    assert result.requests > 0
    assert result.chunks >= 4 * result.requests  # each request: 4 text chunks


async def test_the_relay_passes_the_bytes_through_and_checks_its_key(upstream: str) -> None:
    async with BackgroundServer(Relay(upstream, "k")) as relay:
        body = {"model": "bench-short", "stream": True}
        async with httpx.AsyncClient() as client:
            refused = await client.post(f"{relay.url}/v1/chat/completions", json=body)
            through = await client.post(f"{relay.url}/v1/chat/completions", json=body,
                                        headers={"authorization": "Bearer k"})  # fmt: skip
            direct = await client.post(f"{upstream}/chat/completions", json=body)
    assert refused.status_code == 401
    assert through.status_code == 200 and through.content == direct.content
    assert through.headers["content-type"] == "text/event-stream"


def test_the_counted_workload_runs_the_chunk_path_of_the_tree_it_is_given() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from bench.instructions import work; "
         f"work({str(root)!r}, 'bench-short', 3); "
         "import gateway.relay.rewrite as r; print(r.__file__)"],
        cwd=root, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip().startswith(str(root))
