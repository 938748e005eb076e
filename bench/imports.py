"""``python -m bench.imports``: what a serving process holds, charged to the packages it
imported (issue 44's "measured per import").

Recipe: a private work folder → the paced upstream (``bench.paced``) → thinkgate in the
production configuration as ``bench.realistic`` starts it (``ledger init``, strict ledger,
metrics, the JSON access log; ``--pg``: PostgreSQL with Redis rate limits and KV admission),
one worker, with ``bench/importhook`` first on its ``PYTHONPATH``: a ``sitecustomize`` that
measures the resident memory each module's import added, net of the modules it imported in
turn → ``--requests`` streamed chat completions → ``SIGUSR1``: the hook writes its sums →
a table of the packages, largest first, with the process's RSS (psutil) and which module
first imported each package (where to look to make it lazy). Imports the process made before
the hook (the interpreter's own start) are not charged: the table's sum is less than the RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.procs import Workdir
from bench.realistic import ROOT, drop_databases, start_thinkgate, start_upstream

HOOK = Path(__file__).with_name("importhook")
REPORT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Charged:
    package: str
    mb: float
    first_from: str


@dataclass(frozen=True, slots=True)
class Holding:
    system: str
    requests: int
    rss_mb: float  # the process's, after the requests (psutil)
    modules: int
    packages: tuple[Charged, ...]  # largest first


def measure(work: Workdir, pg: bool, requests: int) -> Holding:
    upstream = start_upstream(work)
    started = [upstream]
    name = "thinkgate_pg" if pg else "thinkgate"
    out = work.path / "imports.json"
    try:
        system = start_thinkgate(work, upstream, name, ROOT, serve_env={
            "PYTHONPATH": os.pathsep.join((str(HOOK), str(ROOT))),
            "THINKGATE_IMPORT_RSS_OUT": str(out)})  # fmt: skip
        assert system.server is not None
        started.append(system.server)
        _stream(system.base_url, system.key, requests)
        os.kill(system.server.process.pid, signal.SIGUSR1)
        body = _report(out)
        rss_mb = system.server.process.memory_info().rss / 2**20
    finally:
        for server in started:
            server.stop()
        if pg:
            drop_databases()
    charged = sorted((Charged(p, v["mb"], v["first_from"]) for p, v in body["packages"].items()),
                     key=lambda c: -c.mb)  # fmt: skip
    return Holding(name, requests, rss_mb, body["modules"], tuple(charged))


def _stream(base_url: str, key: str, requests: int) -> None:
    body = {"model": "bench-short", "stream": True, "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as http:
        for _ in range(requests):
            with http.stream("POST", "/chat/completions", json=body) as answer:
                answer.read()
                answer.raise_for_status()


def _report(out: Path) -> dict[str, Any]:
    deadline = time.monotonic() + REPORT_TIMEOUT_S
    while not out.exists():  # the hook writes it from the process's signal handler
        if time.monotonic() > deadline:
            raise TimeoutError(f"the serving process wrote no {out.name}")
        time.sleep(0.05)
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def render(holding: Holding, top: int) -> str:
    shown, rest = holding.packages[:top], holding.packages[top:]
    lines = [
        f"`{holding.system}`, one worker, after {holding.requests} streamed completions: "
        f"RSS **{holding.rss_mb:.1f} MB**, {holding.modules} modules; charged to imports "
        f"{sum(c.mb for c in holding.packages):.1f} MB.",
        "",
        "| package | MB (net of what it imported) | first imported by |",
        "|---|---|---|",
    ]
    lines += [f"| {c.package} | {c.mb:.1f} | {c.first_from} |" for c in shown]
    if rest:
        lines.append(f"| {len(rest)} others | {sum(c.mb for c in rest):.1f} | |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.imports", description=__doc__)
    parser.add_argument("--pg", action="store_true",
                        help="PostgreSQL and Redis on 127.0.0.1 (thinkgate_pg)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="packages listed; the rest summed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="thinkgate-imports-") as tmp:
        holding = measure(Workdir(Path(tmp)), args.pg, args.requests)
    sys.stdout.write(render(holding, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
