"""``thinkgate doctor``: the production-readiness checklist, automated where it can be seen from
outside the engine.

Each check is a ``Check(name, verdict, detail)`` with verdict ``pass``, ``warn``, ``fail`` or
``info``; the command prints them as a table and exits 1 if any failed. The judging functions
are pure (data in, checks out); ``examine_upstream`` and ``examine_gateway`` only fetch.

Upstream (per URL): ``/health`` and ``/v1/models`` answer; the model and its ``max_model_len``;
from ``vllm:cache_config_info``: prefix caching on, KV dtype and block size, KV capacity
(``(num_gpu_blocks − 1) × block_size``); the KV-usage metric under vLLM's new name
(``vllm:kv_cache_usage_perc``) or only the old one; one tiny completion, to see whether the
engine separates reasoning itself (``--reasoning-parser``: a ``reasoning``/``reasoning_content``
field) or leaves tags in the text, and so which ``REASONING_PARSER`` thinkgate needs.
Gateway: Redis and the database answer; the ledger's last checkpoint is signed by the signing
key and matches the tree stored in the database (a full ``ledger verify`` is the thorough
version).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson
from sqlalchemy import inspect, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from audit import merkle, store
from audit.note import NoteError, parse_checkpoint
from gateway.db import create_engine
from gateway.settings import Settings
from ratelimit.engine_metrics import parse_engine_metrics

Verdict = Literal["pass", "warn", "fail", "info"]
PROBE_PROMPT = "What is 2 + 2? Answer in one word."


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    verdict: Verdict
    detail: str


# -- judging (pure) ------------------------------------------------------------------------


def judge_health(status: int | None) -> Check:
    if status == 200:
        return Check("upstream /health", "pass", "200")
    return Check("upstream /health", "fail", "unreachable" if status is None else str(status))


def judge_models(status: int | None, body: Any) -> list[Check]:
    data = body.get("data") if isinstance(body, dict) else None
    if status != 200 or not isinstance(data, list) or not data:
        got = "unreachable" if status is None else f"{status}, no model list"
        return [Check("upstream /v1/models", "fail", got)]
    cards = [c for c in data if isinstance(c, dict)]
    checks = [Check("upstream /v1/models", "pass", ", ".join(str(c.get("id")) for c in cards))]
    for card in cards:
        length = card.get("max_model_len")
        if isinstance(length, int):
            checks.append(Check(f"max_model_len of {card.get('id')}", "info", f"{length:,}"))
        else:
            checks.append(Check(f"max_model_len of {card.get('id')}", "warn",
                                "not reported (not vLLM?)"))  # fmt: skip
    return checks


def judge_metrics(text: str | None) -> list[Check]:
    if text is None:
        return [Check("upstream /metrics", "fail", "unreachable: no adaptive KV budget")]
    try:  # a proxy's HTML page or a truncated body: the parser raises ValueError
        labels = _cache_config(text)
        capacity = parse_engine_metrics(text).kv_capacity_tokens
    except ValueError as exc:
        return [Check("upstream /metrics", "fail", f"not Prometheus text: {exc}"[:160])]
    checks = [Check("upstream /metrics", "pass", "Prometheus text")]
    checks.append(_kv_usage_name(text))
    if labels is None:
        checks.append(Check("vllm:cache_config_info", "warn",
                            "absent: set KV_CAPACITY_TOKENS (thinkgate capacity)"))  # fmt: skip
        return checks
    prefix = labels.get("enable_prefix_caching", "").lower() == "true"
    checks.append(Check("prefix caching", "pass" if prefix else "warn",
                        "on" if prefix else "off: pass --enable-prefix-caching"))  # fmt: skip
    layout = f"{labels.get('cache_dtype', '?')} / {labels.get('block_size', '?')}"
    checks.append(Check("KV cache dtype / block size", "info", layout))
    if capacity:
        checks.append(Check("KV capacity", "pass", f"{capacity:,} tokens"))
    else:
        checks.append(Check("KV capacity", "warn", "not derivable from cache_config_info"))
    return checks


def _kv_usage_name(text: str) -> Check:
    if "vllm:kv_cache_usage_perc" in text or "sglang:token_usage" in text:
        return Check("KV usage metric", "pass", "vllm:kv_cache_usage_perc (or SGLang's)")
    if "vllm:gpu_cache_usage_perc" in text:
        return Check("KV usage metric", "warn",
                     "only the old vllm:gpu_cache_usage_perc (thinkgate reads it too)")  # fmt: skip
    return Check("KV usage metric", "fail", "none: the KV budget cannot adapt to the engine")


def _cache_config(text: str) -> dict[str, str] | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                return dict(sample.labels)
    return None


def judge_probe(status: int | None, body: Any) -> list[Check]:
    """What one tiny completion says about reasoning, and the setting that follows."""
    message = _message(body)
    if status != 200 or message is None:
        got = "unreachable" if status is None else str(status)
        return [Check("probe completion", "fail", f"{got}: {_error(body)}")]
    checks = [Check("probe completion", "pass", "answered")]
    separated = message.get("reasoning_content") or message.get("reasoning")
    content = message.get("content") or ""
    if separated:
        checks.append(Check("reasoning parser", "pass",
                            "the engine separates reasoning (--reasoning-parser); thinkgate "
                            "reads its field whatever REASONING_PARSER says"))  # fmt: skip
    elif "</think>" in content:
        # Only the text before the first </think> says how the block was opened; a <think>
        # after it is part of the answer (think_tags would wrongly reopen reasoning there).
        before = content[: content.index("</think>")]
        opened = before.lstrip().startswith("<think>") or "<think>" not in before
        setting = "deepseek_r1" if opened else "think_tags"
        checks.append(Check("reasoning parser", "warn",
                            f"none on the engine: tags in the text; set REASONING_PARSER="
                            f"{setting} for this model, or start vLLM with "
                            "--reasoning-parser deepseek_r1"))  # fmt: skip
    elif "<think>" in content:
        checks.append(Check("reasoning parser", "warn",
                            "none on the engine: an open <think> in the text; set "
                            "REASONING_PARSER=think_tags for this model"))  # fmt: skip
    elif _finish_reason(body) == "length":
        # Cut off before any tag: a template that opened <think> (R1) looks exactly like this.
        checks.append(Check("reasoning parser", "warn",
                            "inconclusive: the probe hit max_tokens before any tag; if its "
                            "template opens <think>, REASONING_PARSER=deepseek_r1"))  # fmt: skip
    else:
        checks.append(Check("reasoning parser", "info",
                            "no reasoning seen in the probe: a model that does not reason wants "
                            "REASONING_PARSER=none (per model in the YAML file)"))  # fmt: skip
    return checks


def _message(body: Any) -> dict[str, Any] | None:
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def _finish_reason(body: Any) -> Any:
    return body["choices"][0].get("finish_reason")  # _message found choices[0], a dict


def _error(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", ""))[:120]
    return "no completion in the answer"


# -- fetching ------------------------------------------------------------------------------


async def examine_upstream(
    url: str, api_key: str = "", transport: httpx.AsyncBaseTransport | None = None,
    model: str | None = None,
) -> list[Check]:  # fmt: skip
    """Every upstream check for the OpenAI base URL ``url`` (``http://vllm:8000/v1``)."""
    root = url.rstrip("/").removesuffix("/v1")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    # 10 s per request, 60 s for the probe completion (a reasoning model may queue)
    timeout = httpx.Timeout(10.0, read=60.0)
    async with httpx.AsyncClient(transport=transport, timeout=timeout, headers=headers) as client:
        health, _ = await _get(client, f"{root}/health")
        status, models = await _get(client, f"{url.rstrip('/')}/models")
        _, metrics = await _get(client, f"{root}/metrics", text=True)
        checks = [judge_health(health), *judge_models(status, models)]
        checks += judge_metrics(metrics if isinstance(metrics, str) else None)
        chosen = model or _first_model(models)
        if chosen is not None:
            body = {"model": chosen, "max_tokens": 256, "temperature": 0,
                    "messages": [{"role": "user", "content": PROBE_PROMPT}]}  # fmt: skip
            checks += judge_probe(*await _post(client, f"{url.rstrip('/')}/chat/completions", body))
    return checks


def _first_model(models: Any) -> str | None:
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return str(data[0].get("id"))
    return None


async def _get(
    client: httpx.AsyncClient, url: str, *, text: bool = False
) -> tuple[int | None, Any]:
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return None, None
    if text:
        return response.status_code, response.text if response.status_code == 200 else None
    return response.status_code, _json(response.content)


async def _post(client: httpx.AsyncClient, url: str, body: Any) -> tuple[int | None, Any]:
    try:
        response = await client.post(url, json=body)
    except httpx.HTTPError:
        return None, None
    return response.status_code, _json(response.content)


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


# -- the table -----------------------------------------------------------------------------


def render(sections: Sequence[tuple[str, Sequence[Check]]]) -> str:
    width = max((len(c.name) for _, checks in sections for c in checks), default=10)
    lines = []
    for title, checks in sections:
        lines.append(title)
        lines += [f"  {c.verdict.upper():<5} {c.name:<{width}}  {c.detail}" for c in checks]
    return "\n".join(lines)


def failed(sections: Sequence[tuple[str, Sequence[Check]]]) -> bool:
    return any(c.verdict == "fail" for _, checks in sections for c in checks)


async def gather_upstreams(
    urls: Sequence[str], api_key: str, model: str | None
) -> list[tuple[str, list[Check]]]:
    found = await asyncio.gather(*(examine_upstream(u, api_key, model=model) for u in urls))
    return [(f"upstream {u}", checks) for u, checks in zip(urls, found, strict=True)]


# -- the gateway's own dependencies ----------------------------------------------------------


async def examine_gateway(settings: Settings) -> list[Check]:
    """Redis, the database, and the ledger's last checkpoint, as configured for this gateway."""
    checks = [await _redis(settings)]
    engine = create_engine(settings.database_url)
    try:
        checks += await _database(engine, settings)
    finally:
        await engine.dispose()
    return checks


async def _redis(settings: Settings) -> Check:
    if not settings.redis_url:
        return Check("Redis", "info", "not configured: limits and KV budget per process")
    import redis.asyncio as redis

    try:
        client = redis.Redis.from_url(
            settings.redis_url, socket_connect_timeout=2, socket_timeout=2
        )
    except ValueError as exc:
        return Check("Redis", "fail", f"REDIS_URL is not a Redis URL: {exc}")
    try:
        await client.ping()
    except (OSError, redis.RedisError) as exc:
        return Check("Redis", "fail", f"unreachable ({type(exc).__name__})")
    finally:
        await client.aclose()
    return Check("Redis", "pass", "answers")


async def _database(engine: AsyncEngine, settings: Settings) -> list[Check]:
    try:
        async with asyncio.timeout(5), engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
            note = await store.latest_checkpoint(conn) if await _has_ledger(conn) else None
            if note is None:
                return [Check("database", "pass", "answers"),
                        Check("ledger checkpoint", "info", "no checkpoint yet")]  # fmt: skip
            return [Check("database", "pass", "answers"), await _checkpoint(conn, note, settings)]
    except (OSError, TimeoutError, SQLAlchemyError) as exc:
        return [Check("database", "fail", f"unreachable ({type(exc).__name__})")]


async def _has_ledger(conn: AsyncConnection) -> bool:
    return await conn.run_sync(lambda sync: inspect(sync).has_table("ledger_checkpoints"))


async def _checkpoint(conn: AsyncConnection, note: str, settings: Settings) -> Check:
    """The newest checkpoint: signed by our key, and its root is the stored tree's root."""
    from gateway.ledgercli import KeyUnavailable, load_verifier

    try:
        checkpoint = parse_checkpoint(load_verifier(settings, None).open(note))
    except KeyUnavailable as exc:
        return Check("ledger checkpoint", "warn", str(exc))
    except NoteError as exc:
        return Check("ledger checkpoint", "fail", f"bad signature or format: {exc}")
    plan = [merkle.range_plan(0, checkpoint.size)]
    try:
        hashes = await store.node_hashes(conn, merkle.plan_nodes(plan))
        root = merkle.assemble(plan, hashes)[0]
    except merkle.ProofError as exc:
        return Check("ledger checkpoint", "fail", f"tree incomplete: {exc}")
    if root != checkpoint.root:
        detail = f"size {checkpoint.size}: the stored tree's root differs from the signed one"
        return Check("ledger checkpoint", "fail", detail)
    return Check("ledger checkpoint", "pass", f"size {checkpoint.size:,}, signed, root matches")
