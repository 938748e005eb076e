"""One engine behind the gateway: its base URL, the URLs of its API paths, its load and health.

``Upstream.url(path)`` gives the engine's URL for any OpenAI API path (``/chat/completions``,
``/completions``, ``/embeddings``, ``/models``), built once per path; ``health_url`` is beside
``/v1`` (vLLM and SGLang serve ``/health`` there, not under it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from gateway.upstream.health import EngineHealth


@dataclass(slots=True, eq=False)
class Upstream:
    base_url: str
    in_flight: int = 0
    health: EngineHealth = field(default_factory=EngineHealth)
    health_url: httpx.URL = field(init=False)
    _urls: dict[str, httpx.URL] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        # vLLM and SGLang serve /health beside /v1, not under it
        self.health_url = httpx.URL(f"{self.base_url.removesuffix('/v1')}/health")

    def root_url(self, path: str) -> httpx.URL:
        """The engine's URL for a path beside ``/v1`` (vLLM's ``/tokenize``)."""
        return httpx.URL(f"{self.base_url.removesuffix('/v1')}{path}")

    def url(self, path: str) -> httpx.URL:
        """The engine's URL for an OpenAI API path (``/chat/completions``, ``/models``), built
        once per path: no URL parsing per request."""
        found = self._urls.get(path)
        if found is None:
            found = self._urls[path] = httpx.URL(f"{self.base_url}{path}")
        return found
