"""``thinkgate doctor``: the production-readiness checklist, automated where it can be seen from
outside the engine.

Each check is a ``Check(name, verdict, detail)`` with verdict ``pass``, ``warn``, ``fail`` or
``info``; the command prints them as a table and exits 1 if any failed. The judging functions
are pure (data in, checks out); ``examine_upstream`` and ``examine_gateway`` only fetch.

Upstream (per URL): ``/health`` and ``/v1/models`` answer; the model and its ``max_model_len``;
from ``vllm:cache_config_info``: prefix caching on, KV dtype and block size, KV capacity
(``(num_gpu_blocks − 1) × block_size``); the KV-usage metric under vLLM's new name
(``vllm:kv_cache_usage_perc``) or only the old one; one tiny completion, to see where the
probed model's reasoning comes from, judged against how this gateway is configured to read it
(``Settings.reasoning_for(model)``):

- a ``reasoning``/``reasoning_content`` string in the message (even ``""``): the engine runs a
  reasoning parser (``--reasoning-parser``), so ``reasoning_source: upstream`` is needed. A
  ``null`` field says nothing: vLLM writes ``"reasoning": null`` in every message, parser or
  not (docs/development.md, "Against real vLLM");
- a close marker of a built-in text format (``gateway.relay.formats.BUILTIN``: ``</think>``,
  Kimi K3's ``<|close|>think<|sep|>``, …) or, cut short, an open one in the content: the engine
  leaves the markers in the text, so ``reasoning_source: text`` with the ``REASONING_PARSER`` that
  fits (``deepseek_r1`` when the template opened the block or the output starts with it,
  ``think_tags`` when text comes before ``<think>``, ``kimi_k3`` for K3's markers);
- neither, finished: no reasoning, and the content must stay the answer; cut at
  ``max_tokens``: inconclusive (a warning).

Configured and needed agree: pass (in ``text``, the configured format must split the probe as the
fitting parser does, so ``qwen3`` passes for R1's tags); they disagree: fail, naming the setting.
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

from audit import merkle, store
from audit.note import NoteError, parse_checkpoint
from audit.sqlasync import AsyncConnection, AsyncEngine
from gateway.db import create_engine
from gateway.relay.choice import ChoiceState
from gateway.relay.formats import BUILTIN, ReasoningFormat, lookup
from gateway.settings import ModelReasoning, Settings
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


def judge_metrics(text: str | None, configured: int | None = None) -> list[Check]:
    """The engine's metrics; ``configured``: the ``KV_CAPACITY_TOKENS`` already set (no advice
    to set what is set)."""
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
        if configured:
            checks.append(Check("vllm:cache_config_info", "pass",
                                f"absent; KV_CAPACITY_TOKENS={configured:,} is set"))  # fmt: skip
        else:
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


def judge_probe(
    status: int | None, body: Any, model: str, configured: ModelReasoning
) -> list[Check]:
    """What one tiny completion of ``model`` says about its reasoning, against how the gateway
    is configured to read it (``Settings.reasoning_for(model)``)."""
    message = _message(body)
    if status != 200 or message is None:
        got = "unreachable" if status is None else str(status)
        return [Check("probe completion", "fail", f"{got}: {_error(body)}")]
    verdict, detail = _judge_reasoning(model, message, _finish_reason(body), configured)
    return [Check("probe completion", "pass", "answered"),
            Check(f"reasoning of {model}", verdict, detail)]  # fmt: skip


def _judge_reasoning(
    model: str, message: dict[str, Any], finish: Any, configured: ModelReasoning
) -> tuple[Verdict, str]:
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    if _separates(message):
        return _separated(model, configured)
    fitting = _fitting_parser(content)
    if fitting is not None:
        return _in_text(model, content, fitting, configured)
    if finish == "length":
        # Cut off before any marker: a template that opened <think> (R1) looks exactly like this.
        return ("warn", "inconclusive: the probe hit max_tokens before any marker; if the "
                        "template opens <think>, reasoning_source: text with REASONING_PARSER="
                        f"deepseek_r1 (configured: {configured.source}, REASONING_PARSER="
                        f"{configured.format.name})")  # fmt: skip
    return _no_reasoning(model, content, configured)


def _separates(message: dict[str, Any]) -> bool:
    """A reasoning string, even empty (vLLM's deepseek_r1 parser gives ``""`` when the output
    starts with ``</think>``): the engine's parser ran. ``null`` is in every vLLM message."""
    return any(isinstance(message.get(key), str) for key in ("reasoning_content", "reasoning"))


def _separated(model: str, configured: ModelReasoning) -> tuple[Verdict, str]:
    if configured.source == "upstream":
        return ("pass", "upstream: the engine separates reasoning (--reasoning-parser), "
                        "as configured")  # fmt: skip
    return ("fail", "configured text, but the engine separates reasoning (--reasoning-parser): "
                    "a hidden key would get no answer when reasoning is empty; set "
                    f"reasoning_source: upstream for model {model}")  # fmt: skip


def _in_text(
    model: str, content: str, fitting: tuple[str, str], configured: ModelReasoning
) -> tuple[Verdict, str]:
    parser, marker = fitting
    if configured.source == "upstream":
        return ("fail", f"configured upstream, but the engine leaves markers in the text "
                        f"({marker}): reasoning would reach hidden keys as content; set "
                        f"reasoning_source: text and REASONING_PARSER={parser} for model "
                        f"{model}, or start the engine with a --reasoning-parser")  # fmt: skip
    ours = configured.format.name
    if _gateway_split(configured.format, content) == _gateway_split(lookup(parser), content):
        return ("pass", f"text: {marker} in the content, split by REASONING_PARSER={ours} "
                        "as configured")  # fmt: skip
    return ("fail", f"configured text with REASONING_PARSER={ours}, but {marker} in the "
                    f"content wants REASONING_PARSER={parser}: set it for model "
                    f"{model}")  # fmt: skip


def _no_reasoning(model: str, content: str, configured: ModelReasoning) -> tuple[Verdict, str]:
    if configured.source == "upstream":
        return "pass", "no reasoning in the probe; configured upstream: the content is the answer"
    ours = configured.format.name
    if _gateway_split(configured.format, content) == ("", content):
        return "pass", f"no reasoning in the probe; REASONING_PARSER={ours} leaves the answer whole"
    return ("fail", f"no reasoning in the probe, but configured text with REASONING_PARSER="
                    f"{ours} takes this answer for reasoning (hidden keys get none of it): set "
                    f"REASONING_PARSER=none for model {model} if it does not reason, or "
                    "reasoning_source: upstream if the engine runs a reasoning parser")  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Markers:
    """The close marker of built-in text formats, their open marker, and the parser that fits
    when the block was opened (by the template, or at the output's start) or not."""

    open: str
    close: str
    opened: str
    unopened: str


def _marker_families() -> tuple[_Markers, ...]:
    families: dict[str, list[ReasoningFormat]] = {}
    for fmt in BUILTIN.values():
        if fmt.splits and fmt.close:
            families.setdefault(fmt.close, []).append(fmt)
    found = []
    for close, fmts in families.items():
        opened = next((f for f in fmts if f.opened), fmts[0])  # in BUILTIN order: deepseek_r1
        unopened = next((f for f in fmts if not f.opened), opened)  # think_tags
        found.append(_Markers(opened.open or "", close, opened.name, unopened.name))
    return tuple(found)


_MARKERS = _marker_families()  # </think> (deepseek_r1, think_tags), K3's (kimi_k3)


def _fitting_parser(content: str) -> tuple[str, str] | None:
    """``(parser, marker)``: the parser that splits ``content`` right, and the marker seen."""
    closes = [(content.find(m.close), m) for m in _MARKERS if m.close in content]
    if closes:
        at, family = min(closes, key=lambda found: found[0])
        # Only the text before the first close marker says how the block was opened; an open
        # marker after it is part of the answer (think_tags would wrongly reopen reasoning there).
        before = content[:at]
        opened = family.open not in before or before.lstrip().startswith(family.open)
        return (family.opened if opened else family.unopened), family.close
    opens = [(content.find(m.open), m) for m in _MARKERS if m.open and m.open in content]
    if opens:  # an open marker and no close: cut inside reasoning the output opened itself
        family = min(opens, key=lambda found: found[0])[1]
        return family.unopened, family.open
    return None


def _gateway_split(fmt: ReasoningFormat, content: str) -> tuple[str, str]:
    """``(reasoning, content)`` as the gateway splits the probe's text in ``fmt``, through the
    same ``ChoiceState`` as a request; the probe asks nothing, so the format's default decides
    whether it thinks."""
    state = ChoiceState.start(fmt, "text", thinking=fmt.thinking({}), repair_leak=False)
    return state.take(content, None, True)


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
    url: str, settings: Settings, api_key: str = "",
    transport: httpx.AsyncBaseTransport | None = None, model: str | None = None,
) -> list[Check]:  # fmt: skip
    """Every upstream check for the OpenAI base URL ``url`` (``http://vllm:8000/v1``); the
    probe is judged against ``settings``' reasoning configuration for the probed model."""
    root = url.rstrip("/").removesuffix("/v1")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    # 10 s per request, 60 s for the probe completion (a reasoning model may queue)
    timeout = httpx.Timeout(10.0, read=60.0)
    async with httpx.AsyncClient(transport=transport, timeout=timeout, headers=headers) as client:
        health, _ = await _get(client, f"{root}/health")
        status, models = await _get(client, f"{url.rstrip('/')}/models")
        _, metrics = await _get(client, f"{root}/metrics", text=True)
        checks = [judge_health(health), *judge_models(status, models)]
        checks += judge_metrics(metrics if isinstance(metrics, str) else None,
                                settings.kv_capacity_tokens)  # fmt: skip
        chosen = model or _first_model(models)
        if chosen is not None:
            body = {"model": chosen, "max_tokens": 256, "temperature": 0,
                    "messages": [{"role": "user", "content": PROBE_PROMPT}]}  # fmt: skip
            answer = await _post(client, f"{url.rstrip('/')}/chat/completions", body)
            checks += judge_probe(*answer, chosen, settings.reasoning_for(chosen))
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
    urls: Sequence[str], api_key: str, model: str | None, settings: Settings | None = None
) -> list[tuple[str, list[Check]]]:
    """Every upstream's checks; the probes are judged against ``settings`` (the gateway's
    configuration, ``Settings()`` when not given, as the command builds it)."""
    settings = settings or Settings()
    found = await asyncio.gather(
        *(examine_upstream(u, settings, api_key, model=model) for u in urls)
    )
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
    from gateway.cli.ledger import KeyUnavailable, load_verifier

    named = settings.model_copy(update={"audit_origin": settings.audit_origin
                                        or note.split("\n", 1)[0]})  # fmt: skip
    try:
        checkpoint = parse_checkpoint(load_verifier(named, None).open(note))
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
