"""``python -m bench.instructions [--before DIR]``: instructions per request of the chunk path.

Wall time on this shared 2-core machine swings by tens of percent between runs; instruction
counts do not. This runs the sans-I/O path every streamed token takes (``SSEParser`` and
``relay_read`` with the production policy: R1 text, visible reasoning, usage) over the exact
upstream events of ``bench.paced`` under ``valgrind --tool=callgrind``, twice per tree (0 and
N requests; the difference divided by N is per request, the imports cancel), with
``PYTHONHASHSEED=0``. ``--before DIR`` counts another source tree (a git worktree) the same way.

``python -m bench.instructions --work TREE MODEL N`` is the measured workload itself.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = {"bench-paced": 1000, "bench-short": 4000}


def work(tree: str, model: str, requests: int) -> None:
    """Relay ``requests`` responses of ``model`` through the chunk path of ``tree``."""
    from bench.paced import events  # the same upstream bytes for every tree

    stream = events(model, True, True)
    for name in [m for m in sys.modules if m == "gateway" or m.startswith("gateway.")]:
        del sys.modules[name]
    sys.path.insert(0, tree)
    from gateway.exchange.forward import relay_read
    from gateway.relay.rewrite import Policy, StreamRelay
    from gateway.relay.sse import SSEParser

    policy = Policy.named("deepseek_r1", True, "reasoning_content", include_usage=True)
    for _ in range(requests):
        relay, parser = StreamRelay(policy), SSEParser()
        for event in stream:
            relay_read(relay, parser, event)


def count(tree: Path, model: str, requests: int) -> int:
    """Instructions callgrind counts for the whole workload process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                "-m", "bench.instructions", "--work", str(tree), model, str(requests)]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
        subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True)
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        assert found is not None, "callgrind wrote no total"
        return int(found.group(1))


def per_request(tree: Path, model: str) -> float:
    requests = REQUESTS[model]
    return (count(tree, model, requests) - count(tree, model, 0)) / requests


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--before", type=Path, help="another source tree to count the same way")
    parser.add_argument("--work", nargs=3, metavar=("TREE", "MODEL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.work:
        work(args.work[0], args.work[1], int(args.work[2]))
        return 0
    trees = [("now", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    for model in REQUESTS:
        for label, tree in trees:
            print(
                f"{model:12} {label:7} {per_request(tree, model):12,.0f} instructions per request"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
