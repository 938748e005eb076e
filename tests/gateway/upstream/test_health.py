"""When an engine leaves rotation and when it comes back (``gateway/upstream/health.py``)."""

from __future__ import annotations

from gateway.upstream.health import FAILURES_TO_EJECT, EngineHealth


def test_an_engine_starts_in_rotation() -> None:
    assert EngineHealth().serving


def test_consecutive_failures_take_it_out_and_a_success_resets_the_count() -> None:
    health = EngineHealth()
    for _ in range(FAILURES_TO_EJECT - 1):
        health.request_failed()
    assert health.serving
    health.request_succeeded()
    for _ in range(FAILURES_TO_EJECT - 1):
        health.request_failed()
    assert health.serving  # not consecutive: the success in between counts
    health.request_failed()
    assert not health.serving


def test_a_failed_probe_takes_it_out_and_a_good_probe_brings_it_back() -> None:
    health = EngineHealth()
    health.probed(False)
    assert not health.serving
    health.probed(True)
    assert health.serving


def test_after_ejection_by_failures_only_a_good_probe_brings_it_back() -> None:
    health = EngineHealth()
    for _ in range(FAILURES_TO_EJECT):
        health.request_failed()
    health.probed(False)
    assert not health.serving
    health.probed(True)
    assert health.serving and health.failures == 0
