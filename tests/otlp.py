"""A real OTLP/HTTP receiver for tests: ``POST /v1/traces`` and ``/v1/metrics`` decoded with
``opentelemetry-proto`` (the collector's own message types), every byte kept for searching."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.types import Receive, Scope, Send


@dataclass
class Span:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    service: str
    attributes: dict[str, Any]
    events: list[str]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Receiver:
    raw: list[bytes] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # each metric, as JSON

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        self.raw.append(body)
        if scope["path"] == "/v1/traces":
            self._traces(body)
            reply = ExportTraceServiceResponse().SerializeToString()
        elif scope["path"] == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            for resource in request.resource_metrics:
                for scoped in resource.scope_metrics:
                    self.metrics += [MessageToDict(m) for m in scoped.metrics]
            reply = ExportMetricsServiceResponse().SerializeToString()
        else:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-protobuf")]})  # fmt: skip
        await send({"type": "http.response.body", "body": reply})

    def _traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in resource.resource.attributes}
            for scoped in resource.scope_spans:
                for s in scoped.spans:
                    self.spans.append(Span(
                        s.name, s.kind, s.trace_id.hex(), s.span_id.hex(),
                        s.parent_span_id.hex(), str(attrs.get("service.name")),
                        {a.key: _value(a.value) for a in s.attributes},
                        [e.name for e in s.events],
                    ))  # fmt: skip


class ThreadedReceiver:
    """A ``Receiver`` served by uvicorn on a thread of its own, for a session (a process
    started before the test's event loop, such as vLLM, exports to it)."""

    def __init__(self) -> None:
        import asyncio
        import socket
        import threading

        import uvicorn

        self.received = Receiver()
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(self.received, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._socket])), daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
