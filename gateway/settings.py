"""The one typed, frozen settings object. ``os.environ`` is read here and nowhere else.

Sources, highest precedence first: keyword arguments (the CLI), environment variables with the
``THINKGATE_`` prefix, the YAML file named by ``THINKGATE_CONFIG``, the defaults below. The YAML
file uses the same names in lower case, and may also carry per-model overrides::

    models:
      qwq-32b: {reasoning_parser: think_tags}
      qwen3-coder: {reasoning_parser: qwen3, reasoning_source: upstream}
      my-model: {reasoning_format: {open: "<reason>", close: "</reason>", opened: false}}
      deepseek-r1: {effort_budgets: {low: 2048, high: 32768}, effort_enforcement: gateway}

(``reasoning_format`` overrides fields of the model's named format, ``REASONING_PARSER`` when it
names none; see ``gateway.relay.formats``; an unknown name or an impossible format stops the start
with one line naming the model and the known formats; ``effort_budgets`` replace entries of
``EFFORT_BUDGETS`` for that model, ``effort_enforcement`` says who keeps them: see
``gateway.relay.effort``)

and the policies of tenants and keys (limits, fair-share weight, priority; docs/limits.md)::

    tenants:
      acme: {rpm: 600, tpm: 2000000, weight: 3, priority: standard}
    keys:
      3f2a9c0b1d4e: {priority: critical, max_reasoning_tokens: 8192}

Policies live here rather than in the key table: they are operator configuration, reviewed and
deployed like the rest, while the table holds what ``keys create`` mints.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from gateway.relay.effort import DEFAULT_BUDGETS, DEFAULT_RULE, EFFORTS, EffortRule, Enforcement
from gateway.relay.formats import (
    FormatError,
    ReasoningField,
    ReasoningFormat,
    ReasoningSource,
    lookup,
)
from gateway.sections import (
    BatchSettings,
    LedgerSettings,
    LogSettings,
    RoutingSettings,
    SiemSettings,
    file_hint,
)
from ratelimit.fairness import MAX_WEIGHT, Priority

HttpTransport = Literal["wire", "httpx"]
S = TypeVar("S")


class FormatSpec(BaseModel):
    """A model's own markers: each field given replaces that of its named format; a field not
    given (``None`` here) keeps the named format's. ``open``/``close`` may be given as null (no
    such marker)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    open: str | None = None
    close: str | None = None
    opened: bool | None = None
    ends: tuple[str, ...] | None = None
    ends_unopened: tuple[str, ...] | None = None
    switches: tuple[str, ...] | None = None
    thinking_default: bool | None = None
    effort_switch: bool | None = None

    def apply(self, base: ReasoningFormat, name: str) -> ReasoningFormat:
        given = {
            k: getattr(self, k)
            for k in self.model_fields_set
            if getattr(self, k) is not None or k in ("open", "close")
        }
        return dataclasses.replace(base, name=name, **given)


ReasoningHistory = Literal["reasoning", "reasoning_content", "drop"]
ReasoningTurns = Literal["all", "tool_turns"]


class ModelOverride(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    reasoning_parser: str | None = None
    reasoning_source: ReasoningSource | None = None
    reasoning_format: FormatSpec | None = None
    reasoning_history: ReasoningHistory | None = None
    reasoning_turns: ReasoningTurns | None = None
    effort_budgets: dict[str, Annotated[int, Field(ge=0)]] | None = None
    effort_enforcement: Enforcement | None = None

    @field_validator("effort_budgets")
    @classmethod
    def _known_efforts(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        return _known_efforts(value)


def _known_efforts(value: dict[str, int] | None) -> dict[str, int] | None:
    unknown = sorted(set(value or {}) - set(EFFORTS))
    if unknown:
        raise ValueError(f"unknown effort {unknown[0]!r}: expected one of {', '.join(EFFORTS)}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class ModelReasoning:
    """How one model's reasoning reaches the gateway (its format, where to read it) and how
    earlier turns' reasoning is handed back to it (``history``: the assistant message field,
    or ``drop``)."""

    format: ReasoningFormat
    source: ReasoningSource
    history: ReasoningHistory = "reasoning"
    effort: EffortRule = DEFAULT_RULE
    turns: ReasoningTurns = "all"  # which earlier turns' reasoning is handed back


@dataclasses.dataclass(frozen=True, slots=True)
class PipelineSettings:
    """The settings the request pipeline reads (``gateway.pipeline``), and the per-model and
    per-key rules it asks (``Settings.pipeline`` makes it)."""

    max_body_bytes: int
    body_timeout_s: float
    default_max_tokens: int
    unknown_fields: Literal["ignore", "refuse"]
    reasoning_field: ReasoningField
    reasoning_for: Callable[[str], ModelReasoning]
    reasoning_ceiling: Callable[[str], int | None]
    priority_ceiling: Callable[[str, str], Priority]


class TenantPolicy(BaseModel):
    """A tenant's limits over all its keys (0 = unlimited), its weight in the fair share of the
    KV budget, and the highest priority its requests may ask for."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rpm: int = Field(0, ge=0)
    tpm: int = Field(0, ge=0)
    weight: int = Field(1, ge=1, le=MAX_WEIGHT)
    priority: Priority = "standard"


class KeyPolicy(BaseModel):
    """Per key (by key id): the highest priority its requests may ask for, and the most
    reasoning tokens one of its requests may spend (``gateway.relay.effort``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    priority: Priority | None = None
    max_reasoning_tokens: int | None = Field(None, ge=0)


@dataclasses.dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """What the upstream pool reads (``gateway.upstream.pool``)."""

    upstreams: tuple[str, ...]
    upstream_api_key: SecretStr
    http_transport: HttpTransport
    connect_timeout_s: float
    first_token_timeout_s: float
    idle_timeout_s: float
    max_connections: int
    models_cache_ttl_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """What admission reads: Redis, the rate limits' tenants, the KV budget
    (``gateway.admission``)."""

    redis_url: str
    ratelimit_fail: Literal["open", "closed"]
    kv_capacity_tokens: int | None
    kv_target_utilization: float
    admission_wait_ms: int
    admission_queue_max: int
    kv_lease_ttl_s: float
    tenants: Mapping[str, TenantPolicy]

    def tenant(self, tenant: str) -> TenantPolicy:
        return self.tenants.get(tenant) or _DEFAULT_TENANT


_HOME_FILES = {
    "ledger_key_file": "ledger-keys.json",
    "signing_key_file": "signing-key.pem",
    "audit_spool_file": "ledger-spool.log",
}


class WitnessConfig(BaseModel):
    """A C2SP tlog-witness the ledger submits its checkpoints to: its submission URL prefix
    and its cosigner verifier key (``<name>+<id>+<key>``, type 0x04)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    url: str = Field(pattern=r"^https?://")
    key: str

    @field_validator("key")
    @classmethod
    def _cosigner_key(cls, value: str) -> str:
        from audit.witness import CosignerKey, WitnessError

        try:
            CosignerKey.parse(value)
        except WitnessError as exc:
            raise ValueError(str(exc)) from None
        return value.strip()


class Settings(BaseSettings):
    """Every setting, each with its description (an attribute docstring): `make docs`
    generates ``docs/configuration.md`` from them (``tools/settingsdoc.py``), so the page
    cannot drift from the code. Grouped by the component that reads them."""

    model_config = SettingsConfigDict(
        env_prefix="THINKGATE_", frozen=True, extra="ignore", use_attribute_docstrings=True
    )

    # --- serving
    host: str = "127.0.0.1"
    """The address `thinkgate serve` listens on (`--host`)."""
    port: int = 8080
    """The port `thinkgate serve` listens on (`--port`)."""
    demo: bool = False
    """`--demo`: the simulator in-process, SQLite under `HOME`, a demo client and auditor key
    created once and printed with a snippet."""
    home: Path = Path("./var")
    """The directory the file settings default into (`thinkgate.db`, `ledger-keys.json`,
    `signing-key.pem`, `ledger-spool.log`) and where `--demo` keeps its keys; each file
    setting given explicitly wins. Relative to the working directory."""
    database_url: str = "sqlite+aiosqlite:///./var/thinkgate.db"
    """Keys and the ledger: an SQLAlchemy async URL, e.g. `postgresql+asyncpg://…`."""

    # --- upstream
    upstreams: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated OpenAI base URLs of the engines, e.g. `http://vllm:8000/v1` (none:
    `--demo` uses the simulator)."""
    upstream_api_key: SecretStr = SecretStr("")
    """The bearer token sent upstream."""
    http_transport: HttpTransport = "wire"
    """The upstream client: `wire` (thinkgate's own HTTP/1.1 client for everything sent to an
    engine, streams pushed to the client from the socket's read callback; `aiohttp`, its
    earlier name, still means it) or `httpx` (httpx's pool, streams read by a task)."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """Connecting to an upstream."""
    first_token_timeout_s: float = Field(300.0, gt=0)
    """Request sent → status and first bytes (reasoning models queue); for a request not
    streamed, the whole answer."""
    idle_timeout_s: float = Field(60.0, gt=0)
    """The longest silence between two upstream reads mid-stream (time the gateway holds the
    engine back for a slow client does not count)."""
    max_connections: int = Field(1000, ge=1)
    """The upstream connection pool's size."""
    models_cache_ttl_s: float = Field(10.0, ge=0)
    """How long the upstreams' `/v1/models` catalogue is cached."""

    # --- routing
    routing: Literal["least_loaded", "prefix"] | None = None
    """How an engine is chosen among those serving the model: `prefix` (the engine whose KV
    cache holds most of the prompt, from the engines' KV events, within a bounded share of the
    load; without events, the engine a session's key hashes to), or `least_loaded` (the fewest
    requests in flight). Unset: `prefix` ([Routing](routing.md))."""
    upstream_kv_events: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated ZMQ endpoints of the engines' KV event publishers, one per upstream in
    `UPSTREAMS` order, each `tcp://HOST:PORT` or `tcp://HOST:PORT;tcp://HOST:REPLAY_PORT`
    (with the replay endpoint); `auto` (or an empty item) asks the engine (vLLM's
    `GET /kv_event_sources`), `off` subscribes to none. Unset: `auto` for every upstream."""
    kv_events_silence_s: float = Field(30.0, gt=0)
    """An engine that was sent requests but published no event for this long has its part of
    the prefix index dropped (its events no longer reach the gateway) until they come again."""
    prefix_cache_sharing: Literal["tenant", "global"] = "tenant"
    """`tenant`: each tenant's requests get a `cache_salt` of their own, so no tenant's request
    reuses (or learns the timing of) another tenant's cached prompt; `global`: one cache for
    all, a client's `cache_salt` passed on as sent."""
    prefix_cache_secret: SecretStr = SecretStr("")
    """The key of the tenants' cache salts (an HMAC); the same on every replica. Unset, the
    salts are still per tenant and out of clients' reach, but computable by someone who can
    reach an engine directly."""

    # --- reasoning
    reasoning_parser: str = "deepseek_r1"
    """The model family's reasoning format, named as vLLM names its `--reasoning-parser`:
    `deepseek_r1`, `deepseek_v3`, `deepseek_v4`, `qwen3`, `kimi_k2`, `kimi_k3`, `minimax_m2`,
    `glm45`, `openai_gptoss`; or `think_tags` (explicit tags, output starts in content),
    `none` ([Reasoning formats](reasoning.md))."""
    reasoning_source: ReasoningSource = "text"
    """`text`: the engine runs no reasoning parser, thinkgate splits the text (and still
    switches to a reasoning field that appears); `upstream`: the engine runs
    `--reasoning-parser`, its fields are trusted from the first byte. **Set `upstream` when
    vLLM runs a parser.**"""
    reasoning_field: ReasoningField = "reasoning_content"
    """Where a visible key gets the trace: `reasoning_content`, `reasoning` or `both`."""
    reasoning_history: ReasoningHistory = "reasoning"
    """Where an earlier turn's reasoning goes in the assistant message sent upstream:
    `reasoning` (vLLM 0.32 reads only that), `reasoning_content` (SGLang, DeepSeek's API) or
    `drop`; per model `reasoning_history`."""
    reasoning_turns: ReasoningTurns = "all"
    """Which earlier assistant turns keep their reasoning on the way upstream: `all`, or
    `tool_turns` (only the assistant turns after the last user message: the tool-call loop in
    progress); per model `reasoning_turns`."""
    effort_budgets: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: dict(DEFAULT_BUDGETS)
    )
    """Reasoning tokens per `reasoning_effort` (JSON; the entries given replace the
    defaults'); per model `effort_budgets` and `effort_enforcement` (`engine`, `gateway`,
    `none`); see [Reasoning effort](responses.md#reasoning-effort)."""
    reasoning_answer_share: float = Field(0.25, gt=0, lt=1)
    """The share of a request's output limit always kept for the answer: a budget never takes
    more than the rest."""
    models: Mapping[str, ModelOverride] = Field(default_factory=dict)
    """Per-model reasoning settings, in the YAML file (below)."""

    # --- responses and conversations
    reasoning_token_ttl_s: float = Field(30 * 86400.0, gt=0)
    """How long an `encrypted_content` reasoning token can be opened (30 days)."""
    responses_retention_s: float = Field(30 * 86400.0, gt=0)
    """How long a stored response is kept (30 days); background responses, their stream
    events and conversations too."""
    background_max_per_key: int = Field(16, ge=1)
    """Background responses one key may have running at once (429 beyond)."""
    background_max_per_tenant: int = Field(256, ge=1)
    """Background responses one tenant may have running at once (429 beyond)."""
    background_stale_s: float = Field(30.0, ge=2)
    """A replica silent this long is presumed dead: another marks its running background
    responses `failed` and records its cut streams as `replica_lost`."""

    # --- batches (docs/batches.md)
    batch_max_concurrency: int = Field(64, ge=0)
    """Batch lines one replica runs at once, at most; fewer while KV admission sheds them
    (lines run at `sheddable` priority in the capacity interactive traffic leaves). `0`: this
    replica runs none (it still takes batches; replicas that run lines take them from the
    shared queue within a second), so interactive replicas share no CPU with batch lines
    (docs/batches.md)."""
    batch_max_active_per_tenant: int = Field(100, ge=1)
    """Batches one tenant may have in progress at once (429 beyond)."""
    batch_max_queued_lines_per_tenant: int = Field(200_000, ge=1)
    """Lines one tenant may have waiting across its batches (429 beyond)."""
    batch_max_lines: int = Field(50_000, ge=1)
    """Lines (requests) one batch may hold (OpenAI's limit; Anthropic's is 100,000)."""
    files_max_bytes: int = Field(200 << 20, ge=1024)
    """An uploaded file above it gets 413 (OpenAI's limit for batch input files)."""
    files_retention_s: float = Field(30 * 86400.0, gt=0)
    """How long files and batches are kept (30 days); the tenant's ledger retention cuts it
    shorter, as for stored responses."""
    batch_lease_s: float = Field(30.0, ge=2)
    """A batch line a replica claimed and did not renew for this long is taken over by
    another; its first attempt is recorded `replica_lost`."""

    # --- client side
    max_body_bytes: int = Field(4 << 20, ge=1024)
    """Request bodies above it get 413."""
    body_timeout_s: float = Field(30.0, gt=0)
    """The whole request body must arrive within it once the headers are in, else 408 (a
    slow-loris upload cannot hold a request open); the key is checked before any body is
    read."""
    max_header_bytes: int = Field(64 << 10, ge=1024)
    """All request headers together; above it, 431."""
    max_client_connections: int = Field(4096, ge=1)
    """Connections and requests at once per process (uvicorn's `limit_concurrency`); past it,
    503. Bounds what idle or half-sent connections can hold."""
    max_sse_event_bytes: int = Field(1 << 20, ge=1024)
    """An upstream SSE event above it ends the stream with an error event."""
    unknown_fields: Literal["ignore", "refuse"] = "ignore"
    """A request field no API reference names: accepted, counted and named in the
    `x-thinkgate-ignored` header (`ignore`), or refused with a 400 naming it (`refuse`, which
    also refuses a `max_tokens` past the context and built-in tools rather than clamping or
    dropping them)."""
    keepalive_s: float = Field(15.0, gt=0)
    """After this much silence on a stream (reasoning withheld from a hidden key), an SSE
    comment `: keep-alive` goes out so proxies keep the connection."""
    key_cache_ttl_s: float = Field(5.0, ge=0)
    """How long a key lookup is cached per process: a revocation made elsewhere takes effect
    within this bound (at once on the replica that revokes). A key in use is reloaded beside
    its requests once its entry is half this old, and requests that miss together share one
    lookup, so no request of a busy key waits for the database."""
    key_cache_stale_s: float = Field(900.0, ge=0)
    """While the database is away, a key this process found within this many seconds is
    still served (its records spooled); other keys get 503 `database_unavailable`."""
    prices_file: Path | None = None
    """A YAML file of prices per model, per million tokens ([Spend](spend.md)): each
    exchange's cost goes in its ledger record, `thinkgate spend report` sums them; a file
    that cannot be used stops `serve` with exit 2, the field named. Without it, nothing is
    priced."""
    unpriced_models: Literal["refuse", "allow"] = "refuse"
    """With `PRICES_FILE`, a request for a model it does not price: refused (400
    `model_not_priced`, naming it), or served without a cost (`allow`)."""
    guardrails_file: Path | None = None
    """A YAML file of guardrail policies that redact, block or flag matches in the reasoning
    and the answer as they stream ([Guardrails](guardrails.md)); a file that cannot be used
    stops `serve` with exit 2, its line and field named."""

    # --- admission
    redis_url: str = ""
    """With it (e.g. `redis://127.0.0.1:6379/0`), rate limits and the KV budget are shared by
    every replica; empty, each process keeps its own."""
    ratelimit_fail: Literal["open", "closed"] = "open"
    """Redis away: `open` falls back to in-process limits and budget per replica (logged once
    per outage, retried every second); `closed` answers 503."""
    kv_capacity_tokens: int | None = None
    """KV capacity per engine in tokens; unset, read as `(num_gpu_blocks − 1) × block_size`
    from each engine's `vllm:cache_config_info` (an engine whose capacity is unknown is not
    KV-limited); `thinkgate capacity` computes it for a deployment."""
    kv_target_utilization: float = Field(0.85, gt=0, le=1)
    """The share of the capacity admitted when the engine is healthy: vLLM preempts when its
    cache fills, so admission keeps headroom for prompts that grow and estimates that were
    low."""
    admission_wait_ms: int = 2000
    """How long a request waits for KV budget before 429 `kv_budget_exhausted`."""
    admission_queue_max: int = Field(1024, ge=0)
    """The most requests waiting for KV budget per process; beyond it, 429 at once."""
    kv_lease_ttl_s: float = Field(30.0, ge=3)
    """How long a request's KV lease lives without renewal: a running request renews it every
    third of this; a replica that dies holds its requests' KV budget this long at most.
    Shorter frees a dead replica's share sooner, for more frequent renewals in Redis; but a
    Redis outage longer than two thirds of it lets the running requests' leases lapse, and
    admission then counts their budget as free."""
    default_max_tokens: int = 4096
    """The `max_tokens` assumed for reservations when a request sets none."""
    tenants: Mapping[str, TenantPolicy] = Field(default_factory=dict)
    """Policies by tenant (`rpm`, `tpm`, `weight`, `priority`), usually in the YAML file; see
    [Rate limits and KV admission](limits.md)."""
    keys: Mapping[str, KeyPolicy] = Field(default_factory=dict)
    """Policies by key id (`priority`, `max_reasoning_tokens`), usually in the YAML file."""

    # --- ledger
    audit_mode: Literal["strict", "async"] = "strict"
    """`strict`: a response completes (`[DONE]`, or the JSON body) only once its record is
    durable (committed, or fsync'd to the spool); `async`: records are queued and committed in
    batches (a crash loses at most the queue)."""
    audit_capture: Literal["full", "reasoning", "metadata"] = "full"
    """What the encrypted body holds: `full` (messages, parameters, reasoning, answer),
    `reasoning` (reasoning and answer, not the prompt), `metadata` (nothing: header only)."""
    audit_fail: Literal["closed", "open"] = "closed"
    """While neither the database nor the spool can take records: `closed` refuses requests
    with 503 `ledger_unavailable`; `open` serves them and logs each lost record."""
    audit_origin: str = Field("", pattern=r"^[^\s+]*$")
    """The log's name: the first line of every checkpoint, the name of its signing key (no
    spaces or `+`). Empty: the log's own, that of its stored checkpoints, or for a new log
    `thinkgate/<12 hex digits of its signing key's SHA-256>`."""
    audit_spool_file: Path = Path("./var/ledger-spool.log")
    """Where sealed records wait while the database is away (append-only, fsync'd,
    checksummed); each worker process holds a file of its own beside it (`<stem>.N<suffix>`)."""
    audit_batch_max: int = Field(1024, ge=1, le=10_000)
    """The most records per group commit."""
    checkpoint_interval_ms: int = Field(0, ge=0)
    """`0`: a checkpoint signed per commit; `N`: one per `N` ms over everything committed in
    it, each stamped (`TSA_URL`) and offered to the witnesses. Records are durable before
    `[DONE]` either way; a record's inclusion proof is there once the next checkpoint is
    out. The deploy manifests set `1000`."""
    ledger_key_file: Path = Path("./var/ledger-keys.json")
    """Key-encryption keys by id (`thinkgate ledger init`; `--demo` creates it with a warning;
    otherwise the gateway refuses to start without it)."""
    signing_key_file: Path = Path("./var/signing-key.pem")
    """The Ed25519 key that signs checkpoints (same rules)."""
    retention_days: int | None = Field(None, ge=1)
    """Records of a tenant become unreadable (their UTC day's data key destroyed) once older
    than this many days, unless a legal hold keeps them; unset, kept forever; `thinkgate
    ledger retention set` overrides it per tenant ([Records management](records.md))."""
    retention_interval_s: float = Field(3600.0, gt=0)
    """How often each replica runs a retention round."""

    # --- witnesses and timestamps
    witnesses: tuple[WitnessConfig, ...] = ()
    """The witnesses each new checkpoint is sent to, a list of `{url, key}` (the witness's URL
    prefix and its cosigner key); YAML, or JSON in the variable."""
    witness_interval_s: float = Field(1.0, gt=0)
    """How often the latest checkpoint is looked at for witnesses that have not cosigned it."""
    witness_quorum: int | None = Field(None, ge=1)
    """How many witnesses must cosign a checkpoint before `/tlog/checkpoint` publishes it
    (unset: all of `WITNESSES`)."""
    tsa_url: str = ""
    """An RFC 3161 Time-Stamp Authority: the latest checkpoint is stamped every
    `TSA_INTERVAL_S`; witnesses are then sent stamped checkpoints only, and `/tlog/checkpoint`
    publishes only stamped ones."""
    tsa_roots_file: Path | None = None
    """PEM roots a stamp must chain to before it is kept (unset: the stamp's message and nonce
    are still checked)."""
    tsa_interval_s: float = Field(5.0, gt=0)
    """How often the latest checkpoint is looked at for a timestamp."""
    tlog_public_entries: bool = False
    """Serve tlog-tiles entry bundles to anyone, not only to auditors of tenant `*` (they hold
    every tenant's record headers)."""
    console_enabled: bool = True
    """Serve the auditor console at `/console/`
    ([The auditor console](auditors.md#the-auditor-console)); off removes its routes."""

    # --- SIEM export
    siem_syslog_url: str = Field("", pattern=r"^$|^(tcp|tls)://[^/\s]+:\d+$")
    """`tcp://host:port` or `tls://host:port`: every ledger record's metadata (never content)
    as an OCSF API Activity event, RFC 5424 octet-counted, at least once, resumed after a
    restart ([SIEM export](siem.md))."""
    siem_file: Path | None = None
    """The same events as JSON lines, appended and fsync'd."""
    siem_hec_url: str = ""
    """A Splunk HTTP Event Collector, its full `/services/collector/event` URL."""
    siem_hec_token: SecretStr | None = None
    """The HTTP Event Collector's token."""
    siem_tls_ca_file: Path | None = None
    """The CA for `tls://` syslog and an `https://` collector (unset: the system's trust
    store)."""
    siem_batch: int = Field(500, ge=1, le=10_000)
    """Records per batch: the at-least-once window."""
    siem_interval_s: float = Field(1.0, gt=0)
    """The pause when the export has caught up."""
    siem_max_backlog: int = Field(1_000_000, ge=1)
    """How far behind the ledger before the oldest events are skipped (counted in
    `thinkgate_siem_dropped_events_total`, alerted)."""
    siem_format: Literal["ocsf"] = "ocsf"
    """The events' format, the only one."""

    # --- telemetry
    metrics_tenants: int = Field(20, ge=0)
    """Tenants beyond those named in `tenants` that get their own metrics label; later ones
    share `other` (bounded cardinality)."""
    metrics_token: SecretStr = SecretStr("")
    """The bearer token `/metrics` requires; empty, it is open."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """A second listener serving `/metrics` without authentication; `0`, none."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe log line written."""
    log_format: Literal["auto", "json", "text"] = "auto"
    """`auto`: text on a terminal, JSON lines otherwise (a log pipeline's input); or `json`,
    `text` ([Operating thinkgate](operating.md))."""
    prometheus_multiproc_dir: str = Field("", validation_alias="PROMETHEUS_MULTIPROC_DIR")
    """prometheus-client's own variable (no prefix): set, the workers share metrics through
    files in it (`thinkgate serve --workers N` sets it)."""

    # --- tools
    bench_key: SecretStr = SecretStr("")
    """The client key `thinkgate bench` sends when `--api-key` is not given."""
    test_redis_url: str = "redis://127.0.0.1:6379/15"
    """The Redis the tests use."""
    test_database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
    """The PostgreSQL database the tests create theirs beside."""

    @field_validator("http_transport", mode="before")
    @classmethod
    def _wire_was_aiohttp(cls, value: Any) -> Any:
        """``aiohttp``, the earlier name of the default, still names it (configurations that
        set it keep working; the aiohttp library is no longer used)."""
        return "wire" if value == "aiohttp" else value

    _reasoning: dict[str, ModelReasoning] = PrivateAttr(default_factory=dict)
    _default: ModelReasoning = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _paths_under_home(cls, data: Any) -> Any:
        """The database, key files and spool not set otherwise live in ``home``."""
        if not isinstance(data, dict):
            return data
        given = str(data.get("home") or "./var")
        home = Path(given)
        for name, file in _HOME_FILES.items():
            if data.get(name) in (None, ""):
                data[name] = home / file
        if data.get("database_url") in (None, ""):  # as written: ./var stays ./var
            data["database_url"] = f"sqlite+aiosqlite:///{given.rstrip('/')}/thinkgate.db"
        return data

    def file_hint(self, name: str) -> str:
        """How to point the file setting ``name`` elsewhere (``gateway.sections.file_hint``)."""
        return file_hint(self.home, name)

    @property
    def demo_keys_file(self) -> Path:
        """Where ``--demo`` keeps its demo secrets (``gateway.cli.demo``)."""
        return self.home / "demo-keys.json"

    @model_validator(mode="after")
    def _quorum_of_witnesses(self) -> Settings:
        if self.witness_quorum is not None and self.witness_quorum > len(self.witnesses):
            raise ValueError(f"WITNESS_QUORUM is {self.witness_quorum}, but WITNESSES names "
                             f"{len(self.witnesses)}")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _kv_events_per_upstream(self) -> Settings:
        events = self.upstream_kv_events
        if events and len(events) != len(self.upstreams):
            raise ValueError(f"UPSTREAM_KV_EVENTS names {len(events)} endpoints for "
                             f"{len(self.upstreams)} UPSTREAMS: one per upstream, in order "
                             "(`auto` or `off` for one without)")  # fmt: skip
        for item in events:
            for endpoint in item.split(";") if item not in ("", "auto", "off") else ():
                if not endpoint.startswith("tcp://") or ":" not in endpoint[6:]:
                    raise ValueError(f"UPSTREAM_KV_EVENTS: {endpoint!r} is not tcp://HOST:PORT")
        return self

    @property
    def publish_policy(self) -> tuple[tuple[str, ...], int, bool]:
        """What a checkpoint needs before ``/tlog/checkpoint`` publishes it: cosignatures by
        ``quorum`` of these witness names, and a timestamp if a TSA is configured."""
        from audit.witness import CosignerKey  # the key format's one parser (validated above)

        names = tuple(CosignerKey.parse(w.key).name for w in self.witnesses)
        quorum = len(names) if self.witness_quorum is None else self.witness_quorum
        return names, quorum, bool(self.tsa_url)

    @model_validator(mode="after")
    def _resolve_reasoning(self) -> Settings:
        """Resolve every model's format once, so a bad one stops the start (not a request)."""
        self._resolve_all()
        return self

    def _resolve_all(self) -> None:
        try:
            self._default = self._model_reasoning("", ModelOverride())
            for model, override in self.models.items():
                self._reasoning[model] = self._model_reasoning(model, override)
        except FormatError as exc:
            raise ValueError(str(exc)) from None

    def with_default_models(self, models: Mapping[str, ModelOverride]) -> Settings:
        """A copy whose ``models`` add ``models`` under the operator's own entries (the demo's
        simulated models), every entry resolved again."""
        copy = self.model_copy(update={"models": {**models, **self.models}})
        copy._reasoning = {}  # model_copy shares the private dict: never mutate the original's
        copy._resolve_all()
        return copy

    def _model_reasoning(self, model: str, override: ModelOverride) -> ModelReasoning:
        where = model or None
        if override.reasoning_parser is not None:
            fmt = lookup(override.reasoning_parser, model=where)
        else:
            fmt = lookup(self.reasoning_parser)
        if override.reasoning_format is not None:
            fmt = override.reasoning_format.apply(fmt, model or fmt.name)  # errors name it
        source = override.reasoning_source
        explicit = source is not None or (not model and "reasoning_source" in self.model_fields_set)
        source = source or self.reasoning_source
        if not fmt.text and source == "text":
            if explicit:
                who = f"model {model!r}" if model else "REASONING_SOURCE"
                raise FormatError(
                    f"{who}: reasoning parser {fmt.name!r} has no text markers (the engine "
                    "separates it): use reasoning_source 'upstream'"
                )
            source = "upstream"
        enforcement = override.effort_enforcement
        if enforcement == "gateway" and not fmt.splits:
            raise FormatError(
                f"model {model!r}: effort_enforcement 'gateway' needs text markers to close "
                f"the reasoning with, and {fmt.name!r} has none: use 'engine' or 'none'"
            )
        if enforcement is None:  # the engine's parser keeps it, else the gateway where it can
            enforcement = "engine" if source == "upstream" else "gateway" if fmt.splits else "none"
        budgets = {**DEFAULT_BUDGETS, **self.effort_budgets, **(override.effort_budgets or {})}
        effort = EffortRule(budgets, enforcement, self.reasoning_answer_share)
        history = override.reasoning_history or self.reasoning_history
        turns = override.reasoning_turns or self.reasoning_turns
        return ModelReasoning(fmt, source, history, effort, turns)

    @field_validator("effort_budgets")
    @classmethod
    def _known_default_efforts(cls, value: dict[str, int]) -> dict[str, int]:
        _known_efforts(value)
        return value

    def reasoning_ceiling(self, key_id: str) -> int | None:
        """The most reasoning tokens one request of this key may spend (``None``: no ceiling)."""
        key = self.keys.get(key_id)
        return key.max_reasoning_tokens if key is not None else None

    @field_validator("upstream_kv_events", mode="before")
    @classmethod
    def _split_kv_events(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(","))
        return value

    @field_validator("upstreams", mode="before")
    @classmethod
    def _split_upstreams(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(u.strip().rstrip("/") for u in value.split(",") if u.strip())
        if isinstance(value, list | tuple):
            return tuple(str(u).rstrip("/") for u in value)
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = os.environ.get("THINKGATE_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if config_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)

    def section(self, kind: type[S]) -> S:
        """A section: the settings of ``kind``'s fields (a frozen dataclass of some of these
        fields, by name), what one component receives instead of the whole object."""
        return kind(**{f.name: getattr(self, f.name) for f in dataclasses.fields(kind)})  # type: ignore[arg-type]

    @property
    def upstream(self) -> UpstreamSettings:
        return self.section(UpstreamSettings)

    @property
    def routing_section(self) -> RoutingSettings:
        return self.section(RoutingSettings)

    @property
    def batches(self) -> BatchSettings:
        return self.section(BatchSettings)

    @property
    def logs(self) -> LogSettings:
        return self.section(LogSettings)

    @property
    def admission(self) -> AdmissionSettings:
        return self.section(AdmissionSettings)

    @property
    def ledger(self) -> LedgerSettings:
        return self.section(LedgerSettings)

    @property
    def siem(self) -> SiemSettings:
        return self.section(SiemSettings)

    @property
    def pipeline(self) -> PipelineSettings:
        """The request pipeline's section."""
        return PipelineSettings(
            self.max_body_bytes, self.body_timeout_s, self.default_max_tokens,
            self.unknown_fields, self.reasoning_field, self.reasoning_for,
            self.reasoning_ceiling, self.priority_ceiling,
        )  # fmt: skip

    def tenant(self, tenant: str) -> TenantPolicy:
        return self.tenants.get(tenant) or _DEFAULT_TENANT

    def priority_ceiling(self, key_id: str, tenant: str) -> Priority:
        """The highest priority a key's requests may ask for: its own policy, else its
        tenant's."""
        key = self.keys.get(key_id)
        if key is not None and key.priority is not None:
            return key.priority
        return self.tenant(tenant).priority

    def reasoning_for(self, model: str) -> ModelReasoning:
        """The model's reasoning format and source (its YAML entry, else the defaults)."""
        # Straight from pydantic's private dict: ``self._reasoning`` goes through
        # ``BaseModel.__getattr__`` (Python code), measured at 3 % of a request's CPU.
        private = self.__pydantic_private__
        assert private is not None
        found: ModelReasoning | None = private["_reasoning"].get(model)
        return found or private["_default"]


_DEFAULT_TENANT = TenantPolicy()
