"""A built-in vLLM simulator: OpenAI-compatible chat completions with scripted reasoning output.

``create_sim_app(SimConfig(...))`` returns an ASGI app whose ``state.sim`` (a ``SimState``)
exposes live counters and ``wait_for``. It reproduces vLLM 0.32's observable behaviour, each
rule in the sans-I/O module that implements it: the generated text (``script``), what
it is about and whether it calls a tool, as a model in an agent loop (``turn``: the user's
question without the clients' wrappers, or the tool result to answer; ``tools``, ``fit`` and
``arguments``: the call), stop strings and ``max_tokens`` (``stops``), the deepseek_r1
reasoning parser (``reasoning``), streamed deltas, merged tokens and vllm-project/vllm#51641
(``deltas``), the bytes on the wire (``wire``), KV accounting (``kv``) and the Prometheus
metrics (``metrics``).
"""

from gateway.side.sim.app import SimApp, create_sim_app
from gateway.side.sim.config import SimConfig
from gateway.side.sim.script import Piece, Script, SimMode, build_script
from gateway.side.sim.state import SimState

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
