"""Reading one sample out of a gateway's /metrics, for tests that check what the metrics say."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


async def sample(client: httpx.AsyncClient, url: str, name: str, **labels: str) -> float:
    """The value of ``name`` with exactly ``labels`` at ``url`` (a gateway's /metrics)."""
    text = (await client.get(url)).text
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return found.value
    raise AssertionError(f"no {name}{labels or ''} in {url}")
