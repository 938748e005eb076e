"""A logits processor that paces the requests asking for it, loaded by the session's vLLM
servers (``--logits-processors enginepace:Pace``, this directory on their ``PYTHONPATH``).

The tiny model writes a hundred tokens a second and more; a test that needs "the engine is
still generating" when something happens would otherwise race it (and lose under load). A
request sent with ``vllm_xargs: {"pace_s": S}`` holds every engine step it is part of for S
seconds before the step runs (the step's whole batch waits with it); its logits, and every
other request, are left alone. Load can slow the engine further, never speed it up: N paced
tokens take at least N x S seconds whatever the machine does, while the engine stays free to
take an abort between two steps (vLLM's engine core reads its input queue between steps).

Imported by vLLM's Python (``.venv-vllm``, which has torch), never by pytest.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

if TYPE_CHECKING:
    from vllm.config import VllmConfig

MAX_PACE_S = 1.0  # a typo must not stall the shared server for minutes


def _pace_of(params: SamplingParams) -> float | None:
    pace = (params.extra_args or {}).get("pace_s")
    return None if pace is None else float(pace)


class Pace(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Refused by the API server (HTTP 400) unless a number of seconds in (0, 1]."""
        pace = (sampling_params.extra_args or {}).get("pace_s")
        if pace is None:
            return
        if isinstance(pace, bool) or not isinstance(pace, int | float):
            raise ValueError("pace_s must be a number of seconds")
        if not 0 < pace <= MAX_PACE_S:
            raise ValueError(f"pace_s must be in (0, {MAX_PACE_S}]")

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._paces: dict[int, float] = {}  # batch index -> seconds per step

    def is_argmax_invariant(self) -> bool:
        return True  # the logits are never touched

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Called before every forward pass: the step waits for its slowest paced request."""
        process_dict_updates(self._paces, batch_update, lambda params, _, __: _pace_of(params))
        if self._paces:
            time.sleep(max(self._paces.values()))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
