"""The guard models' client: one ask, one verdict (the I/O half of ``gateway.guard.judging``).

``GuardModels(client, metrics).ask(ask) -> GuardVerdict | None`` posts the ask's chat request to its
guard model's ``/chat/completions`` and parses the answer; ``None`` when the model cannot
answer (unreachable, too slow for ``timeout_s`` in all, an error status, an answer that is not
a verdict, or any other failure), which the policy's ``on_error`` decides. Each ask is timed into
``thinkgate_guard_model_seconds{policy,outcome}``; a failure is logged by policy and model with
its kind, never with the text that was judged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx
import orjson

from gateway.guard.judging import GuardAsk, GuardVerdict, VerdictError, parse_verdict
from gateway.telemetry.metrics import Metrics

log = logging.getLogger("thinkgate")


@dataclass(frozen=True, slots=True)
class GuardModels:
    client: httpx.AsyncClient
    metrics: Metrics

    async def ask(self, ask: GuardAsk) -> GuardVerdict | None:
        started = time.perf_counter()
        judge = ask.judge
        try:
            async with asyncio.timeout(judge.timeout_s):  # the whole ask, not each step of it
                response = await self.client.post(
                    f"{judge.upstream}/chat/completions", content=orjson.dumps(ask.body()),
                    headers={"content-type": "application/json"},
                )  # fmt: skip
            if response.status_code != 200:
                raise VerdictError(f"status {response.status_code}")
            answer = orjson.loads(response.content)["choices"][0]["message"]["content"]
            verdict = parse_verdict(answer if isinstance(answer, str) else "")
        except Exception as exc:  # whatever it is, on_error decides (never a failed request)
            kind = str(exc) if isinstance(exc, VerdictError) else type(exc).__name__
            log.warning("guard model %s of policy %r could not judge (%s)", judge.model,
                        ask.policy.name, kind)  # fmt: skip
            self.metrics.guard_model_answered(ask.policy.name, "error",
                                              time.perf_counter() - started)  # fmt: skip
            return None
        outcome = "unsafe" if verdict.unsafe else "safe"
        self.metrics.guard_model_answered(ask.policy.name, outcome, time.perf_counter() - started)
        return verdict
