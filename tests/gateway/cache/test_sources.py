"""Where an engine's KV events are: its ``/kv_event_sources`` answer (a ``*`` host is the
engine's own) or the ``UPSTREAM_KV_EVENTS`` item; and finding none imports neither pyzmq nor
numpy."""

from __future__ import annotations

import subprocess
import sys

from gateway.cache.sources import Source, configured, discovered

ENGINE = "http://engine:8000/v1"


def test_sources_come_from_the_engine_or_the_setting() -> None:
    answer = {"0": {"publisher": "zmq", "endpoint": "tcp://*:5557",
                    "replay_endpoint": "tcp://*:5558", "topic": "kv"},
              "1": {"publisher": "zmq", "endpoint": "tcp://10.1.2.3:6000"},
              "2": {"publisher": "null"}}  # fmt: skip
    assert discovered(ENGINE, answer) == [
        Source(ENGINE, "tcp://engine:5557", "tcp://engine:5558", b"kv"),
        Source(ENGINE, "tcp://10.1.2.3:6000", None),
    ]
    assert discovered(ENGINE, None) == [] and discovered(ENGINE, {}) == []
    assert configured(ENGINE, "auto") is None and configured(ENGINE, "") is None
    assert configured(ENGINE, "off") == []
    assert configured(ENGINE, "tcp://e:1;tcp://e:2") == [Source(ENGINE, "tcp://e:1", "tcp://e:2")]


def test_a_gateway_without_events_imports_neither_pyzmq_nor_numpy() -> None:
    """They cost ~20 MB of RSS: only a router that subscribes loads them."""
    probe = ("import sys, gateway.app, gateway.upstream.router; "
             "print(sorted(m for m in ('zmq', 'numpy') if m in sys.modules))")  # fmt: skip
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, timeout=120)  # fmt: skip
    assert shown.stdout.strip() == "[]"
