"""deploy/compose/compose.yaml and what it mounts, checked statically (no Docker engine here):
pinned images, THINKGATE_ variables that are real settings, the gateway wired to services and
ports that exist, a start order that waits on health checks and on the one-shot ledger-init,
declared volumes, mounted files that exist, Prometheus scraping the gateway with the rules it
mounts (promtool checks the result), Grafana provisioned with the mounted dashboard, and the GPU
only in the ``gpu`` profile. (``docker compose config`` would check more, but neither this
machine nor CI has the compose plugin, and Debian packages only the obsolete v1.)

Values are read with the compose file's ``${VAR:-default}`` interpolations resolved as an
empty environment would resolve them: the defaults are what ``docker compose up`` runs. The
gateway's reasoning source is also checked in the environments the env example offers."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from gateway.settings import Settings
from tests.deploy.promql import run_promtool

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"  # the one compose file
HERE = COMPOSE.parent  # where its relative paths start
ENV_EXAMPLE = ROOT / "deploy" / "compose" / "env.example"
DASHBOARD = ROOT / "deploy" / "grafana" / "thinkgate.json"
RULES = ROOT / "deploy" / "prometheus" / "thinkgate-rules.yaml"
THINKGATE_IMAGE = "thinkgate"
# Where the images the compose file pulls listen when their command does not say.
DEFAULT_PORTS = {
    "redis": 6379,
    "postgres": 5432,
    "prom/prometheus": 9090,
    "grafana/grafana": 3000,
    "vllm/vllm-openai": 8000,
}
URL_PORTS = {"http": 80, "https": 443, "redis": 6379, "postgresql": 5432}
# Read by gateway/settings.py besides the fields: the YAML file's path.
EXTRA_SETTINGS = {"THINKGATE_CONFIG"}
_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?+])(?P<word>[^}]*))?\}")


# -- reading the compose file -------------------------------------------------------------


def interpolate(text: str, env: Mapping[str, str] | None = None) -> str:
    """Compose interpolation against ``env`` (empty by default): ``${X:-d}`` is X if set and
    not empty, else ``d``; ``${X-d}`` is X if set, else ``d``; ``${X}`` is X or nothing;
    ``${X:+d}`` is ``d`` if X is set and not empty; ``$$`` is a literal ``$``."""
    env = env or {}

    def value(match: re.Match[str]) -> str:
        op, given = match["op"] or "", env.get(match["name"])
        assert op not in {"?", ":?"}, f"{match[0]}: compose refuses to start unset"
        is_set = bool(given) if op.startswith(":") else given is not None
        if op.endswith("-"):
            return (given or "") if is_set else match["word"]
        if op.endswith("+"):
            return match["word"] if is_set else ""
        return given or ""

    return _VARIABLE.sub(value, text.replace("$$", "\0")).replace("\0", "$")


def resolve(node: Any, env: Mapping[str, str] | None = None) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [resolve(item, env) for item in node]
    if isinstance(node, dict):
        return {key: resolve(value, env) for key, value in node.items()}
    return node


@cache
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = resolve(yaml.safe_load(COMPOSE.read_text()))
    return loaded


def services(env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """The services, resolved against ``env`` (an empty environment by default)."""
    loaded = compose() if not env else resolve(yaml.safe_load(COMPOSE.read_text()), env)
    found: dict[str, dict[str, Any]] = loaded["services"]
    return found


def default_services() -> dict[str, dict[str, Any]]:
    """What a plain ``docker compose up`` starts: the services without a profile."""
    return {name: svc for name, svc in services().items() if not svc.get("profiles")}


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


def words(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(word) for word in value]


@cache
def image_defaults() -> tuple[list[str], dict[str, str]]:
    """The thinkgate image's ENTRYPOINT and environment, from the Dockerfile."""
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"), env_replace=False)
    entrypoint = [i["value"] for i in parser.structure if i["instruction"] == "ENTRYPOINT"]
    return words(json.loads(entrypoint[-1])), dict(parser.envs)


def command_line(service: Mapping[str, Any]) -> list[str]:
    """Entrypoint + command as the container runs them (the image's entrypoint if unset)."""
    entrypoint = words(service.get("entrypoint"))
    if not entrypoint and is_thinkgate(service):
        entrypoint = image_defaults()[0]
    return entrypoint + words(service.get("command"))


def split_image(reference: str) -> tuple[str, str | None, str | None]:
    """``name[:tag][@digest]`` → (name, tag, digest); a registry port is not a tag."""
    name, _, digest = reference.partition("@")
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:
        return name, None, digest or None
    return repository, tag, digest or None


def is_thinkgate(service: Mapping[str, Any]) -> bool:
    return split_image(service.get("image", ""))[0] == THINKGATE_IMAGE


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in ``args``."""
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def listening_ports(name: str) -> set[int]:
    """Where service ``name`` listens: its command's ``--port``, else its image's default."""
    service = services()[name]
    port = option(command_line(service), "--port")
    if port is not None:
        return {int(port)}
    if is_thinkgate(service):
        env = image_defaults()[1] | environment(service)
        return {int(env.get("THINKGATE_PORT", Settings.model_fields["port"].default))}
    return {DEFAULT_PORTS[split_image(service["image"])[0]]}


@dataclass(frozen=True)
class Mount:
    source: str | None  # None: anonymous volume
    target: str
    read_only: bool

    @property
    def is_bind(self) -> bool:
        return self.source is not None and self.source.startswith((".", "/", "~"))


def mounts(service: Mapping[str, Any]) -> list[Mount]:
    found = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            read_only = bool(entry.get("read_only"))
            found.append(Mount(entry.get("source"), entry["target"], read_only))
            continue
        parts = entry.split(":")
        if len(parts) == 1:
            found.append(Mount(None, parts[0], False))
        else:
            options = ",".join(parts[2:]).split(",")
            found.append(Mount(parts[0], parts[1], "ro" in options))
    return found


def mounted_from(service: str, target: str) -> Path:
    """The repository file mounted at ``target`` in ``service``."""
    for mount in mounts(services()[service]):
        if mount.is_bind and mount.target == target and mount.source:
            return HERE / mount.source
    raise AssertionError(f"{service} mounts nothing from the repository at {target}")


def under_mount(service: str, path: str) -> Mount | None:
    """The mount that holds ``path`` in ``service`` (the deepest one)."""
    holding = [
        m for m in mounts(services()[service]) if PurePosixPath(path).is_relative_to(m.target)
    ]
    return max(holding, key=lambda m: len(m.target), default=None)


# -- images -------------------------------------------------------------------------------


def test_every_service_runs_a_pinned_image() -> None:
    for name, service in services().items():
        assert "image" in service, f"{name}: name the image (and pin it), even when built"
        _, tag, digest = split_image(service["image"])
        assert tag or digest, f"{name}: {service['image']} has neither tag nor digest"
        assert tag != "latest", f"{name}: {service['image']}"


def test_the_built_image_is_tagged_with_the_project_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name, service in services().items():
        if "build" in service:
            assert service["image"] == f"{THINKGATE_IMAGE}:{version}", name
            build = service["build"]
            context = HERE / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build["dockerfile"]
            assert (context / dockerfile).is_file(), f"{name}: no {context / dockerfile}"


# -- settings and wiring ------------------------------------------------------------------


def setting_names() -> set[str]:
    return {f"THINKGATE_{name.upper()}" for name in Settings.model_fields} | EXTRA_SETTINGS


def test_every_thinkgate_variable_is_a_setting() -> None:
    """In services' environments, in interpolations and in the env example."""
    used = {key for svc in services().values() for key in environment(svc)}
    used |= {m["name"] for m in _VARIABLE.finditer(COMPOSE.read_text())}
    used |= set(env_example())
    unknown = {name for name in used if name.startswith("THINKGATE_")} - setting_names()
    assert not unknown, f"not settings of gateway/settings.py: {sorted(unknown)}"


def gateway_env() -> dict[str, str]:
    return image_defaults()[1] | environment(services()["gateway"])


def assert_points_at_a_service(url: str) -> str:
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]
    host, port = parts.hostname, parts.port or URL_PORTS[scheme]
    assert host in default_services(), f"{url}: no service {host} in the default profile"
    assert port in listening_ports(host), f"{url}: {host} listens on {listening_ports(host)}"
    return host


def test_the_upstreams_are_services_on_their_ports() -> None:
    upstreams = [u.strip() for u in gateway_env()["THINKGATE_UPSTREAMS"].split(",") if u.strip()]
    assert upstreams
    for url in upstreams:
        assert_points_at_a_service(url)
        assert urlsplit(url).path.rstrip("/") == "/v1", f"{url}: an OpenAI base URL ends in /v1"


def test_redis_is_the_redis_service() -> None:
    host = assert_points_at_a_service(gateway_env()["THINKGATE_REDIS_URL"])
    assert split_image(services()[host]["image"])[0] == "redis"


def test_the_database_is_the_postgres_service_with_its_credentials() -> None:
    url = gateway_env()["THINKGATE_DATABASE_URL"]
    assert url.startswith("postgresql+asyncpg://")
    host = assert_points_at_a_service(url)
    postgres = environment(services()[host])
    parts = urlsplit(url)
    assert parts.username == postgres["POSTGRES_USER"]
    assert parts.password == postgres["POSTGRES_PASSWORD"]
    assert parts.path.lstrip("/") == postgres.get("POSTGRES_DB", postgres["POSTGRES_USER"])


def test_the_cli_and_ledger_init_use_the_gateways_settings() -> None:
    for name in ("ledger-init", "gateway-cli"):
        assert services()[name]["image"] == services()["gateway"]["image"]
        assert environment(services()[name]) == environment(services()["gateway"]), name


# -- reasoning: read where the engine puts it ---------------------------------------------


def commented_settings() -> dict[str, str]:
    """The env example's ``# THINKGATE_X=value`` lines: the settings it offers instead."""
    found = re.findall(r"^#\s*(THINKGATE_\w+)=(\S+)$", ENV_EXAMPLE.read_text(), re.MULTILINE)
    return dict(found)


CONFIGURATIONS = ["defaults", "env.example", "env.example, gpu"]


def configuration(name: str) -> dict[str, str]:
    """An environment the stack is documented to run in: none (the defaults), the env example,
    or the env example with its commented alternatives in force (vLLM, ``--profile gpu``)."""
    return {
        "defaults": {},
        "env.example": env_example(),
        "env.example, gpu": env_example() | commented_settings(),
    }[name]


def engines(env: Mapping[str, str]) -> dict[str, list[str]]:
    """The gateway's upstreams in ``env``: service name → its command line."""
    stack = services(env)
    urls = environment(stack["gateway"])["THINKGATE_UPSTREAMS"].split(",")
    hosts = {str(urlsplit(url.strip()).hostname) for url in urls if url.strip()}
    return {host: command_line(stack[host]) for host in hosts}


def gateway_setting(env: Mapping[str, str], field: str) -> str:
    """The gateway's setting ``field`` in ``env``: its environment, the image's, the default."""
    gateway = image_defaults()[1] | environment(services(env)["gateway"])
    return gateway.get(f"THINKGATE_{field.upper()}", str(Settings.model_fields[field].default))


@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_the_gateway_reads_reasoning_where_its_engines_put_it(name: str) -> None:
    """``upstream`` exactly when the engine runs ``--reasoning-parser``, which then names
    REASONING_PARSER's format; ``text`` when it leaves the markers in the content. The gateway
    reads a model's reasoning one way, so engines that disagree cannot share it."""
    env = configuration(name)
    source = gateway_setting(env, "reasoning_source")
    found = {host: option(argv, "--reasoning-parser") for host, argv in engines(env).items()}
    assert found
    for host, parser in found.items():
        expected = "upstream" if parser else "text"
        runs = f"--reasoning-parser={parser}" if parser else "no reasoning parser"
        assert source == expected, f"{name}: {host} runs {runs}: REASONING_SOURCE {expected}"
        if parser:
            assert gateway_setting(env, "reasoning_parser") == parser, f"{name}: {host}"


def test_the_env_example_offers_vllm_with_its_reasoning_source() -> None:
    """The check above covers vLLM too: the env example's gpu alternative points at it."""
    assert set(engines(configuration("env.example, gpu"))) == {"vllm"}
    assert set(engines(configuration("defaults"))) == {"simulator"}


# -- start order and health ---------------------------------------------------------------


def dependencies(service: Mapping[str, Any]) -> dict[str, str]:
    """``depends_on`` as {service: condition} (the list form means service_started)."""
    depends = service.get("depends_on") or {}
    if isinstance(depends, list):
        return dict.fromkeys(depends, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in depends.items()}


def has_healthcheck(service: Mapping[str, Any]) -> bool:
    check = service.get("healthcheck") or {}
    return not check.get("disable") and bool(check.get("test"))


def is_one_shot(service: Mapping[str, Any]) -> bool:
    return bool(service.get("restart", "no") == "no")


def test_every_dependency_exists_and_can_satisfy_its_condition() -> None:
    for name, service in services().items():
        for target, condition in dependencies(service).items():
            assert target in services(), f"{name} depends on a missing service {target}"
            if condition == "service_healthy":
                assert has_healthcheck(services()[target]), f"{name} awaits {target}'s health"
            elif condition == "service_completed_successfully":
                assert is_one_shot(services()[target]), f"{target} would never complete"
            if name in default_services():
                assert target in default_services(), f"{name} needs {target} from a profile"


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in services().items():
        if not is_one_shot(service):
            assert has_healthcheck(service), name
            check = service["healthcheck"]
            assert {"interval", "timeout", "retries"} <= set(check), name


def test_the_gateway_starts_after_ledger_init_and_healthy_backends() -> None:
    gateway = dependencies(services()["gateway"])
    assert gateway.pop("ledger-init") == "service_completed_successfully"
    env = gateway_env()
    backends = {
        urlsplit(env[key]).hostname for key in ("THINKGATE_REDIS_URL", "THINKGATE_DATABASE_URL")
    }
    backends |= {urlsplit(u).hostname for u in env["THINKGATE_UPSTREAMS"].split(",")}
    assert {host: "service_healthy" for host in backends} == gateway


def test_ledger_init_runs_thinkgate_ledger_init_after_postgres() -> None:
    init = services()["ledger-init"]
    assert command_line(init) == ["thinkgate", "ledger", "init"]
    assert is_one_shot(init)
    assert dependencies(init) == {"postgres": "service_healthy"}


def test_the_simulator_runs_thinkgate_sim_on_all_interfaces() -> None:
    sim = services()["simulator"]
    assert command_line(sim)[:2] == ["thinkgate", "sim"]
    assert option(command_line(sim), "--host") == "0.0.0.0"
    assert "/health" in " ".join(sim["healthcheck"]["test"])


def test_healthchecks_ask_the_right_endpoints() -> None:
    expected = {
        "gateway": "/healthz",
        "vllm": "/health",
        "prometheus": "/-/ready",
        "grafana": "/api/health",
        "postgres": "pg_isready",
        "redis": "ping",
    }
    for name, needle in expected.items():
        test = services()[name]["healthcheck"]["test"]
        assert needle in " ".join(words(test)), f"{name}: {test}"


# -- volumes, files, the read-only root ---------------------------------------------------


def test_every_named_volume_is_declared_and_every_declared_one_used() -> None:
    declared = set(compose().get("volumes") or {})
    used = {m.source for s in services().values() for m in mounts(s) if m.source and not m.is_bind}
    assert used <= declared, f"undeclared volumes: {sorted(used - declared)}"
    assert declared <= used, f"declared but unused volumes: {sorted(declared - used)}"


def test_every_file_mounted_from_the_repository_exists() -> None:
    binds = [(name, m) for name, s in services().items() for m in mounts(s) if m.is_bind]
    assert binds
    for name, mount in binds:
        assert mount.source
        source = (HERE / mount.source).resolve()
        assert source.is_relative_to(ROOT), f"{name}: {mount.source} is outside the repo"
        assert source.exists(), f"{name}: {mount.source} does not exist"
        assert mount.read_only, f"{name}: mount {mount.source} read-only"


def test_the_thinkgate_services_run_read_only_and_write_only_to_volumes() -> None:
    env = gateway_env()
    writes = {
        "gateway": ["THINKGATE_AUDIT_SPOOL_FILE"],
        "ledger-init": ["THINKGATE_LEDGER_KEY_FILE", "THINKGATE_SIGNING_KEY_FILE"],
    }
    for name, service in services().items():
        if is_thinkgate(service):
            assert service.get("read_only") is True, name
    for name, variables in writes.items():
        for variable in variables:
            mount = under_mount(name, env[variable])
            assert mount and mount.source and not mount.read_only, f"{name}: {env[variable]}"


def test_the_gateway_reads_the_keys_ledger_init_wrote() -> None:
    env = gateway_env()
    for variable in ("THINKGATE_LEDGER_KEY_FILE", "THINKGATE_SIGNING_KEY_FILE"):
        written = under_mount("ledger-init", env[variable])
        read = under_mount("gateway", env[variable])
        assert written and read, variable
        assert (written.source, written.target) == (read.source, read.target), variable


def test_published_ports_bind_to_localhost_only() -> None:
    """/metrics is open on the gateway's port and Grafana starts with a default password."""
    for name, service in services().items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"


# -- Prometheus ---------------------------------------------------------------------------


def prometheus_config_path() -> str:
    return option(command_line(services()["prometheus"]), "--config.file") or (
        "/etc/prometheus/prometheus.yml"
    )


@cache
def prometheus_config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(
        mounted_from("prometheus", prometheus_config_path()).read_text()
    )
    return loaded


def scrape_targets() -> dict[str, list[tuple[str, int, str]]]:
    """job → [(host, port, metrics path)]."""
    jobs = {}
    for job in prometheus_config()["scrape_configs"]:
        path = job.get("metrics_path", "/metrics")
        targets = [t for group in job.get("static_configs", []) for t in group["targets"]]
        jobs[job["job_name"]] = [
            (t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1]), path) for t in targets
        ]
    return jobs


def test_prometheus_scrapes_the_gateways_metrics_on_its_port() -> None:
    gateway = [t for targets in scrape_targets().values() for t in targets if t[0] == "gateway"]
    assert gateway, "no job scrapes the gateway"
    for _, port, path in gateway:
        assert path == "/metrics"
        assert port in listening_ports("gateway")
    assert not gateway_env().get("THINKGATE_METRICS_TOKEN"), "add the token to the scrape job"


def test_every_scrape_target_is_a_service_on_its_port() -> None:
    for job, targets in scrape_targets().items():
        for host, port, _ in targets:
            assert host in services(), f"job {job}: no service {host}"
            assert port in listening_ports(host), f"job {job}: {host} listens elsewhere"


def test_the_rule_files_are_the_mounted_thinkgate_rules() -> None:
    rule_files = prometheus_config()["rule_files"]
    assert rule_files
    mounted = [mounted_from("prometheus", path).resolve() for path in rule_files]
    assert RULES.resolve() in mounted


def test_promtool_accepts_the_config_with_its_rules(tmp_path: Path) -> None:
    """promtool reads the rule files too: their container paths become the repository's."""
    config = dict(prometheus_config())
    config["rule_files"] = [str(mounted_from("prometheus", p)) for p in config["rule_files"]]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = run_promtool("check", "config", path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- Grafana ------------------------------------------------------------------------------


def provisioning(kind: str) -> list[dict[str, Any]]:
    """The YAML files of one provisioning kind (datasources, dashboards) Grafana mounts."""
    directory = mounted_from("grafana", f"/etc/grafana/provisioning/{kind}")
    files = sorted(directory.glob("*.y*ml"))
    assert files, f"nothing in {directory}"
    return [yaml.safe_load(file.read_text()) for file in files]


def dashboard_target() -> str:
    targets = [
        m.target
        for m in mounts(services()["grafana"])
        if m.is_bind and m.source and (HERE / m.source).resolve() == DASHBOARD.resolve()
    ]
    assert len(targets) == 1, "deploy/grafana/thinkgate.json is not mounted into grafana"
    return targets[0]


def test_grafana_loads_the_mounted_dashboard() -> None:
    providers = [p for doc in provisioning("dashboards") for p in doc["providers"]]
    target = PurePosixPath(dashboard_target())
    paths = [PurePosixPath(p["options"]["path"]) for p in providers if p.get("type") == "file"]
    assert any(target.is_relative_to(path) for path in paths), f"{target} not under {paths}"
    home = environment(services()["grafana"]).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home in {None, str(target)}


def test_grafana_has_the_stacks_prometheus_as_default_datasource() -> None:
    sources = [s for doc in provisioning("datasources") for s in doc["datasources"]]
    (default,) = [s for s in sources if s.get("isDefault")]
    assert default["type"] == "prometheus"
    url = urlsplit(default["url"])
    assert url.hostname in services()
    assert split_image(services()[url.hostname]["image"])[0] == "prom/prometheus"
    assert url.port in listening_ports(url.hostname)


# -- the GPU ------------------------------------------------------------------------------


def wants_gpu(service: Mapping[str, Any]) -> bool:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return bool(devices.get("devices")) or "gpus" in service or service.get("runtime") == "nvidia"


def test_the_gpu_profile_holds_vllm_and_nothing_else_needs_a_gpu() -> None:
    assert "gpu" in services()["vllm"].get("profiles", [])
    for name, service in services().items():
        if wants_gpu(service):
            assert "gpu" in service.get("profiles", []), f"{name} needs a GPU outside `gpu`"
    assert not any(wants_gpu(service) for service in default_services().values())


def test_vllm_serves_a_reasoning_model_as_the_gateway_expects() -> None:
    vllm = services()["vllm"]
    assert split_image(vllm["image"])[0] == "vllm/vllm-openai"
    args = command_line(vllm)
    assert option(args, "--reasoning-parser") == "deepseek_r1"
    assert "--enable-prefix-caching" in args
    assert option(args, "--host") == "0.0.0.0"
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert "gpu" in device["capabilities"]
    assert vllm.get("shm_size") or vllm.get("ipc") == "host", "NCCL needs shared memory"


def test_vllms_model_and_attention_backend_come_from_the_environment() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())["services"]["vllm"]
    text = " ".join(words(raw.get("command"))) + " " + str(raw.get("environment"))
    assert "${VLLM_MODEL:-" in text
    assert "${VLLM_ATTENTION_BACKEND:-" in text
    assert option(command_line(services()["vllm"]), "--attention-backend") in {
        "FLASH_ATTN",
        "FLASHMLA",
        "FLASHINFER",
        "TRITON_ATTN",
    }


# -- the env example ----------------------------------------------------------------------


@cache
def env_example() -> dict[str, str]:
    pairs = [
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    return {key.strip(): value.strip() for key, value in pairs}


def test_the_env_example_sets_only_what_the_compose_file_reads() -> None:
    read = {m["name"] for m in _VARIABLE.finditer(COMPOSE.read_text())}
    assert set(env_example()) <= read, sorted(set(env_example()) - read)
    without_default = {m["name"] for m in _VARIABLE.finditer(COMPOSE.read_text()) if not m["op"]}
    assert without_default <= set(env_example())
