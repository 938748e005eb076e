"""The ``thinkgate`` command (docs/commands.md): each subcommand is a small function here."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gateway.cli import preflight, records, spend, workers
from gateway.settings import Settings

_DESCRIPTION = (
    "thinkgate: the gateway for self-hosted reasoning models. Commands: serve, sim, keys, "
    "ledger, capacity, doctor, bench, witness; 'thinkgate COMMAND --help' for one. Settings "
    "come from THINKGATE_* variables or the YAML file THINKGATE_CONFIG names "
    "(docs/configuration.md)."
)


def _yaml_error(exc: Exception) -> bool:
    """Whether ``exc`` is PyYAML's (THINKGATE_CONFIG is not YAML). PyYAML is imported only
    where a file is read, so an error of it can only be when it is loaded."""
    yaml = sys.modules.get("yaml")
    return yaml is not None and isinstance(exc, yaml.YAMLError)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result: int = args.func(args)
    except ValidationError as exc:  # the operator's settings: one line, no traceback
        if exc.title != "Settings":
            raise
        print(f"thinkgate: invalid configuration: {config_problem(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not _yaml_error(exc):
            raise
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        print(f"thinkgate: invalid configuration: {os.environ.get('THINKGATE_CONFIG')} is not "
              f"valid YAML{where}", file=sys.stderr)  # fmt: skip
        return 2
    return result


def config_problem(exc: ValidationError) -> str:
    """A settings error as one line: where (``models.my-model``) and what."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


class _Parser(argparse.ArgumentParser):
    """Every command's help shows its defaults (subcommands are made of this class too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="thinkgate", description=_DESCRIPTION)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    _serve_parsers(sub)
    _keys_parser(sub)
    _ledger_parser(sub)
    spend.add_parser(sub, _time_arg)
    spend.add_budget_parser(sub)
    _capacity_parser(sub)
    _tool_parsers(sub)
    _witness_parser(sub)
    return parser


def _serve_parsers(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", default=None, help="address to listen on (HOST: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (PORT: 8080)")
    serve.add_argument("--upstream", action="append", default=None, metavar="URL",
                       help="an engine's OpenAI base URL, repeatable (UPSTREAMS)")  # fmt: skip
    serve.add_argument(
        "--workers",
        type=workers.parse,
        default=workers.AUTO,
        help="worker processes, or auto: one per usable CPU (with REDIS_URL)",
    )
    serve.add_argument("--demo", action="store_true", help="built-in simulator, demo keys")
    serve.set_defaults(func=cmd_serve)

    sim = sub.add_parser("sim", help="run the vLLM simulator alone")
    sim.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sim.add_argument("--port", type=int, default=8000, help="port")
    sim.add_argument("--ttft-ms", type=float, default=200.0, help="time to the first token")
    sim.add_argument("--itl-ms", type=float, default=20.0, help="time per further token")
    sim.add_argument("--kv-capacity-tokens", type=int, default=65536,
                     help="the KV cache it reports")  # fmt: skip
    sim.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    sim.add_argument("--kv-events", metavar="tcp://HOST:PORT",
                     help="publish KV cache events there (vLLM's --kv-events-config)")  # fmt: skip
    sim.add_argument("--kv-events-replay", metavar="tcp://HOST:PORT",
                     help="answer KV event replay requests there")  # fmt: skip
    sim.add_argument("--prefill-tokens-per-s", type=float, default=0.0,
                     help="prefill speed: the first token waits for the uncached prompt "
                          "tokens (0: no wait)")  # fmt: skip
    sim.add_argument(
        "--prompt-cache",
        action="store_true",
        help="simulate the prefix cache (cached tokens in usage) without events",
    )
    sim.add_argument("--access-log", action="store_true", help="log each request")
    sim.set_defaults(func=cmd_sim)


def _keys_parser(sub: Any) -> None:
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(required=True)
    create = keys.add_parser("create", help="create a key; the secret is the last line")
    create.add_argument("--tenant", required=True)
    create.add_argument("--role", choices=["client", "auditor", "admin"], required=True)
    create.add_argument("--reasoning", choices=["hidden", "visible"], default="hidden")
    create.add_argument("--rpm", type=_limit, default=None, help="requests per minute; 0: none")
    create.add_argument("--tpm", type=_limit, default=None, help="tokens per minute; 0: none")
    create.set_defaults(func=cmd_keys_create)
    keys.add_parser("list", help="list keys").set_defaults(func=cmd_keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=cmd_keys_revoke)


def _tool_parsers(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="production-readiness checks of upstreams and services")
    doctor.add_argument("--upstream", action="append", default=None, metavar="URL",
                        help="e.g. http://vllm:8000/v1 (default: UPSTREAMS)")  # fmt: skip
    doctor.add_argument("--model", default=None, help="the model to probe (default: the first)")
    doctor.add_argument("--no-gateway", action="store_true",
                        help="skip Redis, database and ledger (check upstreams only)")  # fmt: skip
    doctor.set_defaults(func=cmd_doctor)

    bench = sub.add_parser("bench", help="load generator: TTFT, inter-token latency, throughput")
    bench.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080/v1")
    bench.add_argument("--concurrency", type=int, default=32)
    bench.add_argument("--duration", type=float, default=10.0)
    bench.add_argument("--model", default="deepseek-r1")
    bench.add_argument("--api-key", default=None, help="default: $THINKGATE_BENCH_KEY")
    bench.add_argument("--max-tokens", type=int, default=256)
    bench.set_defaults(func=cmd_bench)


def _witness_parser(sub: Any) -> None:
    witness = sub.add_parser("witness", help="run a C2SP tlog-witness for thinkgate logs")
    witness.add_argument("--name", required=True,
                         help="its cosigner name, e.g. witness.example/w1")  # fmt: skip
    witness.add_argument("--key-file", type=Path, required=True,
                         help="its Ed25519 key (PEM); made, 0600, if missing")  # fmt: skip
    witness.add_argument("--log-key", action="append", type=Path, required=True,
                         metavar="FILE",
                         help="a followed log's verifier key file, repeatable")  # fmt: skip
    witness.add_argument("--state", type=Path, required=True, help="its SQLite state file")
    witness.add_argument("--host", default="127.0.0.1", help="address to listen on")
    witness.add_argument("--port", type=int, default=8090, help="port")
    witness.set_defaults(func=cmd_witness)


def cmd_witness(args: argparse.Namespace) -> int:
    import uvicorn

    from audit.note import NoteVerifier, create_signing_key, load_signing_key
    from audit.witness import Cosigner
    from gateway.cli.ledger import KeyUnavailable, verifier_file
    from gateway.side.witness import WitnessState, create_witness_app

    refused = _refused(lambda: preflight.check_address(args.host, args.port))
    if refused:
        return refused
    try:
        logs: dict[str, NoteVerifier] = {}
        for path in args.log_key:
            verifier = verifier_file(path)
            logs[verifier.name] = verifier
    except KeyUnavailable as exc:
        print(f"thinkgate witness: {exc}", file=sys.stderr)
        return 2
    if not args.key_file.exists():
        create_signing_key(args.key_file)
        print(f"thinkgate witness: created its key {args.key_file}: keep it (verifiers pin it)",
              file=sys.stderr)  # fmt: skip
    cosigner = Cosigner(args.name, load_signing_key(args.key_file))
    state = WitnessState(args.state)
    print(f"thinkgate witness {args.name} on http://{args.host}:{args.port}/add-checkpoint; "
          f"its verifier key: {cosigner.verifier_key}; follows: {', '.join(logs)}",
          flush=True)  # fmt: skip
    try:
        uvicorn.run(create_witness_app(cosigner, logs, state), host=args.host, port=args.port,
                    log_level="warning")  # fmt: skip
    finally:
        state.close()
    return 0


def _ledger_parser(sub: Any) -> None:
    ledger = sub.add_parser("ledger", help="the audit ledger").add_subparsers(required=True)
    ledger.add_parser(
        "init", help="create missing key files; migrate the ledger schema"
    ).set_defaults(func=cmd_ledger_init)
    verify = ledger.add_parser("verify", help="check every leaf, the tree and every checkpoint")
    verify.add_argument("--export", type=Path, default=None, help="check this export offline")
    verify.add_argument(
        "--public-key", type=Path, default=None,
        help="verifier key file (default: derived from SIGNING_KEY_FILE)",
    )  # fmt: skip
    verify.add_argument("--witness-key", action="append", type=Path, default=[], metavar="FILE",
                        help="a trusted witness's cosigner key file, repeatable")  # fmt: skip
    verify.add_argument("--quorum", type=int, default=None,
                        help="cosignatures required (default: every --witness-key)")  # fmt: skip
    verify.add_argument("--tsa-roots", type=Path, default=None, metavar="PEM",
                        help="also check every stored RFC 3161 timestamp against "
                             "these roots")  # fmt: skip
    verify.set_defaults(func=cmd_ledger_verify)
    export = ledger.add_parser("export", help="records with inclusion proofs, as JSON lines")
    export.add_argument("--tenant", default=None)
    export.add_argument("--since", type=_time_arg, default=None,
                        help="RFC 3339 (2026-12-01T10:00:00Z) or epoch seconds")  # fmt: skip
    export.add_argument("--until", type=_time_arg, default=None,
                        help="RFC 3339 or epoch seconds")  # fmt: skip
    into = export.add_mutually_exclusive_group()
    into.add_argument("--output", type=Path, default=None, help="default: stdout")
    into.add_argument("--evidence", type=Path, default=None, metavar="OUT.tar",
                      help="write an evidence bundle instead: the records, the checkpoint, its "
                           "timestamp and cosignatures, the keys and a README with the commands "
                           "that check them (docs/evidence.md)")  # fmt: skip
    export.set_defaults(func=cmd_ledger_export)
    records.add_parsers(ledger, _missing_keys, _time_arg)
    shred = ledger.add_parser("shred", help="destroy a tenant's data keys (irreversible)")
    shred.add_argument("--tenant", required=True)
    shred.set_defaults(func=cmd_ledger_shred)
    ledger.add_parser("rotate-kek", help="new primary key-encryption key; re-wrap").set_defaults(
        func=cmd_ledger_rotate
    )
    ledger.add_parser("public-key", help="print the checkpoint verifier key").set_defaults(
        func=cmd_ledger_public_key
    )


def _capacity_parser(sub: Any) -> None:
    cap = sub.add_parser("capacity", help="plan KV-cache capacity and the admission settings")
    cap.add_argument("--model", required=True, help="a preset name or a config.json (or its dir)")
    cap.add_argument("--gpus", type=int, required=True, help="must equal tp × pp × dp")
    cap.add_argument("--gpu-mem-gib", type=float, required=True)
    cap.add_argument("--tp", type=int, default=1)
    cap.add_argument("--pp", type=int, default=1)
    cap.add_argument("--dp", type=int, default=1)
    cap.add_argument("--weights", choices=["bf16", "fp16", "fp8", "int4"], default="bf16")
    cap.add_argument("--kv-dtype", choices=["bf16", "fp16", "fp8"], default="bf16")
    cap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    cap.add_argument("--context", type=int, default=65536)
    cap.add_argument("--params", type=float, default=None, help="parameter count, e.g. 70.6e9")
    cap.add_argument("--reserve-gib", type=float, default=2.0, help="activations etc. (rough)")
    cap.add_argument(
        "--state-bytes-per-request", type=int, default=None,
        help="recurrent layers in a config.json: one layer's state per request",
    )  # fmt: skip
    money = cap.add_argument_group("prices (--prices: print a PRICES_FILE instead of the plan)")
    money.add_argument("--prices", action="store_true",
                       help="derive prices from the cluster's cost and throughput")  # fmt: skip
    money.add_argument("--gpu-hour", type=_amount, help="what one GPU costs an hour")
    money.add_argument("--monthly-cost", type=_amount, help="what the cluster costs a month")
    money.add_argument("--output-tokens-per-s", type=float,
                       help="one engine's measured output tokens per second")  # fmt: skip
    money.add_argument("--busy", type=float, default=0.6, help="share of the month at work")
    money.add_argument("--input-per-output", type=float, default=4.0,
                       help="prompt tokens per output token in the traffic")  # fmt: skip
    money.add_argument("--output-weight", type=float, default=4.0,
                       help="an output token costs this many input tokens")  # fmt: skip
    money.add_argument("--cached-share", type=float, default=0.25,
                       help="a cached input token's share of an input token's price")  # fmt: skip
    money.add_argument("--currency", default="USD")
    money.add_argument("--served-model", help="the model's name in requests (default --model)")
    cap.set_defaults(func=cmd_capacity)


def _amount(text: str) -> Any:
    """An amount of money, exact (a ``Decimal``)."""
    from decimal import Decimal, InvalidOperation

    try:
        found = Decimal(text)
    except InvalidOperation:
        raise ValueError(text) from None
    if not found.is_finite():
        raise ValueError(text)
    return found


def _refused(*checks: Callable[[], None]) -> int:
    """Run the start-up checks in order; the exit code of the first that fails (its line
    printed), else 0 (``gateway.cli.preflight`` lists the codes)."""
    try:
        for check in checks:
            check()
    except preflight.Refused as refused:
        print(f"thinkgate: {refused}", file=sys.stderr)
        return refused.code
    return 0


def _serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings ``serve``'s flags give."""
    overrides: dict[str, Any] = {"demo": args.demo}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    if args.upstream:
        overrides["upstreams"] = tuple(args.upstream)
    return overrides


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.telemetry.logs import lean_records

    overrides = _serve_overrides(args)
    settings = Settings(**overrides)
    refused = _refused(lambda: preflight.check_address(settings.host, settings.port))
    if refused:
        return refused
    if args.demo:
        if args.workers not in (1, workers.AUTO):
            print("--demo runs one worker (the simulator lives in it)", file=sys.stderr)
            return 2
        from gateway.cli.demo import prepare_demo

        asyncio.run(prepare_demo(settings))
    elif not settings.upstreams:
        print(
            "no upstream: pass --upstream URL, set THINKGATE_UPSTREAMS, or use --demo",
            file=sys.stderr,
        )
        return 2
    refused = _refused(lambda: preflight.check_guardrails(settings),
                       lambda: preflight.check_prices(settings),
                       lambda: preflight.check_database(settings),
                       lambda: preflight.check_keys(settings))  # fmt: skip
    if refused:
        return refused
    run = _uvicorn_options(settings)
    count = _worker_count(args, settings, run["log_config"])
    if count == 1:
        from gateway.app import create_app

        lean_records()
        uvicorn.run(create_app(settings, freeze_gc=True), **run)
        return 0
    # Workers are separate processes: they read their settings from the environment, and
    # keep their metrics in files that /metrics adds up (prometheus-client multiprocess mode).
    # A directory given by the operator is emptied first, as prometheus-client requires (old
    # files would add a previous run's counts); one made here is removed at the end.
    for name, value in overrides.items():
        os.environ[f"THINKGATE_{name.upper()}"] = (
            ",".join(value) if isinstance(value, tuple) else str(value)
        )
    with _metrics_directory(settings.prometheus_multiproc_dir) as directory:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        uvicorn.run("gateway.cli.main:app_from_env", factory=True, workers=count, **run)
    return 0


def _uvicorn_options(settings: Settings) -> dict[str, Any]:
    from gateway.telemetry.logs import log_config

    return {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": "httptools",
        "access_log": False,  # thinkgate.access replaces it (gateway/telemetry/logs.py)
        "server_header": False,  # no "server: uvicorn": nothing to fingerprint
        "ws": "none",  # no WebSocket route: no WebSocket library loaded into each worker
        "limit_concurrency": settings.max_client_connections,
        "log_config": log_config(settings.logs),
    }


def _worker_count(args: argparse.Namespace, settings: Settings, logs: dict[str, Any]) -> int:
    """``--workers``, ``auto`` resolved (gateway/cli/workers.py), logged in the serving
    process's own log format (``logs``: the config uvicorn applies again)."""
    import logging.config

    chosen = workers.resolve(args.workers, demo=args.demo, shared_limits=bool(settings.redis_url),
                             cpus=workers.usable_cpus())  # fmt: skip
    logging.config.dictConfig(logs)
    log = logging.getLogger("thinkgate")
    log.info(chosen.reason)
    if chosen.warning:
        log.warning(chosen.warning)
    return chosen.count


@contextlib.contextmanager
def _metrics_directory(given: str) -> Iterator[str]:
    if given:
        for stale in Path(given).glob("*.db"):
            stale.unlink()
        yield given
        return
    made = tempfile.mkdtemp(prefix="thinkgate-metrics-")
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def app_from_env() -> Any:
    """A worker's app (``serve --workers N``): made in the worker's own process."""
    from gateway.app import create_app
    from gateway.telemetry.logs import lean_records

    lean_records()
    return create_app(Settings(), freeze_gc=True)


def cmd_sim(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.side.sim.app import SimConfig, create_sim_app

    config = SimConfig(
        ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, kv_capacity_tokens=args.kv_capacity_tokens,
        block_size=args.block_size, kv_events=args.kv_events,
        kv_events_replay=args.kv_events_replay, prefill_tokens_per_s=args.prefill_tokens_per_s,
        prompt_cache=args.prompt_cache,
    )  # fmt: skip
    refused = _refused(lambda: preflight.check_address(args.host, args.port))
    if refused:
        return refused
    print(f"thinkgate sim: a simulated vLLM on http://{args.host}:{args.port}/v1 (models: "
          f"{', '.join(config.models)}; TTFT {args.ttft_ms:g} ms, {args.itl_ms:g} ms per "
          "token); Ctrl-C stops it", flush=True)  # fmt: skip
    uvicorn.run(
        create_sim_app(config),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=args.access_log,
        log_level="info" if args.access_log else "warning",
    )
    print("thinkgate sim: stopped", flush=True)
    return 0


def _time_arg(text: str) -> float:
    """A time as the auditor API reads one (``gateway.routes.auditor.parse_time``)."""
    from gateway.routes.auditor import parse_time

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit(text: str) -> int:
    """A per-minute limit as the key table stores it (a 32-bit INTEGER on PostgreSQL)."""
    value = int(text)
    if not 0 <= value <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and {2**31 - 1}")
    return value


def cmd_keys_create(args: argparse.Namespace) -> int:
    from gateway.cli.keys import create_key

    secret, view = asyncio.run(
        create_key(Settings(), args.tenant, args.role, args.reasoning, args.rpm, args.tpm)
    )
    print(f"created key {view} (the secret below is shown once; only its hash is stored)")
    print(secret)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from gateway.cli.keys import list_keys

    for line in asyncio.run(list_keys(Settings())):
        print(line)
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from gateway.cli.keys import revoke_key

    revoked, said = asyncio.run(revoke_key(Settings(), args.key_id))
    print(said, file=sys.stdout if revoked else sys.stderr)
    return 0 if revoked else 1


def cmd_ledger_init(args: argparse.Namespace) -> int:
    from gateway.cli.ledger import init

    made = asyncio.run(init(Settings()))
    for path in made:
        print(f"created {path} (mode 0600): back it up; without it records cannot be read")
    if not made:
        print("ledger key files already exist; kept them")
    print("ledger schema is current")
    return 0


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    from audit.export import ExportInvalid
    from audit.store import DB_ERRORS
    from audit.timestamps import TimestampError
    from audit.verify import LedgerCorrupt
    from audit.witness import WitnessError
    from gateway.cli import ledger as ledgercli

    try:
        policy = ledgercli.load_policy(args.witness_key, args.quorum)
        if args.export is not None:  # no database: a derived key is named as the export says
            named = Settings().model_copy(
                update={"audit_origin": ledgercli.export_origin(args.export)}
            )
            verifier = ledgercli.load_verifier(named, args.public_key)
            size, count = ledgercli.verify_export(args.export, verifier)
            print(f"export OK: {count} records included in the signed tree of size {size}")
            if policy is not None:
                names = policy.check(ledgercli.export_checkpoint(args.export))
                print(f"cosigned by {len(names)} of the trusted witnesses: {', '.join(names)}")
            return 0
        settings = asyncio.run(ledgercli.with_origin(Settings()))
        verifier = ledgercli.load_verifier(settings, args.public_key)
        with ledgercli.progress_bar(sys.stderr.isatty()) as progress:
            report = asyncio.run(ledgercli.verify_database(settings, verifier, progress))
        if policy is not None:
            note = asyncio.run(ledgercli.witnessed_checkpoint(settings, policy))
            names = policy.check(note)
            witnessed = note.split("\n", 2)[1]
            print(f"the checkpoint of size {witnessed} (of {report.size} records) is cosigned by "
                  f"{len(names)} of the trusted witnesses: {', '.join(names)}")  # fmt: skip
        if args.tsa_roots is not None:
            stamped, last = asyncio.run(ledgercli.verify_timestamps(settings, args.tsa_roots))
            print(
                f"{stamped} RFC 3161 timestamps verified"
                + (f"; the latest dates checkpoint {last[0]} at {last[1]}" if last else "")
            )
    except (WitnessError, TimestampError) as exc:
        print(f"ledger verification FAILED: {exc}", file=sys.stderr)
        return 1
    except ledgercli.KeyUnavailable as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except DB_ERRORS as exc:
        print(f"cannot read the ledger database ({type(exc).__name__})", file=sys.stderr)
        return 2
    except (LedgerCorrupt, ExportInvalid) as exc:
        print(f"ledger verification FAILED: {exc}", file=sys.stderr)
        return 1
    pending = (f"; {report.pending} committed since the last checkpoint (the next, within "
               "CHECKPOINT_INTERVAL_MS, covers them)" if report.pending else "")  # fmt: skip
    print(f"ledger OK: {report.size} records, {report.checkpoints} checkpoints verified{pending}")
    return 0


def cmd_ledger_export(args: argparse.Namespace) -> int:
    from audit.store import Filter
    from gateway.cli.ledger import export_to

    settings = Settings()
    if missing := _missing_keys(settings, "signing_key_file"):  # no decryption key needed
        return missing
    where = Filter(tenant=args.tenant, since=args.since, until=args.until)
    if args.evidence is not None:
        from gateway.cli.ledger import export_evidence

        code, said = asyncio.run(export_evidence(settings, where, args.evidence))
        print(said, file=sys.stderr)
        return code
    if args.output is None:
        count = asyncio.run(export_to(settings, where, sys.stdout.buffer))
    else:
        with args.output.open("wb") as out:
            count = asyncio.run(export_to(settings, where, out))
    print(f"exported {count} records", file=sys.stderr)
    return 0


def cmd_ledger_shred(args: argparse.Namespace) -> int:
    from audit.retention import ShredBlocked
    from gateway.cli.ledger import shred

    settings = Settings()
    if missing := _missing_keys(settings):
        return missing
    try:
        destroyed = asyncio.run(shred(settings, args.tenant))
    except ShredBlocked as exc:
        print(f"thinkgate ledger shred: refused: {exc}; release the holds first", file=sys.stderr)
        return 1
    print(f"shredded tenant {args.tenant}: {destroyed} data keys destroyed, shred record appended")
    return 0


def cmd_ledger_rotate(args: argparse.Namespace) -> int:
    from gateway.cli.ledger import rotate_kek

    settings = Settings()
    if missing := _missing_keys(settings):
        return missing
    new_id, moved = asyncio.run(rotate_kek(settings))
    print(f"new primary key-encryption key {new_id}; {moved} tenant keys re-wrapped")
    return 0


def cmd_ledger_public_key(args: argparse.Namespace) -> int:
    from gateway.cli.ledger import verifier_key, with_origin

    settings = Settings()
    if missing := _missing_keys(settings, "signing_key_file"):
        return missing
    print(verifier_key(asyncio.run(with_origin(settings))))
    return 0


def _missing_keys(settings: Settings, *names: str) -> int:
    """0, or (having said which file is missing, where it looked and what makes it) the
    key-files exit code, for the ledger commands that need key files (``names``; all)."""
    plain = settings.model_copy(update={"demo": False})
    return _refused(lambda: preflight.check_keys(plain, names or ("ledger_key_file",
                                                                 "signing_key_file")))  # fmt: skip


def cmd_doctor(args: argparse.Namespace) -> int:
    """Prints the checklist; exit 1 if a check failed, 2 if there is nothing to check."""
    from gateway.cli import doctor

    settings = Settings()
    urls = list(args.upstream or settings.upstreams)
    if not urls and not settings.demo:
        print("no upstream: pass --upstream URL or set THINKGATE_UPSTREAMS (or THINKGATE_DEMO "
              "for the simulator)", file=sys.stderr)  # fmt: skip
        return 2

    async def examine() -> list[tuple[str, list[doctor.Check]]]:
        async with contextlib.AsyncExitStack() as stack:
            checked, asked = settings, urls
            if not asked:  # demo settings: the simulator the demo would start, as configured
                from gateway.app import DEMO_MODELS
                from gateway.edge.servers import BackgroundServer
                from gateway.side.sim.app import SimConfig, create_sim_app

                sim = await stack.enter_async_context(BackgroundServer(create_sim_app(SimConfig())))
                asked = [f"{sim.url}/v1"]
                checked = settings.with_default_models(DEMO_MODELS)
            key = checked.upstream_api_key.get_secret_value()
            sections = await doctor.gather_upstreams(asked, key, args.model, checked)
            if not args.no_gateway:
                sections.append(("gateway", await doctor.examine_gateway(checked)))
            return sections

    sections = asyncio.run(examine())
    print(doctor.render(sections))
    return 1 if doctor.failed(sections) else 0


def cmd_capacity(args: argparse.Namespace) -> int:
    import json

    from ratelimit import capacity

    try:
        model = capacity.PRESETS.get(args.model)
        if model is None:
            path = Path(args.model)
            path = path / "config.json" if path.is_dir() else path
            if not path.is_file():
                names = ", ".join(capacity.PRESETS)
                raise ValueError(f"--model {args.model}: not a preset ({names}) nor a file")
            config = json.loads(path.read_text())
            model = capacity.model_from_config(config, args.model, args.state_bytes_per_request)
        deployment = capacity.Deployment(
            gpus=args.gpus, gpu_mem_gib=args.gpu_mem_gib, tp=args.tp, pp=args.pp, dp=args.dp,
            weights=args.weights, kv_dtype=args.kv_dtype, context=args.context,
            gpu_memory_utilization=args.gpu_memory_utilization, params=args.params,
            reserve_gib=args.reserve_gib,
        )  # fmt: skip
        result = capacity.plan(model, deployment)
        if args.prices and result.max_requests_per_engine == 0:
            raise ValueError("the deployment does not fit its GPUs: nothing to price")
        print((_prices(args) if args.prices else capacity.render(result)).rstrip("\n"))
    except (OSError, ValueError) as exc:
        print(f"thinkgate capacity: {exc}", file=sys.stderr)
        return 2
    return 1 if result.max_requests_per_engine == 0 else 0  # the deployment does not fit


def _prices(args: argparse.Namespace) -> str:
    """``capacity --prices``: the ``PRICES_FILE`` the cluster's cost and throughput give."""
    from gateway.spend.derived import ClusterCost, derive, render

    if args.output_tokens_per_s is None:
        raise ValueError("--prices needs --output-tokens-per-s (one engine's, measured)")
    cluster = ClusterCost(
        model=args.served_model or args.model, gpus=args.gpus, engines=args.dp,
        output_tokens_per_s=args.output_tokens_per_s, gpu_hour=args.gpu_hour,
        monthly_cost=args.monthly_cost, busy=args.busy, input_per_output=args.input_per_output,
        output_weight=args.output_weight, cached_share=args.cached_share,
        currency=args.currency,
    )  # fmt: skip
    return render(derive(cluster))


def cmd_bench(args: argparse.Namespace) -> int:
    """Load, after one probe: a key the gateway refuses stops it at once (exit 2), and a run
    in which every request failed exits 1."""
    from bench.loadgen import LoadSpec, report, run_load

    api_key = args.api_key or Settings().bench_key.get_secret_value()
    problem = _bench_probe(args.url, api_key)
    if problem:
        print(f"thinkgate bench: {problem}", file=sys.stderr)
        return 2
    spec = LoadSpec(
        url=args.url,
        api_key=api_key,
        model=args.model,
        concurrency=args.concurrency,
        duration_s=args.duration,
        max_tokens=args.max_tokens,
    )
    result = asyncio.run(run_load(spec))
    print(report(result))
    return 1 if result.errors and not result.requests else 0


def _bench_probe(url: str, api_key: str) -> str | None:
    """Why the load would fail from its first request (no key, a refused key, nobody there)."""
    import httpx

    if not api_key:
        return "no key: pass --api-key or set THINKGATE_BENCH_KEY (a client key)"
    try:
        answer = httpx.get(f"{url.rstrip('/')}/models", timeout=10,
                           headers={"authorization": f"Bearer {api_key}"})  # fmt: skip
    except httpx.HTTPError as exc:
        return f"cannot reach {url}: {type(exc).__name__}"
    if answer.status_code in (401, 403):
        return (f"the gateway refused the key ({answer.status_code}): pass a client key with "
                "--api-key or THINKGATE_BENCH_KEY")  # fmt: skip
    return None
