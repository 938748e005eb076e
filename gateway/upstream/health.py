"""Whether an upstream engine is in or out of rotation (sans-I/O).

Rules:

- An engine goes **out** after ``FAILURES_TO_EJECT`` consecutive failed requests (connect
  errors, timeouts, 5xx: the retryable failures, which say the engine rather than the request
  is at fault) or when its ``/health`` probe fails.
- It comes back **in** when a probe succeeds. A successful request also resets the failure
  count (an engine that answers is not failing), but an engine that is out receives no
  requests: only the probe, once per second, brings it back.
- Until the first probe answers, an engine is in: a gateway that just started must not refuse
  work because it has not looked yet.

The probe loop lives in ``gateway.upstream.pool.UpstreamPool.probe_forever``; routing skips engines
that are out, and answers 503 ``no_healthy_upstream`` when every engine of a model is out.
"""

from __future__ import annotations

from dataclasses import dataclass

FAILURES_TO_EJECT = 3


@dataclass(slots=True)
class EngineHealth:
    failures: int = 0
    probe_ok: bool = True

    @property
    def serving(self) -> bool:
        return self.probe_ok and self.failures < FAILURES_TO_EJECT

    def request_failed(self) -> None:
        self.failures += 1

    def request_succeeded(self) -> None:
        self.failures = 0

    def probed(self, ok: bool) -> None:
        self.probe_ok = ok
        if ok:
            self.failures = 0
