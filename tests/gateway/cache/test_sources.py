"""Where an engine's KV events are: its ``/kv_event_sources`` answer (a ``*`` host is the
engine's own) or the ``UPSTREAM_KV_EVENTS`` item."""

from __future__ import annotations

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
