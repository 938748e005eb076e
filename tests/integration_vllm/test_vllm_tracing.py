"""One trace from the client through the gateway into vLLM (CPU): the parsed server runs with
``--otlp-traces-endpoint`` (vLLM's own OpenTelemetry spans), the gateway with
``OTEL_EXPORTER_OTLP_ENDPOINT``, both to one OTLP/HTTP receiver; vLLM's request span and the
gateway's spans share the caller's trace id, vLLM's parent being the gateway's upstream span."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from gateway.app import create_app
from gateway.edge.servers import BackgroundServer
from gateway.ledger.sink import ensure_keys
from gateway.settings import Settings
from tests.e2e.conftest import RecordingSink, ledger_files, make_keys
from tests.integration_vllm.conftest import VllmServer
from tests.otlp import ThreadedReceiver
from tests.waiting import eventually

TRACE, CALLER = "5cf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"


async def test_the_callers_trace_runs_through_the_gateway_into_vllm(
    vllm_servers: dict[str, VllmServer], otlp_receiver: ThreadedReceiver, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    settings = Settings(
        upstreams=(vllm_servers["parsed"].url,),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        models={"tiny-r1-parsed": {"reasoning_source": "upstream"}},
        first_token_timeout_s=180, **ledger_files(tmp_path),
    )  # fmt: skip
    ensure_keys(settings.ledger, create=True)
    keys = await make_keys(settings)
    async with BackgroundServer(create_app(settings, sink=RecordingSink())) as server:
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key=keys["visible"], max_retries=0,
            default_headers={"traceparent": f"00-{TRACE}-{CALLER}-01"},
        ) as client:  # fmt: skip
            await client.chat.completions.create(
                model="tiny-r1-parsed", max_tokens=8,
                messages=[{"role": "user", "content": "Hi"}],
            )  # fmt: skip
        spans = otlp_receiver.received.spans

        def traced() -> bool:
            mine = [s for s in spans if s.trace_id == TRACE]
            return any(s.service != "thinkgate" for s in mine) and any(
                s.name == "thinkgate.upstream" for s in mine
            )

        await eventually(traced, within_s=30)
    mine = [s for s in spans if s.trace_id == TRACE]
    upstream = next(s for s in mine if s.name == "thinkgate.upstream")
    engine = [s for s in mine if s.service != "thinkgate"]
    assert engine, [(s.name, s.service) for s in mine]
    # vLLM's request span is the child of the gateway's upstream span, in the caller's trace
    assert any(s.parent_span_id == upstream.span_id for s in engine), [
        (s.name, s.parent_span_id) for s in engine]  # fmt: skip
    server_span = next(s for s in mine if s.kind == 2 and s.service == "thinkgate")
    assert server_span.parent_span_id == CALLER
