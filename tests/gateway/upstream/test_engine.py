"""One engine: the URL of any API path, built once; its health URL beside ``/v1``."""

from __future__ import annotations

from gateway.upstream.engine import Upstream


def test_every_api_path_has_its_url_built_once() -> None:
    engine = Upstream("http://vllm:8000/v1")
    chat = engine.url("/chat/completions")
    assert str(chat) == "http://vllm:8000/v1/chat/completions"
    assert engine.url("/chat/completions") is chat  # no parsing per request
    assert str(engine.url("/embeddings")) == "http://vllm:8000/v1/embeddings"
    assert str(engine.health_url) == "http://vllm:8000/health"  # vLLM serves it beside /v1
