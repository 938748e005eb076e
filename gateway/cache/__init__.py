"""The cluster's prefix cache, as the gateway sees it (sans-I/O): vLLM's KV events decoded, an
index of which engine holds which block, the blocks a prompt will occupy, and the scorer that
weighs a cached prefix against an engine's load (``docs/routing.md``)."""

from __future__ import annotations

import os


def one_blas_thread() -> None:
    """Before numpy's first import (``gateway.cache.blocks``): its bundled OpenBLAS starts a
    worker thread per core that spins while the importing thread computes (measured: the
    process's CPU twice the thread's for the block keys, and 27 ms a second idle). The index
    does no linear algebra; an operator's own setting stands."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
