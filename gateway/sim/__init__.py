"""A built-in vLLM simulator: OpenAI-compatible chat completions with scripted reasoning output.

``create_sim_app(SimConfig(...))`` returns an ASGI app whose ``state.sim`` (a ``SimState``)
exposes live counters and ``wait_for``. The text it generates is planned by the sans-I/O
``gateway.sim.script``; KV accounting lives in ``gateway.sim.kv``.
"""

from gateway.sim.app import SimApp, create_sim_app
from gateway.sim.config import SimConfig
from gateway.sim.script import Piece, Script, SimMode, build_script
from gateway.sim.state import SimState

__all__ = [
    "Piece",
    "Script",
    "SimApp",
    "SimConfig",
    "SimMode",
    "SimState",
    "build_script",
    "create_sim_app",
]
